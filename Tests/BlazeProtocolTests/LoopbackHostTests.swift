import Testing

@testable import BlazeProtocol

/// Which names and `Host` headers count as this machine only (the metrics listener and Studio admit no other).
@Suite struct LoopbackHostTests {
    @Test func loopbackHostsAreTheLocalNamesAnd127Slash8Only() {
        for host in ["localhost", "::1", "127.0.0.1", "127.255.0.9"] { #expect(PeerAddress.isLoopback(host: host), "\(host)") }
        for host in ["127.1", "127.+0.0.1", "127.0.0.1.evil.example", "128.0.0.1", "0.0.0.0", "::", "127.0.0.256", "127.0.0.", "١٢٧.0.0.1"] {
            #expect(!PeerAddress.isLoopback(host: host), "\(host)")
        }
    }

    @Test func hostHeadersNameALoopbackHostWithAnOptionalPortOfDigits() {
        for header in ["localhost", "LOCALHOST:80", "127.0.0.1:9464", "[::1]", "[::1]:8080"] {
            #expect(PeerAddress.isLoopbackHostHeader(header), "\(header)")
        }
        for header in [nil, "", "localhost:", "localhost:abc", "localhost:123456", "[::1]junk", "[::1", "::1", "evil.example:80", "127.0.0.1 :80"] {
            #expect(!PeerAddress.isLoopbackHostHeader(header), "\(header ?? "nil")")
        }
    }
}
