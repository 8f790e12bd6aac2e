import BlazeProtocol
import BlazeSettings
import BlazeStore
import BlazeSync
import BlazeWire
import NIOCore

/// Limits of the RPC server; all configurable (defaults from `BlazedSettings`), all enforced. The JSON depth limit is
/// `StoreLimits.maxDepth`, shared with every other parser of outside JSON.
public struct ServerLimits: Sendable, Equatable {
    /// Maximum bytes in one request line; a longer line gets an error and the connection is closed.
    public var maxLineBytes = BlazedSettings.maxLineBytes.defaultValue
    /// Maximum number of requests in one batch.
    public var maxBatch = BlazedSettings.maxBatch.defaultValue
    /// Maximum simultaneous client connections; extra ones get an error and are closed.
    public var maxConnections = BlazedSettings.maxConnections.defaultValue
    /// Seconds a connection may stay silent before it is closed; 0 disables the timeout.
    public var idleTimeoutSeconds = BlazedSettings.idleTimeout.defaultValue
    /// Maximum subscriptions one connection may hold.
    public var maxSubscriptionsPerConnection = BlazedSettings.maxSubscriptions.defaultValue
    /// Bytes a connection may have waiting to be sent before a live subscription that adds more is dropped
    /// (with a final `subscriber_too_slow` error notification).
    public var maxSubscriberBacklogBytes = BlazedSettings.maxSubscriberBacklogBytes.defaultValue

    /// Default limits.
    public init() {}
}

/// Everything `blazed` needs to run.
public struct DaemonConfig: Sendable {
    /// Unix socket path to listen on.
    public var socketPath: String
    /// Data directory holding the databases.
    public var dataDirectory: String
    /// RPC server limits.
    public var limits: ServerLimits
    /// Store limits.
    public var storeLimits: StoreLimits
    /// Name of the database created on first start (nil: none).
    public var defaultDatabase: String?
    /// The least severe log level `blazed` writes (`log-level`; the logger is made before the daemon, from the same
    /// setting).
    public var logLevel = BlazedSettings.logLevel.defaultValue
    /// The log line format, `text` or `json` (`log-format`).
    public var logFormat = BlazedSettings.logFormat.defaultValue
    /// The largest blob `blob.put` and `blob.upload` accept, in bytes (`max-blob-bytes`).
    public var maxBlobBytes = BlazedSettings.maxBlobBytes.defaultValue
    /// Loopback `host:port` serving Prometheus metrics at `/metrics` (`metrics-listen`); nil (the default): none.
    public var metricsListen: String?
    /// `host:port` to accept sync peers on; nil (the default) accepts none (outbound peers still work).
    public var syncListen: String?
    /// Milliseconds a sync peer may stay silent before its connection is closed (handshakes: `syncListenerLimits`).
    public var syncTimeoutMs = BlazedSettings.syncTimeout.defaultValue
    /// Most milliseconds between attempts to reach a sync peer (`sync-retry-max`).
    public var syncRetryMaxMs = BlazedSettings.syncRetryMax.defaultValue
    /// Limits on inbound sync connections: handshakes, totals, per source address, handshake deadline.
    public var syncListenerLimits = SyncListenerLimits()
    /// A PEM file of certificates to trust for `wss://` relays besides the system's; nil trusts the system's only.
    public var syncTLSTrustRoots: String?
    /// How sync folders are watched and written (`folder-poll-interval`, `folder-inotify`).
    public var folderOptions = FolderOptions()
    /// Milliseconds between background compactions of every database (`compaction-interval`; 0: only `db.compact`).
    public var compactionIntervalMs = BlazedSettings.compactionInterval.defaultValue
    /// Milliseconds a member may stay silent before stability stops waiting for it (`compaction-horizon`).
    public var compactionHorizonMs = BlazedSettings.compactionHorizon.defaultValue
    /// A listening socket passed by systemd socket activation; when set, it is served instead of binding
    /// `socketPath` (which then names where it is bound), and it is left in place at shutdown.
    public var inheritedSocket: Systemd.InheritedSocket?
    /// The service manager's notification socket (`NOTIFY_SOCKET`): told `READY=1` once requests are served and
    /// `STOPPING=1` when shutdown begins.
    public var notifySocket: String?
    /// The effective settings and their sources as `daemon.config` reports them (`{file, settings}`); nil when the
    /// daemon was configured in code.
    public var settings: RPC.DaemonConfig.Result?
    /// Event loops serving client connections (`ClientLoops`): one per core.
    var clientLoopThreads = System.coreCount

    /// Creates a configuration; unspecified paths come from `DefaultPaths`.
    public init(
        socketPath: String? = nil, dataDirectory: String? = nil, limits: ServerLimits = ServerLimits(),
        storeLimits: StoreLimits = StoreLimits(), defaultDatabase: String? = "default",
        environment: [String: String] = [:]
    ) {
        self.socketPath = socketPath ?? DefaultPaths.socketPath(environment: environment)
        self.dataDirectory = dataDirectory ?? DefaultPaths.dataDirectory(environment: environment)
        self.limits = limits
        self.storeLimits = storeLimits
        self.defaultDatabase = defaultDatabase
    }
}

/// A configuration the daemon cannot start with.
public struct DaemonError: Error, Sendable, CustomStringConvertible {
    /// What is wrong, naming the setting.
    public var description: String

    /// `--sync-listen` is not `host:port`.
    static func invalidSyncAddress(_ text: String) -> DaemonError {
        DaemonError(description: "--sync-listen must be host:port with a port from 1 to 65535 (port 0 picks one), got \(text)")
    }

    /// `--metrics-listen` is not a loopback `host:port`.
    static func invalidMetricsAddress(_ text: String) -> DaemonError {
        DaemonError(description: "--metrics-listen " + (BlazedSettings.checkLoopbackListenAddress(text) ?? "is invalid"))
    }
}
