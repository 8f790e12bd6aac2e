import BlazeProtocol

/// Every setting of `blaze-relay`, as `BlazedSettings` are `blazed`'s: a flag (`--NAME`), an environment variable
/// (`BLAZE_RELAY_<NAME>`) and a key of the configuration file (`$XDG_CONFIG_HOME/blazedb/relay.yaml`, or
/// `--config`/`BLAZE_RELAY_CONFIG`), in that order of precedence over the built-in default. The relay's library
/// defaults (`RelayServer.defaultLimits`, `RelayServer.defaultHandshakeRate`) come from here.
public enum RelaySettings {
    /// The environment variables' prefix.
    public static let prefix = "BLAZE_RELAY_"

    /// `data-dir`: the relay's identity, and its database unless `postgres`.
    public static let dataDir = Setting.text(
        "data-dir", check: BlazedSettings.checkPath,
        "Directory of the relay's identity, and of its database unless postgres is set (default $XDG_DATA_HOME/blazedb-relay)",
        prefix: prefix
    ) { DefaultPaths.dataDirectory(environment: $0) + "-relay" }
    /// `postgres`: keep the relay's data in PostgreSQL; reports mask the URL's password.
    public static let postgres = Setting<String?>(
        ConfigKey(
            "postgres", .text(check: checkPostgresURL), optional: true,
            "PostgreSQL URL (postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=require], or ?host=/socket/dir) to keep the relay's data in, shared by every relay given it; SQLite in data-dir when unset",
            prefix: prefix, shown: maskPassword
        ) { _ in .none }
    ) { $0.textValue }
    /// `listen`.
    public static let listen = Setting.text(
        "listen", check: BlazedSettings.checkListenAddress,
        "Address to accept devices on (host:port; port 0 picks one; the URL devices use is printed at start)", prefix: prefix
    ) { _ in "127.0.0.1:7400" }
    /// `tls-cert`.
    public static let tlsCert = Setting.optionalText(
        "tls-cert", check: { _ in nil }, "PEM certificate chain: serve TLS (wss://) with it; needs tls-key", prefix: prefix)
    /// `tls-key`.
    public static let tlsKey = Setting.optionalText("tls-key", check: { _ in nil }, "PEM private key of tls-cert", prefix: prefix)
    /// `log-level`.
    public static let logLevel = Setting.choice(
        "log-level", BlazedSettings.logLevels, "Least severe log level written to stderr", default: "info", prefix: prefix)
    /// `log-format`.
    public static let logFormat = Setting.choice(
        "log-format", ["text", "json"], "Log lines on stderr: text (key=value) or json, as blazed writes them", default: "text",
        prefix: prefix)
    /// `max-connections`.
    public static let maxConnections = Setting.int(
        "max-connections", min: 1, max: 1_000_000,
        "Most device connections at once (further ones are closed before a byte is read)", default: 10_000, prefix: prefix)
    /// `max-handshakes`.
    public static let maxHandshakes = Setting.int(
        "max-handshakes", min: 1, max: 1_000_000, "Most connections still in their handshake at once", default: 512,
        prefix: prefix)
    /// `max-connections-per-address`.
    public static let maxConnectionsPerAddress = Setting.int(
        "max-connections-per-address", min: 1, max: 1_000_000,
        "Most connections from one source address (an IPv6 /64 counts as one)", default: 64, prefix: prefix)
    /// `reserved-handshakes`: nil keeps a quarter of `max-handshakes`.
    public static let reservedHandshakes = Setting.optionalInt(
        "reserved-handshakes", min: 0,
        "Of max-handshakes, places kept for addresses a listed device proved its key from in the last 7 days (unset: a quarter)",
        prefix: prefix)
    /// `reserved-connections`: nil keeps a fifth of `max-connections`.
    public static let reservedConnections = Setting.optionalInt(
        "reserved-connections", min: 0, "Of max-connections, places kept for devices a space's log lists (unset: a fifth)",
        prefix: prefix)
    /// `handshake-timeout`.
    public static let handshakeTimeout = Setting.milliseconds(
        "handshake-timeout", seconds: 0.1...3600,
        "Seconds a device may take from connecting to finishing its handshake (WebSocket upgrade included)", default: 5_000,
        prefix: prefix)
    /// `handshake-rate`.
    public static let handshakeRate = Setting.int(
        "handshake-rate", min: 0, max: 1_000_000,
        "New connections per second from one source address, bursts of twice that (0: no limit); more are closed at once",
        default: 50, prefix: prefix)
    /// `retention-days`.
    public static let retentionDays = Setting.int(
        "retention-days", min: 0, max: 36_500,
        "Days a space's data is kept after its last write (0: for good); devices hand it back when they reconnect", default: 0,
        prefix: prefix)
    /// `chunk-lease-days`.
    public static let chunkLeaseDays = Setting.int(
        "chunk-lease-days", min: 0, max: 36_500,
        "Days a blob chunk is kept after a member last said it needs it (0: for good); devices say so for every chunk they hold at each connection and every 12 hours",
        default: 90, prefix: prefix)
    /// `space-quota-mib`.
    public static let spaceQuotaMiB = Setting.int(
        "space-quota-mib", min: 1, max: 1 << 30,
        "MiB of entries (membership operations included) the relay stores per space; a batch beyond it is refused (over_quota)",
        default: 10_240, prefix: prefix)
    /// `space-chunk-quota-mib`.
    public static let spaceChunkQuotaMiB = Setting.int(
        "space-chunk-quota-mib", min: 0, max: 1 << 30,
        "MiB of blob chunks the relay stores per space, apart from the entries' (0: none); chunks beyond it are not taken",
        default: 10_240, prefix: prefix)
    /// `trusted-proxy`.
    public static let trustedProxy = Setting.list(
        "trusted-proxy", check: checkProxy,
        "A reverse proxy or load balancer (an address or CIDR block; repeatable) whose connections count for the client its X-Forwarded-For header names",
        prefix: prefix)

    /// The settings, in the order `blaze-relay config` lists them.
    public static let keys: [ConfigKey] = [
        dataDir.key, postgres.key, listen.key, tlsCert.key, tlsKey.key, logLevel.key, logFormat.key, maxConnections.key,
        maxHandshakes.key, maxConnectionsPerAddress.key, reservedHandshakes.key, reservedConnections.key,
        handshakeTimeout.key, handshakeRate.key, retentionDays.key, chunkLeaseDays.key, spaceQuotaMiB.key, spaceChunkQuotaMiB.key,
        trustedProxy.key,
    ]

    /// Nil for an address or CIDR block that names proxies only (not a `/0` that would trust everyone).
    static func checkProxy(_ text: String) -> String? {
        AddressRange(text) != nil && !text.hasSuffix("/0")
            ? nil : "must be an IP address or CIDR block naming proxies only (10.0.0.0/8, fd00::/8; not /0), got \"\(text)\""
    }

    /// Nil for a `postgres://` or `postgresql://` URL (the text is not repeated: it may hold a password).
    static func checkPostgresURL(_ text: String) -> String? {
        text.hasPrefix("postgres://") || text.hasPrefix("postgresql://") ? nil : "must be a postgres:// URL"
    }

    /// A URL with its password replaced by `***`.
    static func maskPassword(_ value: ConfigValue) -> ConfigValue {
        guard case .string(let url) = value, let scheme = url.range(of: "://"),
            let at = url[scheme.upperBound...].firstIndex(of: "@"),
            let colon = url[scheme.upperBound..<at].firstIndex(of: ":")
        else { return value }
        return .string(String(url[..<url.index(after: colon)]) + "***" + String(url[at...]))
    }
}
