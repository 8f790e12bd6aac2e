import BlazeProtocol

/// Every setting of `blazed`: one name for the file key and the flag, one environment variable each.
///
/// Precedence, highest first: command-line flag, environment variable (`BLAZEDB_<NAME>`), configuration file
/// (`$XDG_CONFIG_HOME/blazedb/blazed.yaml`), built-in default. A setting is defined here once: its flag, help line,
/// environment variable and default come from it, the library types (`StoreLimits`, `ServerLimits`,
/// `SyncListenerLimits`, `FolderOptions`, `DaemonConfig`) take their defaults from it, and `DaemonConfig.landings` names
/// the one place it lands with a key path (a test checks that every setting lands exactly once).
public enum BlazedSettings {
    /// `socket`.
    public static let socket = Setting.text(
        "socket", check: checkPath, "Unix socket to serve on (default $XDG_RUNTIME_DIR/blazedb/blazed.sock)"
    ) { env in
        var env = env
        env[DefaultPaths.socketEnvironmentVariable] = nil
        return DefaultPaths.socketPath(environment: env)
    }
    /// `data-dir`.
    public static let dataDir = Setting.text("data-dir", check: checkPath, "Data directory (default $XDG_DATA_HOME/blazedb)") {
        DefaultPaths.dataDirectory(environment: $0)
    }
    /// `default-database`.
    public static let defaultDatabase = Setting.flag("default-database", "Create the database 'default' on first start", default: true)
    /// `log-level`.
    public static let logLevel = Setting.choice("log-level", logLevels, "Least severe log level written to stderr", default: "info")
    /// `log-format`.
    public static let logFormat = Setting.choice(
        "log-format", ["text", "json"], "Log line format: text (key=value) or json", default: "text")
    /// `max-line-bytes`.
    public static let maxLineBytes = Setting.int("max-line-bytes", min: 1, "Maximum bytes in one request line", default: 8 << 20)
    /// `max-depth`: every JSON the daemon parses from outside (requests, peers' changes, snapshots, restored backups).
    public static let maxDepth = Setting.int(
        "max-depth", min: 1, "Maximum JSON nesting depth of a request, a synced change or a restored document", default: 64)
    /// `max-batch`.
    public static let maxBatch = Setting.int("max-batch", min: 1, "Maximum requests in one batch", default: 256)
    /// `max-connections`.
    public static let maxConnections = Setting.int("max-connections", min: 1, "Maximum simultaneous connections", default: 256)
    /// `idle-timeout`.
    public static let idleTimeout = Setting.int(
        "idle-timeout", min: 0, "Seconds before a silent connection is closed (0: never)", default: 600)
    /// `max-document-bytes`.
    public static let maxDocumentBytes = Setting.int(
        "max-document-bytes", min: 1, "Maximum size of one document in bytes", default: 1 << 20)
    /// `max-blob-bytes`.
    public static let maxBlobBytes = Setting.int(
        "max-blob-bytes", min: 1, "Maximum size of one blob in bytes (blob.put, blob.upload)", default: 64 << 30)
    /// `max-subscriptions`.
    public static let maxSubscriptions = Setting.int(
        "max-subscriptions", min: 1, "Maximum subscriptions per connection", default: 1000)
    /// `max-subscriber-backlog-bytes`.
    public static let maxSubscriberBacklogBytes = Setting.int(
        "max-subscriber-backlog-bytes", min: 1,
        "Unsent bytes a connection may accumulate before a live subscription on it is dropped", default: 8 << 20)
    /// `max-vector-memory`.
    public static let maxVectorMemory = Setting.int(
        "max-vector-memory", min: 0,
        "Bytes of vectors and graph links each database holds in memory for query.nearest; an index that would take more is searched exactly from disk",
        default: 1 << 30)
    /// `feed-retention`.
    public static let feedRetention = Setting.int(
        "feed-retention", min: 1,
        "Document events (inserts, updates, deletes) each database keeps in its change feed for resuming subscriptions",
        default: 10_000)
    /// `sync-listen`.
    public static let syncListen = Setting.optionalText(
        "sync-listen", check: checkListenAddress, "Accept sync peers on host:port (port 0 picks a free port); off when unset")
    /// `metrics-listen`.
    public static let metricsListen = Setting.optionalText(
        "metrics-listen", check: checkLoopbackListenAddress,
        "Serve Prometheus metrics at http://host:port/metrics on a loopback address (port 0 picks a free port); off when unset")
    /// `sync-timeout`.
    public static let syncTimeout = Setting.milliseconds(
        "sync-timeout", seconds: 0.1...3600, "Seconds a sync peer may stay silent (quiet peers ping at a third of it)",
        default: 30_000)
    /// `sync-handshake-timeout`.
    public static let syncHandshakeTimeout = Setting.milliseconds(
        "sync-handshake-timeout", seconds: 0.1...3600, "Seconds a sync handshake may take", default: 5_000)
    /// `sync-retry-max`.
    public static let syncRetryMax = Setting.milliseconds(
        "sync-retry-max", seconds: 0.1...3600,
        "Most seconds between attempts to reach a sync peer (the delay doubles from 0.1 s; 1 s at most while the peer refuses)",
        default: 5_000)
    /// `sync-max-peers`.
    public static let syncMaxPeers = Setting.int("sync-max-peers", min: 1, "Maximum inbound sync connections", default: 256)
    /// `sync-max-peers-per-address`.
    public static let syncMaxPeersPerAddress = Setting.int(
        "sync-max-peers-per-address", min: 1, "Maximum inbound sync connections from one address", default: 16)
    /// `sync-max-handshakes`.
    public static let syncMaxHandshakes = Setting.int(
        "sync-max-handshakes", min: 1, "Maximum inbound sync connections still in their handshake", default: 64)
    /// `sync-tls-ca-file`.
    public static let syncTLSCAFile = Setting.optionalText(
        "sync-tls-ca-file", check: checkPath, "PEM file of certificates to trust for wss:// relays, besides the system's")
    /// `folder-poll-interval`.
    public static let folderPollInterval = Setting.milliseconds(
        "folder-poll-interval", seconds: 0.01...3600,
        "Seconds between scans of a sync folder when nothing announced a change (inotify still wakes at once)",
        default: 2_000)
    /// `folder-inotify`.
    public static let folderInotify = Setting.flag(
        "folder-inotify", "Watch sync folders with inotify (off: poll only)", default: true)
    /// `folder-segment-bytes`.
    public static let folderSegmentBytes = Setting.int(
        "folder-segment-bytes", min: 4096, "Bytes after which a sync folder's segment file is finished", default: 4 << 20)
    /// `compaction-interval`.
    public static let compactionInterval = Setting.milliseconds(
        "compaction-interval", seconds: 0...86_400,
        "Seconds between background compactions of each database (0: only when db.compact asks)", default: 600_000)
    /// `compaction-horizon`.
    public static let compactionHorizon = Setting.milliseconds(
        "compaction-horizon", seconds: 1...315_360_000,
        "Seconds a member may stay silent before compaction stops waiting for it (it then re-joins from a snapshot)",
        default: 30 * 24 * 3_600_000)

