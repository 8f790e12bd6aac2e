import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeSync
import Foundation
import Logging
import NIOCore
import NIOExtras
import NIOPosix
import ServiceLifecycle
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The BlazeDB daemon as a service: owns the store and serves JSON-RPC on a Unix socket until shut down.
///
/// `run()` listens, serves every connection, and on graceful shutdown (SIGTERM/SIGINT via a `ServiceGroup`) or task
/// cancellation stops accepting, lets in-flight requests finish and be answered, then closes the store.
public final class Daemon: Service, Sendable {
    /// The configuration it was started with.
    public let config: DaemonConfig
    /// The databases it serves.
    public let store: Store
    /// This device's identity (its node id authors every local change).
    public let identity: DeviceIdentity
    let logger: Logger
    let listening = Event()
    let connections = ConnectionTable()
    /// Runs writes, queries and sync work off the event loops.
    let pool = NIOThreadPool(numberOfThreads: max(2, System.coreCount))
    /// Runs long transfers (blob puts and gets), two at a time, beside the I/O pool.
    let transferPool = NIOThreadPool(numberOfThreads: 2)
    /// Reads, seals, opens and stores blob chunks for sync sessions, two at a time: never the transfer pool, whose
    /// threads a get may hold while it waits for the chunks this pool stores.
    let chunkPool = NIOThreadPool(numberOfThreads: 2)
    /// Opens and verifies the batches sync sessions receive, beside the I/O pool, whose stores then never wait behind
    /// a queue of verifications (nor do requests): half the cores, so that sessions verify side by side on a larger
    /// machine while the stores keep the rest.
    let verifyPool = NIOThreadPool(numberOfThreads: max(1, System.coreCount / 2))
    /// Sync with other devices.
    public let sync: SyncEngine
    /// Each database's blobs and the uploads in progress.
    let blobs: Blobs
    /// Fetches pinned blobs and those of eager collections before they are read.
    let prefetcher: BlobPrefetcher
    /// What it counts for Prometheus (`metrics-listen`, `daemon.metrics`).
    let metrics = DaemonMetrics()
    /// The port `metrics-listen` serves on, once listening (nil: not listening).
    public var metricsPort: Int? { metricsListener.withLock { $0?.port } }
    private let metricsListener = Mutex<MetricsListener?>(nil)

    /// Opens the data directory (creating the default database on first start).
    public init(config: DaemonConfig, logger: Logger) throws {
        self.config = config
        self.logger = logger
        try Store.prepareDirectory(config.dataDirectory)
        self.identity = try DeviceIdentity.loadOrCreate(directory: config.dataDirectory + "/keys")
        self.store = try Store(
            directory: config.dataDirectory, limits: config.storeLimits, node: NodeID(bytes: identity.nodeID),
            metrics: metrics.store)
        self.sync = SyncEngine(
            store: store, identity: identity, keysDirectory: config.dataDirectory + "/keys/spaces",
            group: MultiThreadedEventLoopGroup.singleton, pool: pool, logger: logger,
            timeout: .milliseconds(Int64(config.syncTimeoutMs)), retryMaxMs: config.syncRetryMaxMs,
            listenerLimits: config.syncListenerLimits,
            tlsTrustRoots: config.syncTLSTrustRoots, folderOptions: config.folderOptions, chunkPool: chunkPool,
            verifyPool: verifyPool)
        self.blobs = Blobs(
            maxBlobBytes: config.maxBlobBytes, stores: sync.chunkStores, pool: pool, isOpen: { [connections] in connections.isOpen($0) })
        self.prefetcher = BlobPrefetcher(blobs: blobs, sync: sync, store: store, logger: logger)
        if let name = config.defaultDatabase, (try? store.database(name)) == nil {
            _ = try store.create(name)
        }
    }

    /// Returns once the socket accepts connections.
    public func waitUntilListening() async {
        await listening.wait()
    }

