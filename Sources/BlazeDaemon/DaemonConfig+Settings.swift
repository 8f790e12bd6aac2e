import BlazeConfig
import BlazeProtocol
import BlazeSettings

/// Where one setting of `BlazedSettings` lands in a `DaemonConfig`: a key path of the setting's own type, or a
/// conversion for the few that are not stored as given.
struct Landing: Sendable {
    /// The setting.
    let key: ConfigKey
    /// Stores a resolved value.
    let apply: @Sendable (inout DaemonConfig, ConfigValue) -> Void

    /// `setting` lands at `path`.
    init<Value>(_ setting: Setting<Value>, _ path: any WritableKeyPath<DaemonConfig, Value> & Sendable) {
        key = setting.key
        apply = { config, value in config[keyPath: path] = setting.value(value) }
    }

    /// `setting` lands through `store`.
    init<Value>(_ setting: Setting<Value>, store: @escaping @Sendable (inout DaemonConfig, Value) -> Void) {
        key = setting.key
        apply = { config, value in store(&config, setting.value(value)) }
    }
}

extension DaemonConfig {
    /// Where each setting of `BlazedSettings` lands: the one mapping from settings to the configuration (a test checks
    /// that it covers every setting once, and that the built-in defaults give `DaemonConfig()`).
    static let landings: [Landing] = {
        typealias S = BlazedSettings
        return [
            Landing(S.socket, \.socketPath),
            Landing(S.dataDir, \.dataDirectory),
            Landing(S.defaultDatabase) { $0.defaultDatabase = $1 ? "default" : nil },
            // Read by blazed before the daemon exists (the logger), kept here for the daemon's own report.
            Landing(S.logLevel, \.logLevel),
            Landing(S.logFormat, \.logFormat),
            Landing(S.maxLineBytes, \.limits.maxLineBytes),
            Landing(S.maxDepth, \.storeLimits.maxDepth),
            Landing(S.maxBatch, \.limits.maxBatch),
            Landing(S.maxConnections, \.limits.maxConnections),
            Landing(S.idleTimeout, \.limits.idleTimeoutSeconds),
            Landing(S.maxDocumentBytes, \.storeLimits.maxDocumentBytes),
            Landing(S.maxBlobBytes, \.maxBlobBytes),
            Landing(S.maxSubscriptions, \.limits.maxSubscriptionsPerConnection),
            Landing(S.maxSubscriberBacklogBytes, \.limits.maxSubscriberBacklogBytes),
            Landing(S.maxVectorMemory, \.storeLimits.maxVectorMemoryBytes),
            Landing(S.feedRetention, \.storeLimits.feedRetention),
            Landing(S.metricsListen, \.metricsListen),
            Landing(S.syncListen, \.syncListen),
            Landing(S.syncTimeout, \.syncTimeoutMs),
            Landing(S.syncHandshakeTimeout, \.syncListenerLimits.handshakeTimeoutMs),
            Landing(S.syncRetryMax, \.syncRetryMaxMs),
            Landing(S.syncMaxPeers, \.syncListenerLimits.maxConnections),
            Landing(S.syncMaxPeersPerAddress, \.syncListenerLimits.maxConnectionsPerAddress),
            Landing(S.syncMaxHandshakes, \.syncListenerLimits.maxHandshakes),
            Landing(S.syncTLSCAFile, \.syncTLSTrustRoots),
            Landing(S.folderPollInterval, \.folderOptions.pollIntervalMs),
            Landing(S.folderInotify, \.folderOptions.inotify),
            Landing(S.folderSegmentBytes, \.folderOptions.segmentBytes),
            Landing(S.compactionInterval, \.compactionIntervalMs),
            Landing(S.compactionHorizon, \.compactionHorizonMs),
        ]
    }()

    /// The configuration resolved settings describe, reporting them in `daemon.config`.
    public init(settings: ResolvedConfig, environment: [String: String]) {
        self.init(environment: environment)
        let landings = Dictionary(uniqueKeysWithValues: Self.landings.map { ($0.key.name, $0) })
        for entry in settings.entries {
            guard let landing = landings[entry.key.name] else { preconditionFailure("setting \(entry.key.name) lands nowhere") }
            landing.apply(&self, entry.value)
        }
        self.settings = settings.report
        self.notifySocket = environment["NOTIFY_SOCKET"]
    }
}
