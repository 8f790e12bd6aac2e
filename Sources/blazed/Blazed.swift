import ArgumentParser
import BlazeDaemon
import BlazeSync
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
        commandName: "blazed", abstract: "The BlazeDB daemon: serves local document databases over a Unix socket.")

    @Option(help: "Unix socket path (default: $BLAZEDB_SOCKET, else $XDG_RUNTIME_DIR/blazedb/blazed.sock).")
    var socket: String?

    @Option(name: .customLong("data-dir"), help: "Data directory (default: $XDG_DATA_HOME/blazedb).")
    var dataDir: String?

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel: String = "info"

    @Option(help: "Maximum bytes in one request line.") var maxLineBytes: Int = ServerLimits().maxLineBytes
    @Option(help: "Maximum JSON nesting depth of a request.") var maxDepth: Int = ServerLimits().maxDepth
    @Option(help: "Maximum requests in one batch.") var maxBatch: Int = ServerLimits().maxBatch
    @Option(help: "Maximum simultaneous connections.") var maxConnections: Int = ServerLimits().maxConnections
    @Option(help: "Seconds before a silent connection is closed (0: never).")
    var idleTimeout: Int = ServerLimits().idleTimeoutSeconds
    @Option(help: "Maximum size of one document in bytes.") var maxDocumentBytes: Int = StoreLimits().maxDocumentBytes
    @Option(help: "Maximum subscriptions per connection.")
    var maxSubscriptions: Int = ServerLimits().maxSubscriptionsPerConnection
    @Option(help: "Unsent bytes a connection may accumulate before a live subscription on it is dropped.")
    var maxSubscriberBacklogBytes: Int = ServerLimits().maxSubscriberBacklogBytes
    @Option(help: "Changes each database keeps in its change feed for resuming subscriptions (since).")
    var feedRetention: Int = StoreLimits().feedRetention

    @Flag(help: "Do not create the 'default' database on first start.") var noDefaultDatabase = false
    @Option(help: "Accept sync peers on host:port (port 0 picks a free port; see daemon.info / sync.status). Off by default.")
    var syncListen: String?
    @Option(help: "Seconds a sync handshake may take and a sync peer may stay silent before it is disconnected (quiet peers ping at a third of it).")
    var syncTimeout: Double = 30

    func validate() throws {
        guard Logger.Level(rawValue: logLevel) != nil else {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical")
        }
        for (name, value) in [
            ("--max-line-bytes", maxLineBytes), ("--max-depth", maxDepth), ("--max-batch", maxBatch),
            ("--max-connections", maxConnections), ("--max-document-bytes", maxDocumentBytes),
            ("--max-subscriptions", maxSubscriptions), ("--max-subscriber-backlog-bytes", maxSubscriberBacklogBytes),
            ("--feed-retention", feedRetention),
        ] where value < 1 {
            throw ValidationError("\(name) must be at least 1")
        }
        guard idleTimeout >= 0 else { throw ValidationError("--idle-timeout must be 0 or more") }
        guard syncTimeout >= 0.1 && syncTimeout <= 3600 else {
            throw ValidationError("--sync-timeout must be from 0.1 to 3600 seconds, got \(syncTimeout)")
        }
        if let syncListen, PeerAddress(syncListen, listening: true) == nil {
            throw ValidationError("--sync-listen must be host:port, got \(syncListen)")
        }
    }

    func run() async throws {
        let level = Logger.Level(rawValue: logLevel)!
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "blazed")
        var limits = ServerLimits()
        limits.maxLineBytes = maxLineBytes
        limits.maxDepth = maxDepth
        limits.maxBatch = maxBatch
        limits.maxConnections = maxConnections
        limits.idleTimeoutSeconds = idleTimeout
        limits.maxSubscriptionsPerConnection = maxSubscriptions
        limits.maxSubscriberBacklogBytes = maxSubscriberBacklogBytes
        var storeLimits = StoreLimits()
        storeLimits.maxDocumentBytes = maxDocumentBytes
        storeLimits.feedRetention = feedRetention
        let environment = ProcessInfo.processInfo.environment
        var config = DaemonConfig(
            socketPath: socket, dataDirectory: dataDir, limits: limits, storeLimits: storeLimits,
            defaultDatabase: noDefaultDatabase ? nil : "default", environment: environment)
        config.syncListen = syncListen
        config.syncTimeoutMs = Int(syncTimeout * 1000)
        do {
            let daemon = try Daemon(config: config, logger: logger)
            let group = ServiceGroup(
                configuration: .init(
                    services: [.init(service: daemon, successTerminationBehavior: .gracefullyShutdownGroup)],
                    gracefulShutdownSignals: [.sigterm, .sigint],
                    logger: logger))
            try await group.run()
        } catch {
            let line = Array("blazed: \(error)\n".utf8)
            _ = line.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
            throw ExitCode(1)
        }
    }
}
