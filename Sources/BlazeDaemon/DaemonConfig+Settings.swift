import BlazeConfig
import BlazeProtocol

extension DaemonConfig {
    /// Where each setting of `BlazedSettings.keys` lands: the one mapping from setting names to the configuration
    /// (a test checks it covers every key, and that the built-in defaults give `DaemonConfig()`).
    static let landings: [String: @Sendable (inout DaemonConfig, ConfigValue) -> Void] = [
        "socket": { $0.socketPath = $1.text ?? $0.socketPath },
        "data-dir": { $0.dataDirectory = $1.text ?? $0.dataDirectory },
        "default-database": { $0.defaultDatabase = $1.flag == true ? "default" : nil },
        "log-level": { _, _ in },  // read by blazed before the daemon exists (the logger)
        "log-format": { _, _ in },
        "max-line-bytes": { $0.limits.maxLineBytes = $1.number },
        "max-depth": { $0.limits.maxDepth = $1.number },
        "max-batch": { $0.limits.maxBatch = $1.number },
        "max-connections": { $0.limits.maxConnections = $1.number },
        "idle-timeout": { $0.limits.idleTimeoutSeconds = $1.number },
        "max-document-bytes": { $0.storeLimits.maxDocumentBytes = $1.number },
        "max-subscriptions": { $0.limits.maxSubscriptionsPerConnection = $1.number },
        "max-subscriber-backlog-bytes": { $0.limits.maxSubscriberBacklogBytes = $1.number },
        "feed-retention": { $0.storeLimits.feedRetention = $1.number },
        "sync-listen": { $0.syncListen = $1.text },
        "sync-timeout": { $0.syncTimeoutMs = $1.milliseconds },
        "sync-handshake-timeout": { $0.syncListenerLimits.handshakeTimeoutMs = $1.milliseconds },
        "sync-retry-max": { $0.syncRetryMaxMs = $1.milliseconds },
        "sync-max-peers": { $0.syncListenerLimits.maxConnections = $1.number },
        "sync-max-peers-per-address": { $0.syncListenerLimits.maxConnectionsPerAddress = $1.number },
        "sync-max-handshakes": { $0.syncListenerLimits.maxHandshakes = $1.number },
        "sync-tls-ca-file": { $0.syncTLSTrustRoots = $1.text },
        "folder-poll-interval": { $0.folderOptions.pollIntervalMs = $1.milliseconds },
        "folder-inotify": { $0.folderOptions.inotify = $1.flag ?? true },
        "folder-segment-bytes": { $0.folderOptions.segmentBytes = $1.number },
        "compaction-interval": { $0.compactionIntervalMs = $1.milliseconds },
        "compaction-horizon": { $0.compactionHorizonMs = $1.milliseconds },
    ]

    /// The configuration resolved settings describe, reporting them in `daemon.config`.
    public init(settings: ResolvedConfig, environment: [String: String]) {
        self.init(environment: environment)
        for entry in settings.entries {
            guard let land = Self.landings[entry.key.name] else { preconditionFailure("setting \(entry.key.name) lands nowhere") }
            land(&self, entry.value)
        }
        self.settings = settings.report
        self.notifySocket = environment["NOTIFY_SOCKET"]
    }
}

extension ConfigValue {
    /// The text of a text or choice setting, nil when unset.
    var text: String? {
        if case .string(let s) = self { return s }
        return nil
    }

    /// The value of a switch.
    var flag: Bool? {
        if case .bool(let b) = self { return b }
        return nil
    }

    /// The value of an integer setting (the resolver has checked the type).
    var number: Int {
        if case .int(let v) = self { return v }
        preconditionFailure("\(self) is not an integer setting")
    }

    /// A number-of-seconds setting in milliseconds.
    var milliseconds: Int {
        if case .double(let v) = self { return Int(v * 1000) }
        preconditionFailure("\(self) is not a number setting")
    }
}