    /// Serves until graceful shutdown or cancellation.
    public func run() async throws {
        let fd = try config.inheritedSocket?.descriptor ?? SocketListener.listen(path: config.socketPath)
        // Only once the socket is this daemon's: a second one started on the same data directory removes nothing.
        Blobs.removeUnfinishedRestores(in: config.dataDirectory + "/databases")
        let context = RequestContext(
            store: store, config: config, logger: logger, startedAt: .now, connections: connections,
            sync: sync, blobs: blobs, prefetcher: prefetcher, metrics: metrics)
        let pool = self.pool
        pool.start()
        transferPool.start()
        chunkPool.start()
        verifyPool.start()
        let dispatcher = Dispatcher(context: context, pool: pool, transferPool: transferPool)
        let limits = config.limits
        let connections = self.connections
        let logger = self.logger
        let quiesce = ServerQuiescingHelper(group: MultiThreadedEventLoopGroup.singleton)
        let clientLoops = ClientLoops(threads: config.clientLoopThreads)
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton, childGroup: clientLoops.group)
            .serverChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(quiesce.makeServerChannelHandler(channel: channel))
                }
            }
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            // One read per readable event: a request/response client sends one line at a time, and a second read
            // would only return EAGAIN (a wasted system call per request).
            .childChannelOption(.maxMessagesPerRead, value: 1)
            .childChannelInitializer { channel in
                Self.initialize(
                    channel, limits: limits, connections: connections, dispatcher: dispatcher, logger: logger,
                    loopConnections: clientLoops.connections(on: channel.eventLoop))
            }
        let server: any Channel
        do {
            server = try await bootstrap.withBoundSocket(fd).get()
        } catch {
            // The pools started above are stopped on every way out of `run`.
            try? await pool.shutdownGracefully()
            try? await transferPool.shutdownGracefully()
            try? await chunkPool.shutdownGracefully()
            try? await verifyPool.shutdownGracefully()
            try? await clientLoops.group.shutdownGracefully()
            throw error
        }
        // Every shared database's space is in memory before the first peer can connect: a handshake checks the
        // spaces held there, and a peer refused as a stranger backs off.
        sync.loadSpaces()
        do {
            if let listen = config.syncListen {
                guard let address = PeerAddress(listen, listening: true) else { throw DaemonError.invalidSyncAddress(listen) }
                _ = try await sync.listen(host: address.host, port: address.port)
            }
            if let listen = config.metricsListen {
                guard let address = PeerAddress(listen, listening: true), PeerAddress.isLoopback(host: address.host) else {
                    throw DaemonError.invalidMetricsAddress(listen)
                }
                let metrics = self.metrics
                let token = try MetricsListener.loadOrCreateToken(directory: config.dataDirectory)
                let listener = try await MetricsListener.start(
                    host: address.host, port: address.port, token: token, pool: pool
                ) {
                    metrics.render(context)
                }
                metricsListener.withLock { $0 = listener }
            }
        } catch {
            // Nothing keeps serving once `run` has failed: an embedding program may go on running.
            await metricsListener.withLock { $0 }?.close()
            try? await server.close()
            await sync.shutdown()
            try? await pool.shutdownGracefully()
            try? await transferPool.shutdownGracefully()
            try? await chunkPool.shutdownGracefully()
            try? await verifyPool.shutdownGracefully()
            try? await clientLoops.group.shutdownGracefully()
            if config.inheritedSocket == nil { unlink(config.socketPath) }
            throw error
        }
        sync.start()
        prefetcher.start()
        let compactor = startCompactor()
        if let problem = SyncProtocols.overrideProblem { logger.warning("\(problem)") }
        // Logged once everything serves (the sync listener too): scripts and tests wait for this line.
        logger.info(
            "Listening",
            metadata: [
                "socket.path": "\(config.socketPath)", "socket.inherited": "\(config.inheritedSocket != nil)",
                "data.dir": "\(config.dataDirectory)", "sync.listen": "\(sync.listeningAddress ?? "-")",
                "metrics.port": "\(metricsPort.map(String.init) ?? "-")",
            ])
        listening.fire()
        Systemd.notify("READY=1\nSTATUS=serving \(config.socketPath)\nMAINPID=\(getpid())", socket: config.notifySocket)

        let stop = Event()
        await withTaskCancellationHandler {
            await withGracefulShutdownHandler {
                await stop.wait()
            } onGracefulShutdown: {
                stop.fire()
            }
        } onCancel: {
            stop.fire()
        }
        Systemd.notify("STOPPING=1\nSTATUS=finishing in-flight requests", socket: config.notifySocket)
        logger.info("Shutting down: no new connections, finishing in-flight requests")
        // Closes the listening socket, tells every open connection to finish (`ChannelShouldQuiesceEvent`: each
        // answers what it has received, then closes) and completes once all have closed. A connection still in
        // its peer-credential check is refused by the table instead, as it may not have a handler for the event yet.
        connections.beginShutdown()
        let quiesced = server.eventLoop.makePromise(of: Void.self)
        quiesce.initiateShutdown(promise: quiesced)
        try? await quiesced.futureResult.get()
        await metricsListener.withLock { $0 }?.close()
        compactor?.cancel()
        _ = await compactor?.result
        prefetcher.shutdown()
        await sync.shutdown()
        try? await pool.shutdownGracefully()
        try? await transferPool.shutdownGracefully()
        try? await chunkPool.shutdownGracefully()
        try? await verifyPool.shutdownGracefully()
        try? await clientLoops.group.shutdownGracefully()
        if config.inheritedSocket == nil { unlink(config.socketPath) }  // systemd owns an inherited socket's path
        store.closeAll()
        logger.info("Stopped")
    }

    /// Compacts every database every `compactionIntervalMs` on the I/O pool (SYNC.md §11); nil when that is 0.
    func startCompactor() -> Task<Void, Never>? {
        guard config.compactionIntervalMs > 0 else { return nil }
        let (store, sync, pool, logger, blobs) = (self.store, self.sync, self.pool, self.logger, self.blobs)
        let (interval, horizon) = (config.compactionIntervalMs, UInt64(config.compactionHorizonMs))
        return Task.detached {
            while !Task.isCancelled {
                // A timer, not a synchronization: the next compaction is due.
                try? await Task.sleep(for: .milliseconds(interval))
                for name in (try? store.list()) ?? [] where !Task.isCancelled {
                    do {
                        let outcome = try await pool.runIfActive { try sync.compact(db: try store.database(name), horizonMs: horizon) }
                        if outcome.report.rows > 0 {
                            logger.info(
                                "Database compacted",
                                metadata: ["db": "\(name)", "rows": "\(outcome.report.rows)", "pages": "\(outcome.report.pagesFreed)"])
                        }
                    } catch {
                        logger.warning("Compaction failed", metadata: ["db": "\(name)", "error": "\(error)"])
                        continue
                    }
                    // What compaction dropped may have been the last reference to a blob (a database with no blob
                    // store returns at once).
                    do {
                        let sweep = try await pool.runIfActive { try blobs.collect(db: try store.database(name)) }
                        if sweep.removedChunks > 0 {
                            logger.info(
                                "Blob chunks collected",
                                metadata: ["db": "\(name)", "removed": "\(sweep.removedChunks)", "bytes": "\(sweep.removedBytes)"])
                        }
                    } catch {
                        logger.warning("Collecting blob chunks failed", metadata: ["db": "\(name)", "error": "\(error)"])
                    }
                }
            }
        }
    }

    /// Child channel setup on its event loop: peer uid check, connection limit, then the line codec and handler.
    static func initialize(
        _ channel: any Channel, limits: ServerLimits, connections: ConnectionTable, dispatcher: Dispatcher, logger: Logger,
        loopConnections: NIOLoopBoundBox<Int>
    ) -> EventLoopFuture<Void> {
        let provider = channel as! any SocketOptionProvider
        let creds: EventLoopFuture<PeerCredentials> = provider.unsafeGetSocketOption(
            level: .socket, name: NIOBSDSocket.Option(rawValue: SO_PEERCRED))
        return creds.flatMap { cred -> EventLoopFuture<Void> in
            guard cred.uid == getuid() else {
                logger.warning(
                    "Refused connection from another user", metadata: ["peer.uid": "\(cred.uid)", "peer.pid": "\(cred.pid)"])
                return channel.close()
            }
            let id: Int
            switch connections.admit(max: limits.maxConnections) {
            case .admitted(let admitted):
                id = admitted
            case .closing:
                return channel.close()
            case .full:
                logger.warning("Refused connection: too many connections", metadata: ["limit": "\(limits.maxConnections)"])
                let err = RPCCodec.response(
                    id: .null,
                    error: RPCError(
                        code: RPCErrorCode.limitExceeded, kind: "too_many_connections",
                        message: "the daemon already serves \(limits.maxConnections) connections"))
                return channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(RefuseHandler(line: err.jsonBytes + [0x0A]))
                }
            }
            logger.debug("Connection opened", metadata: ["connection.id": "\(id)", "peer.pid": "\(cred.pid)"])
            channel.closeFuture.whenComplete { _ in
                connections.remove(id)
                // Its uploads end with it (each may hold a window of chunks in memory).
                dispatcher.context.blobs.dropUploads(connection: id)
                logger.debug("Connection closed", metadata: ["connection.id": "\(id)"])
            }
            let connection = ConnectionHandle(
                id: id, maxSubscriptions: limits.maxSubscriptionsPerConnection, table: connections)
            return channel.eventLoop.makeCompletedFuture {
                if limits.idleTimeoutSeconds > 0 {
                    try channel.pipeline.syncOperations.addHandler(
                        IdleStateHandler(readTimeout: .seconds(Int64(limits.idleTimeoutSeconds))))
                    try channel.pipeline.syncOperations.addHandler(IdleCloser(connection: connection))
                }
                try channel.pipeline.syncOperations.addHandler(
                    ByteToMessageHandler(LineFrameDecoder(maxLength: limits.maxLineBytes)))
                try channel.pipeline.syncOperations.addHandler(
                    RPCHandler(
                        connection: connection, dispatcher: dispatcher, limits: limits, logger: logger,
                        loopConnections: loopConnections))
            }
        }
    }
}
