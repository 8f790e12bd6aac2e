/// A `host:port` peer address.
public struct PeerAddress: Sendable, Hashable, CustomStringConvertible {
    /// Host name or IP address (IPv6 without brackets).
    public let host: String
    /// TCP port.
    public let port: Int

    /// Parses `host:port` or `[v6]:port`; nil when malformed. Port 0 ("any free port") only for a listening address.
    public init?(_ text: String, listening: Bool = false) {
        guard let colon = text.lastIndex(of: ":"), let port = Int(text[text.index(after: colon)...]),
            ((listening ? 0 : 1)...65535).contains(port)
        else { return nil }
        var host = String(text[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        guard !host.isEmpty, !host.contains(where: { $0 == " " || $0 == "/" }) else { return nil }
        self.host = host
        self.port = port
    }

    /// `host:port` (`[host]:port` for IPv6).
    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}