    /// The settings, in the order `config show` lists them.
    public static let keys: [ConfigKey] = [
        socket.key, dataDir.key, defaultDatabase.key, logLevel.key, logFormat.key, maxLineBytes.key, maxDepth.key,
        maxBatch.key, maxConnections.key, idleTimeout.key, maxDocumentBytes.key, maxBlobBytes.key, maxSubscriptions.key,
        maxSubscriberBacklogBytes.key, maxVectorMemory.key, feedRetention.key, metricsListen.key, syncListen.key, syncTimeout.key, syncHandshakeTimeout.key,
        syncRetryMax.key, syncMaxPeers.key, syncMaxPeersPerAddress.key, syncMaxHandshakes.key, syncTLSCAFile.key,
        folderPollInterval.key, folderInotify.key, folderSegmentBytes.key, compactionInterval.key, compactionHorizon.key,
    ]

    /// The log levels of swift-log, least severe first.
    public static let logLevels = ["trace", "debug", "info", "notice", "warning", "error", "critical"]

    /// Nil for an absolute path, else what is wrong.
    public static func checkPath(_ text: String) -> String? {
        text.hasPrefix("/") ? nil : "must be an absolute path, got \"\(text)\""
    }

    /// Nil for a loopback `host:port` to listen on (`127.x.x.x`, `::1` or `localhost`), else what is wrong.
    public static func checkLoopbackListenAddress(_ text: String) -> String? {
        guard let address = PeerAddress(text, listening: true) else {
            return "must be host:port with a port from 0 to 65535, got \"\(text)\""
        }
        return PeerAddress.isLoopback(host: address.host)
            ? nil : "must be a loopback address (127.0.0.1, ::1 or localhost), got \"\(address.host)\""
    }

    /// Nil for a `host:port` to listen on, else what is wrong.
    public static func checkListenAddress(_ text: String) -> String? {
        PeerAddress(text, listening: true) == nil ? "must be host:port with a port from 0 to 65535, got \"\(text)\"" : nil
    }
}
