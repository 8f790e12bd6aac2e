import BlazeProtocol
import Testing

/// How listener limits count source addresses, and the address blocks a relay trusts.
@Suite struct SourceAddressTests {
    @Test func addressesAreCountedPerIPv4AddressAndPerIPv6Slash64() {
        #expect(SourceAddress.bucket("203.0.113.5") == "203.0.113.5")
        #expect(SourceAddress.bucket("2001:db8:1:2::1") == "2001:db8:1:2::/64")
        #expect(SourceAddress.bucket("2001:0db8:0001:0002:ffff:ffff:ffff:ffff") == "2001:db8:1:2::/64")
        #expect(SourceAddress.bucket("::ffff:192.0.2.7") == "192.0.2.7")
        #expect(SourceAddress.bucket("::1") == "0:0:0:0::/64")
        #expect(SourceAddress.bucket("not an address") == "not an address")
        #expect(SourceAddress.bytes("203.0.113.5") == [203, 0, 113, 5])
        #expect(SourceAddress.bytes("203.0.113.256") == nil && SourceAddress.bytes("") == nil)
    }

    @Test func rangesHoldTheirAddressesOnly() throws {
        let v4 = try #require(AddressRange("10.1.0.0/16"))
        #expect(v4.contains("10.1.255.3") && !v4.contains("10.2.0.1") && v4.contains("::ffff:10.1.0.9"))
        #expect(!v4.contains("2001:db8::1") && !v4.contains("garbage"))
        let host = try #require(AddressRange("127.0.0.1"))
        #expect(host.contains("127.0.0.1") && !host.contains("127.0.0.2") && host.description == "127.0.0.1/32")
        let odd = try #require(AddressRange("192.168.0.0/23"))
        #expect(odd.contains("192.168.1.200") && !odd.contains("192.168.2.1"))
        let v6 = try #require(AddressRange("fd00::/8"))
        #expect(v6.contains("fd12:3456::1") && !v6.contains("fe80::1") && !v6.contains("10.0.0.1"))
        #expect(AddressRange("0.0.0.0/0")?.contains("8.8.8.8") == true)
        for bad in ["10.0.0.0/33", "fd00::/129", "10.0.0.0/-1", "10.0.0.0/", "/8", "example.org", "10.0.0.0/8/8"] {
            #expect(AddressRange(bad) == nil, "\(bad)")
        }
    }
}
