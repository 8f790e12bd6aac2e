import BlazeProtocol

/// Every setting of `blazed` (DESIGN §9): one name for the file key and the flag, one environment variable each.
///
/// Precedence, highest first: command-line flag, environment variable (`BLAZEDB_<NAME>`), configuration file
/// (`$XDG_CONFIG_HOME/blazedb/blazed.yaml`), built-in default. A setting is defined here once: its flag
/// (`blazed --NAME`, parsed by `ConfigResolver.flags`), help line, environment variable and default all come from its
/// key. Where it lands in the daemon is one line of `DaemonConfig.landings`; a test checks that every key lands and
/// that the defaults here give `DaemonConfig()`'s (`ServerLimits()`, `StoreLimits()`, `SyncListenerLimits()`).
public enum BlazedSettings {
    /// The settings, in the order `config show` lists them.
    public static let keys: [ConfigKey] = [
        ConfigKey(
            "socket", .text(check: checkPath), "Unix socket to serve on (default $XDG_RUNTIME_DIR/blazedb/blazed.sock)"
        ) { env in
            var env = env
            env[DefaultPaths.socketEnvironmentVariable] = nil
            return .string(DefaultPaths.socketPath(environment: env))
        },
        ConfigKey("data-dir", .text(check: checkPath), "Data directory (default $XDG_DATA_HOME/blazedb)") {
            .string(DefaultPaths.dataDirectory(environment: $0))
        },
        ConfigKey("default-database", .bool, "Create the database 'default' on first start") { _ in .bool(true) },
        ConfigKey("log-level", .choice(logLevels), "Least severe log level written to stderr") { _ in .string("info") },
        ConfigKey("log-format", .choice(["text", "json"]), "Log line format: text (key=value) or json") { _ in
            .string("text")
        },
        ConfigKey("max-line-bytes", .int(min: 1), "Maximum bytes in one request line") { _ in .int(8 << 20) },
        ConfigKey("max-depth", .int(min: 1), "Maximum JSON nesting depth of a request") { _ in .int(64) },
        ConfigKey("max-batch", .int(min: 1), "Maximum requests in one batch") { _ in .int(256) },
        ConfigKey("max-connections", .int(min: 1), "Maximum simultaneous connections") { _ in .int(256) },
        ConfigKey("idle-timeout", .int(min: 0), "Seconds before a silent connection is closed (0: never)") { _ in
            .int(600)
        },
        ConfigKey("max-document-bytes", .int(min: 1), "Maximum size of one document in bytes") { _ in .int(1 << 20) },
        ConfigKey("max-subscriptions", .int(min: 1), "Maximum subscriptions per connection") { _ in .int(1000) },
        ConfigKey(
            "max-subscriber-backlog-bytes", .int(min: 1),
            "Unsent bytes a connection may accumulate before a live subscription on it is dropped"
        ) { _ in .int(8 << 20) },
        ConfigKey(
            "feed-retention", .int(min: 1), "Document events (inserts, updates, deletes) each database keeps in its change feed for resuming subscriptions"
        ) { _ in .int(10_000) },
        ConfigKey(
            "sync-listen", .text(check: checkListenAddress), optional: true,
            "Accept sync peers on host:port (port 0 picks a free port); off when unset"
        ) { _ in .none },
        ConfigKey(
            "sync-timeout", .double(0.1...3600),
            "Seconds a sync peer may stay silent (quiet peers ping at a third of it)"
        ) { _ in .double(30) },
        ConfigKey("sync-handshake-timeout", .double(0.1...3600), "Seconds a sync handshake may take") { _ in .double(5) },
        ConfigKey(
            "sync-retry-max", .double(0.1...3600),
            "Most seconds between attempts to reach a sync peer (the delay doubles from 0.1 s; 1 s at most while the peer refuses)"
        ) { _ in .double(5) },
        ConfigKey("sync-max-peers", .int(min: 1), "Maximum inbound sync connections") { _ in .int(256) },
        ConfigKey("sync-max-peers-per-address", .int(min: 1), "Maximum inbound sync connections from one address") { _ in
            .int(16)
        },
        ConfigKey("sync-max-handshakes", .int(min: 1), "Maximum inbound sync connections still in their handshake") {
            _ in .int(64)
        },
        ConfigKey(
            "sync-tls-ca-file", .text(check: checkPath), optional: true,
            "PEM file of certificates to trust for wss:// relays, besides the system's"
        ) { _ in .none },
        ConfigKey(
            "folder-poll-interval", .double(0.01...3600),
            "Seconds between scans of a sync folder when nothing announced a change (inotify still wakes at once)"
        ) { _ in .double(2) },
        ConfigKey("folder-inotify", .bool, "Watch sync folders with inotify (off: poll only)") { _ in .bool(true) },
        ConfigKey("folder-segment-bytes", .int(min: 4096), "Bytes after which a sync folder's segment file is finished") {
            _ in .int(4 << 20)
        },
        ConfigKey(
            "compaction-interval", .double(0...86_400),
            "Seconds between background compactions of each database (0: only when db.compact asks)"
        ) { _ in .double(600) },
        ConfigKey(
            "compaction-horizon", .double(1...315_360_000),
            "Seconds a member may stay silent before compaction stops waiting for it (it then re-joins from a snapshot)"
        ) { _ in .double(2_592_000) },
    ]

    /// The log levels of swift-log, least severe first.
    public static let logLevels = ["trace", "debug", "info", "notice", "warning", "error", "critical"]

    /// The resolver over `keys`.
    public static let resolver = ConfigResolver(keys: keys)

    static func checkPath(_ text: String) -> String? {
        text.hasPrefix("/") ? nil : "must be an absolute path, got \"\(text)\""
    }

    static func checkListenAddress(_ text: String) -> String? {
        PeerAddress(text, listening: true) == nil ? "must be host:port with a port from 0 to 65535, got \"\(text)\"" : nil
    }
}
