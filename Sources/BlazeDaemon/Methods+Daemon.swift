import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeSync
import Foundation

/// What `blazed --version` prints: the version, the sync protocols spoken and the formats of the files it writes.
public let blazedVersionText =
    "\(blazeVersion) (sync protocol \(Handshake.protocols.lowerBound)–\(Handshake.protocols.upperBound), database format "
    + "\(DatabaseFormat.current), keystore \(KeystoreFormat.current), entry \(EntryHeader.newestVersion), folder \(FolderFiles.version))"

/// The daemon itself: discovery, facts and effective configuration.
extension Methods {
    /// The protocol document (Protocol/blazedb.openrpc.json, embedded at build time by the EmbedProtocolDocument plugin).
    static let discoverDocument: JSONValue = {
        // The document is checked by the generator and the tests; a failure here is a build defect.
        try! JSONParser(maxDepth: 256).parse(openRPCDocumentText)
    }()

    static let rpcDiscover = MethodHandler(RPC.RpcDiscover.self, inline: true) { _, _ in discoverDocument }

    static let daemonInfo = MethodHandler(RPC.DaemonInfo.self, inline: true) { _, ctx in
        let uptime = ContinuousClock.now - ctx.startedAt
        let l = ctx.config.limits
        let s = ctx.config.storeLimits
        let formats = RPC.DaemonInfo.Result.Formats(
            database: DatabaseFormat.current, keystore: KeystoreFormat.current, folder: Int(FolderFiles.version),
            entry: Int(EntryHeader.newestVersion), protocol: Int(SyncProtocols.spoken.upperBound),
            oldestProtocol: Int(SyncProtocols.spoken.lowerBound))
        let uptimeSeconds = Double(uptime.components.seconds) + Double(uptime.components.attoseconds) / 1e18
        return RPC.DaemonInfo.Result(
            version: blazeVersion, formats: formats,
            nodeId: ctx.store.node.hex, pid: Int(ProcessInfo.processInfo.processIdentifier),
            socket: ctx.config.socketPath, dataDir: ctx.config.dataDirectory,
            uptimeSeconds: uptimeSeconds,
            databases: try ctx.store.count(), connections: ctx.connections.count,
            subscriptions: ctx.connections.subscriptions.load(ordering: .relaxed),
            limits: .init(
                maxLineBytes: l.maxLineBytes, maxDepth: s.maxDepth, maxBatch: l.maxBatch, maxConnections: l.maxConnections,
                idleTimeoutSeconds: l.idleTimeoutSeconds, maxDocumentBytes: s.maxDocumentBytes,
                maxTransactionOps: s.maxTransactionOps, maxQueryLimit: s.maxQueryLimit,
                maxSubscriptionsPerConnection: l.maxSubscriptionsPerConnection,
                maxSubscriberBacklogBytes: l.maxSubscriberBacklogBytes, feedRetention: s.feedRetention))
    }

    static let daemonConfig = MethodHandler(RPC.DaemonConfig.self, inline: true) { _, ctx in
        ctx.config.settings ?? .init(file: nil, settings: [])
    }

    /// Rendered on the pool: it reads every database's file size and every shared database's sync status.
    static let daemonMetrics = MethodHandler(RPC.DaemonMetrics.self) { _, ctx in
        guard let metrics = ctx.metrics else {
            throw RPCError(code: RPCErrorCode.internalError, kind: "internal_error", message: "this daemon keeps no metrics")
        }
        return .init(contentType: "text/plain; version=0.0.4", text: String(decoding: metrics.render(ctx), as: UTF8.self))
    }
}
