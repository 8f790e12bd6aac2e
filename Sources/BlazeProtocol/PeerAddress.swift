/// Where a peer or relay is reached: `host:port` (the peer protocol over TCP) or `ws://host[:port][/path]`,
/// `wss://…` (the same protocol over a WebSocket, through HTTP(S) proxies; Protocol/RELAY.md).
public struct PeerAddress: Sendable, Hashable, CustomStringConvertible {
    /// How the connection is carried.
    public enum Transport: Sendable, Hashable {
        /// The peer protocol straight over TCP.
        case tcp
        /// The peer protocol over a WebSocket opened on `path`, under TLS when `tls`.
        case webSocket(tls: Bool, path: String)
    }

    /// Host name or IP address (IPv6 without brackets).
    public let host: String
    /// TCP port.
    public let port: Int
    /// How the connection is carried.
    public let transport: Transport

    /// Parses `host:port`, `[v6]:port`, or a `ws://` / `wss://` URL (port 80 / 443 and path `/v1/sync` unless given);
    /// nil when malformed. Port 0 ("any free port") and URLs are refused for a listening address.
    public init?(_ text: String, listening: Bool = false) {
        var rest = Substring(text)
        var transport = Transport.tcp
        var defaultPort: Int?
        for (scheme, tls) in [("ws://", false), ("wss://", true)] where text.lowercased().hasPrefix(scheme) {
            guard !listening else { return nil }
            rest = rest.dropFirst(scheme.count)
            var path = "/v1/sync"
            if let slash = rest.firstIndex(of: "/") {
                path = String(rest[slash...])
                rest = rest[..<slash]
            }
            guard path.allSatisfy({ $0.isASCII && !$0.isWhitespace && $0 != "#" }) else { return nil }
            transport = .webSocket(tls: tls, path: path)
            defaultPort = tls ? 443 : 80
        }
        var hostPart = rest
        var port = defaultPort
        if let colon = rest.lastIndex(of: ":"), !(rest.hasPrefix("[") && rest.hasSuffix("]")) {
            guard let p = Int(rest[rest.index(after: colon)...]) else { return nil }
            port = p
            hostPart = rest[..<colon]
        }
        guard let port, ((listening ? 0 : 1)...65535).contains(port) else { return nil }
        var host = String(hostPart)
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty, !host.contains(where: { $0 == " " || $0 == "/" || $0 == "[" || $0 == "]" }) else { return nil }
        self.host = host
        self.port = port
        self.transport = transport
    }

    /// True for a host that names this machine only: `localhost`, `::1` or an IPv4 address in 127.0.0.0/8.
    public static func isLoopback(host: String) -> Bool {
        if host == "localhost" || host == "::1" { return true }
        let parts = host.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4 && parts[0] == "127"
            && parts.allSatisfy { p in (1...3).contains(p.count) && p.allSatisfy(\.isASCIIDigit) && UInt8(p) != nil }
    }

    /// True when an HTTP `Host` header names this machine only: a loopback host (`isLoopback`, any case), then
    /// nothing or `:` and a port of ASCII digits; IPv6 in brackets (`[::1]:8080`). False when absent.
    public static func isLoopbackHostHeader(_ header: String?) -> Bool {
        guard let header else { return false }
        var rest = Substring(header.lowercased())
        let host: Substring
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { return false }
            host = rest[rest.index(after: rest.startIndex)..<close]
            rest = rest[rest.index(after: close)...]
        } else if let colon = rest.firstIndex(of: ":") {
            host = rest[..<colon]
            rest = rest[colon...]
        } else {
            (host, rest) = (rest, "")
        }
        if !rest.isEmpty {
            let port = rest.dropFirst()
            guard rest.first == ":", (1...5).contains(port.count), port.allSatisfy(\.isASCIIDigit) else { return false }
        }
        return isLoopback(host: String(host))
    }

    /// `host:port` (`[host]:port` for IPv6), as a TCP address or inside its URL.
    public var hostPort: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }

    /// `host:port`, or the full URL of a WebSocket address (port and path always written).
    public var description: String {
        switch transport {
        case .tcp: hostPort
        case .webSocket(let tls, let path): "\(tls ? "wss" : "ws")://\(hostPort)\(path)"
        }
    }
}

extension Character {
    /// `0` to `9` only (not other scripts' digits, which `isNumber` admits).
    var isASCIIDigit: Bool { isASCII && isWholeNumber }
}
