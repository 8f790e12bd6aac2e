import ArgumentParser
import BlazeConfig
import BlazeDaemon
import BlazeProtocol
import BlazeStore
import Foundation
import Logging
import ServiceLifecycle

#if canImport(Glibc)
import Glibc
#endif

@main
struct Blazed: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "blazed", abstract: "The BlazeDB daemon: serves local document databases over a Unix socket.",
        discussion: """
            Every setting can come from a flag, an environment variable (BLAZEDB_ and the setting's name in capitals, \
            '_' for '-': BLAZEDB_LOG_LEVEL) or the configuration file ($XDG_CONFIG_HOME/blazedb/blazed.yaml, a YAML \
            mapping of setting names to values), in that order of precedence, over the built-in defaults. \
            --print-config shows the effective value of each setting and where it came from.

            Under systemd, blazed serves the socket passed by socket activation (LISTEN_FDS) and reports readiness \
            and shutdown to $NOTIFY_SOCKET.
            """)

    @Option(help: "Configuration file (default: $BLAZEDB_CONFIG, else $XDG_CONFIG_HOME/blazedb/blazed.yaml).")
    var config: String?

    @Flag(help: "Print the effective configuration and where each value came from, then exit.")
    var printConfig = false

    @Flag(help: "Print the configuration as JSON (with --print-config).") var json = false

    @Option(help: "Unix socket path (default: $XDG_RUNTIME_DIR/blazedb/blazed.sock; env BLAZEDB_SOCKET).")
    var socket: String?
    @Option(name: .customLong("data-dir"), help: "Data directory (default: $XDG_DATA_HOME/blazedb).")
    var dataDir: String?
    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical (default: info).")
    var logLevel: String?
    @Option(help: "Log line format: text or json (default: text).") var logFormat: String?
    @Option(help: "Maximum bytes in one request line (default: 8388608).") var maxLineBytes: String?
    @Option(help: "Maximum JSON nesting depth of a request (default: 64).") var maxDepth: String?
    @Option(help: "Maximum requests in one batch (default: 256).") var maxBatch: String?
    @Option(help: "Maximum simultaneous connections (default: 256).") var maxConnections: String?
    @Option(help: "Seconds before a silent connection is closed, 0: never (default: 600).") var idleTimeout: String?
    @Option(help: "Maximum size of one document in bytes (default: 1048576).") var maxDocumentBytes: String?
    @Option(help: "Maximum subscriptions per connection (default: 1000).") var maxSubscriptions: String?
    @Option(help: "Unsent bytes a connection may accumulate before a live subscription on it is dropped (default: 8388608).")
    var maxSubscriberBacklogBytes: String?
    @Option(help: "Changes each database keeps in its change feed for resuming subscriptions (default: 10000).")
    var feedRetention: String?
    @Flag(help: "Do not create the 'default' database on first start (setting default-database: false).")
    var noDefaultDatabase = false
    @Option(help: "Accept sync peers on host:port (port 0 picks a free port; see daemon.info / sync.status). Off by default.")
    var syncListen: String?
    @Option(help: "Seconds a sync peer may stay silent (default: 30).")
    var syncTimeout: String?
    @Option(help: "Seconds a sync handshake may take (default: 5).") var syncHandshakeTimeout: String?
    @Option(help: "Maximum inbound sync connections (default: 256).") var syncMaxPeers: String?
    @Option(help: "Maximum inbound sync connections from one address (default: 16).") var syncMaxPeersPerAddress: String?
    @Option(help: "Maximum inbound sync connections still in their handshake (default: 64).") var syncMaxHandshakes: String?

    /// The settings given as flags, by setting name.
    var flags: [String: String] {
        var out: [String: String] = [:]
        let given: [(String, String?)] = [
            ("socket", socket), ("data-dir", dataDir), ("log-level", logLevel), ("log-format", logFormat),
            ("max-line-bytes", maxLineBytes), ("max-depth", maxDepth), ("max-batch", maxBatch),
            ("max-connections", maxConnections), ("idle-timeout", idleTimeout), ("max-document-bytes", maxDocumentBytes),
            ("max-subscriptions", maxSubscriptions), ("max-subscriber-backlog-bytes", maxSubscriberBacklogBytes),
            ("feed-retention", feedRetention), ("sync-listen", syncListen), ("sync-timeout", syncTimeout),
            ("sync-handshake-timeout", syncHandshakeTimeout), ("sync-max-peers", syncMaxPeers),
            ("sync-max-peers-per-address", syncMaxPeersPerAddress), ("sync-max-handshakes", syncMaxHandshakes),
            ("default-database", noDefaultDatabase ? "false" : nil),
        ]
        for case (let name, let value?) in given { out[name] = value }
        return out
    }

    func run() async throws {
        let environment = ProcessInfo.processInfo.environment
        let settings: ResolvedConfig
        do {
            settings = try BlazedSettings.resolver.resolve(flags: flags, environment: environment, configFile: config)
        } catch {
            Self.fail("blazed: \(error)")
        }
        if printConfig {
            print(json ? settings.json.jsonText : ConfigTable.render(settings))
            return
        }
        let level = Logger.Level(rawValue: settings.string("log-level")!)!
        let format = LineLogHandler.Format(rawValue: settings.string("log-format")!)!
        LoggingSystem.bootstrap { label in LineLogHandler(label: label, level: level, format: format) }
        let logger = Logger(label: "blazed")
        // Everything blazed creates (databases and their WAL, backups, keys, directories) is for this user alone,
        // whatever umask it was started with.
        umask(0o077)
        // Sockets and database files share one descriptor table: take all the kernel allows (systemd's default soft
        // limit is 1,024), so connection limits, not descriptors, decide what is refused.
        let files = ProcessLimits.raiseOpenFiles()
        logger.debug("Open file limit", metadata: ["limit.soft": "\(files.soft)", "limit.hard": "\(files.hard)"])
        var limits = ServerLimits()
        limits.maxLineBytes = settings.int("max-line-bytes")
        limits.maxDepth = settings.int("max-depth")
        limits.maxBatch = settings.int("max-batch")
        limits.maxConnections = settings.int("max-connections")
        limits.idleTimeoutSeconds = settings.int("idle-timeout")
        limits.maxSubscriptionsPerConnection = settings.int("max-subscriptions")
        limits.maxSubscriberBacklogBytes = settings.int("max-subscriber-backlog-bytes")
        var storeLimits = StoreLimits()
        storeLimits.maxDocumentBytes = settings.int("max-document-bytes")
        storeLimits.feedRetention = settings.int("feed-retention")
        var daemonConfig = DaemonConfig(
            socketPath: settings.string("socket"), dataDirectory: settings.string("data-dir"), limits: limits,
            storeLimits: storeLimits, defaultDatabase: settings.bool("default-database") ? "default" : nil,
            environment: environment)
        daemonConfig.syncListen = settings.string("sync-listen")
        daemonConfig.syncTimeoutMs = Int(settings.double("sync-timeout") * 1000)
        daemonConfig.syncListenerLimits.handshakeTimeoutMs = Int(settings.double("sync-handshake-timeout") * 1000)
        daemonConfig.syncListenerLimits.maxConnections = settings.int("sync-max-peers")
        daemonConfig.syncListenerLimits.maxConnectionsPerAddress = settings.int("sync-max-peers-per-address")
        daemonConfig.syncListenerLimits.maxHandshakes = settings.int("sync-max-handshakes")
        daemonConfig.settings = settings.report
        daemonConfig.notifySocket = environment["NOTIFY_SOCKET"]
        do {
            if let inherited = try Systemd.inheritedSocket(environment: environment) {
                daemonConfig.inheritedSocket = inherited
                daemonConfig.socketPath = inherited.path
            }
            let daemon = try Daemon(config: daemonConfig, logger: logger)
            let group = ServiceGroup(
                configuration: .init(
                    services: [.init(service: daemon, successTerminationBehavior: .gracefullyShutdownGroup)],
                    gracefulShutdownSignals: [.sigterm, .sigint],
                    logger: logger))
            try await group.run()
        } catch {
            Self.fail("blazed: \(error)")
        }
    }

    /// Writes one line to stderr and exits 1.
    static func fail(_ message: String) -> Never {
        let line = Array("\(message)\n".utf8)
        _ = line.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
        Glibc.exit(1)
    }
}
