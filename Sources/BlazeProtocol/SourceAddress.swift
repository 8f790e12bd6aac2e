#if canImport(Glibc)
import Glibc
#endif

/// Source addresses as listener limits count them (SYNC.md §8, "Listener limits"; Protocol/RELAY.md, "Limits").
public enum SourceAddress {
    /// The 4 bytes of an IPv4 or 16 of an IPv6 address in text; nil for anything else.
    public static func bytes(_ text: String) -> [UInt8]? {
        var v4 = in_addr()
        if inet_pton(AF_INET, text, &v4) == 1 { return withUnsafeBytes(of: &v4) { Array($0) } }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, text, &v6) == 1 { return withUnsafeBytes(of: &v6) { Array($0) } }
        return nil
    }

    /// The key limits count `text` under: an IPv4 address as it is; an IPv6 address by its /64, the block one
    /// subscriber is given (counting per /128 would give every host 2^64 addresses); an IPv4-mapped IPv6 address as
    /// the IPv4 one. Anything that is not an address is its own key.
    public static func bucket(_ text: String) -> String {
        guard let b = bytes(text) else { return text }
        if b.count == 4 { return b.map(String.init).joined(separator: ".") }
        if b[0..<10].allSatisfy({ $0 == 0 }) && b[10] == 0xFF && b[11] == 0xFF {
            return b[12...].map(String.init).joined(separator: ".")
        }
        let groups = stride(from: 0, to: 8, by: 2).map { String(UInt16(b[$0]) << 8 | UInt16(b[$0 + 1]), radix: 16) }
        return groups.joined(separator: ":") + "::/64"
    }
}

/// An address block in CIDR notation (`10.0.0.0/8`, `fd00::/8`; a bare address is one host): the proxies a relay
/// trusts to say whom they forward.
public struct AddressRange: Sendable, Equatable, CustomStringConvertible {
    private let network: [UInt8]
    private let prefix: Int
    /// The block as given, normalized.
    public let description: String

    /// Parses `text`; nil when it is not an address with an optional prefix length that fits it.
    public init?(_ text: String) {
        let parts = text.split(separator: "/", omittingEmptySubsequences: false)
        guard (1...2).contains(parts.count), let bytes = SourceAddress.bytes(String(parts[0])) else { return nil }
        let bits = bytes.count * 8
        guard let prefix = parts.count == 2 ? Int(parts[1]) : bits, (0...bits).contains(prefix) else { return nil }
        self.network = Self.masked(bytes, prefix: prefix)
        self.prefix = prefix
        self.description = "\(parts[0])/\(prefix)"
    }

    /// Whether the address in `text` lies in the block (an IPv4-mapped IPv6 address counts as its IPv4 one).
    public func contains(_ text: String) -> Bool {
        guard var b = SourceAddress.bytes(text) else { return false }
        if b.count == 16, network.count == 4, b[0..<10].allSatisfy({ $0 == 0 }), b[10] == 0xFF, b[11] == 0xFF {
            b = Array(b[12...])
        }
        return b.count == network.count && Self.masked(b, prefix: prefix) == network
    }

    private static func masked(_ bytes: [UInt8], prefix: Int) -> [UInt8] {
        bytes.enumerated().map { i, byte in
            let keep = max(0, min(8, prefix - i * 8))
            return keep == 8 ? byte : byte & ~(0xFF >> keep)
        }
    }
}
