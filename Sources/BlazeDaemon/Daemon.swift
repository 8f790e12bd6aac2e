import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeSync
import Foundation
import Logging
import NIOCore
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
    /// Sync with other devices.
    public let sync: SyncEngine

    /// Opens the data directory (creating the default database on first start).
    public init(config: DaemonConfig, logger: Logger) throws {
        self.config = config
        self.logger = logger
        try Store.prepareDirectory(config.dataDirectory)
        self.identity = try DeviceIdentity.loadOrCreate(directory: config.dataDirectory + "/keys")
        self.store = try Store(
            directory: config.dataDirectory, limits: config.storeLimits, node: NodeID(bytes: identity.nodeID))
        self.sync = SyncEngine(
            store: store, identity: identity, keysDirectory: config.dataDirectory + "/keys/spaces",
            group: MultiThreadedEventLoopGroup.singleton, pool: pool, logger: logger,
            timeout: .milliseconds(Int64(config.syncTimeoutMs)), listenerLimits: config.syncListenerLimits)
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
        let context = RequestContext(
            store: store, config: config, logger: logger, startedAt: .now, connections: connections,
            sync: sync)
        let pool = self.pool
        pool.start()
        let dispatcher = Dispatcher(context: context, pool: pool)
        let limits = config.limits
        let connections = self.connections
        let logger = self.logger
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelInitializer { channel in
                Self.initialize(channel, limits: limits, connections: connections, dispatcher: dispatcher, logger: logger)
            }
            .withBoundSocket(fd).get()
        logger.info(
            "Listening",
            metadata: [
                "socket.path": "\(config.socketPath)", "socket.inherited": "\(config.inheritedSocket != nil)",
                "data.dir": "\(config.dataDirectory)",
            ])
        if let listen = config.syncListen {
            guard let address = PeerAddress(listen, listening: true) else { throw DaemonError.invalidSyncAddress(listen) }
            _ = try await sync.listen(host: address.host, port: address.port)
        }
        sync.start()
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
        try? await server.close()
        for channel in connections.beginShutdown() {
            channel.pipeline.fireUserInboundEventTriggered(RPCHandler.Shutdown())
            try? await channel.closeFuture.get()
        }
        await sync.shutdown()
        try? await pool.shutdownGracefully()
        if config.inheritedSocket == nil { unlink(config.socketPath) }  // systemd owns an inherited socket's path
        store.closeAll()
        logger.info("Stopped")
    }

    /// Child channel setup on its event loop: peer uid check, connection limit, then the line codec and handler.
    static func initialize(
        _ channel: any Channel, limits: ServerLimits, connections: ConnectionTable, dispatcher: Dispatcher, logger: Logger
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
            guard let id = connections.add(channel, max: limits.maxConnections) else {
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
                    RPCHandler(connection: connection, dispatcher: dispatcher, limits: limits, logger: logger))
            }
        }
    }
}

/// Answers the requests of one connection in order, on the connection's event loop, and delivers its subscriptions.
///
/// Requests whose methods only read a little (`MethodHandler.runsInline`) are answered right here, with no thread hop;
/// the others run on the daemon's I/O thread pool and are answered back on the loop. While a request runs on the
/// pool, later lines wait in a queue, and reading from the socket pauses once that queue is full or while the
/// client does not read its responses.
///
/// A subscription starts once the response to its `subscribe` is written: it replays the durable feed from its
/// start sequence in pages (each page waits until the client has read the previous ones), then attaches to the live
/// feed. Live events are written as they commit; a subscription whose connection already has more than
/// `maxSubscriberBacklogBytes` unsent is dropped with a final error notification.
final class RPCHandler: ChannelDuplexHandler {
    typealias InboundIn = InboundFrame
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Asks the connection to finish what it has received, then close (graceful shutdown).
    struct Shutdown {}

    /// Lines queued beyond this stop reading from the socket until the queue drains.
    static let maxQueued = 64

    let connection: ConnectionHandle
    let dispatcher: Dispatcher
    let limits: ServerLimits
    let logger: Logger
    private var queue = CircularBuffer<InboundFrame>()
    private var busy = false
    private var closing = false
    private var heldRead = false

    /// Loop-side state of a started subscription.
    struct Delivery {
        let sub: Subscription
        /// Events up to this feed sequence are delivered (or were not for this subscription).
        var delivered: Int64
        /// Replaying and paused until the client reads (the channel becomes writable).
        var waiting = false
    }

    private var deliveries: [String: Delivery] = [:]

    var id: Int { connection.id }

    init(connection: ConnectionHandle, dispatcher: Dispatcher, limits: ServerLimits, logger: Logger) {
        self.connection = connection
        self.dispatcher = dispatcher
        self.limits = limits
        self.logger = logger
    }

    func handlerAdded(context: ChannelHandlerContext) {
        // Pause reading requests while this much output waits for the client (it reads its responses too slowly).
        context.channel.setOption(.writeBufferWaterMark, value: .init(low: 256 << 10, high: 1 << 20)).whenFailure { _ in }
    }

    func channelInactive(context: ChannelHandlerContext) {
        connection.close()
        deliveries = [:]
        context.fireChannelInactive()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            for (id, d) in deliveries where d.waiting {
                deliveries[id]?.waiting = false
                pump(id, context: context)
            }
            if heldRead && queue.count < Self.maxQueued {
                heldRead = false
                context.read()
            }
        }
        context.fireChannelWritabilityChanged()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !closing else { return }
        queue.append(unwrapInboundIn(data))
        drain(context: context)
    }

    func read(context: ChannelHandlerContext) {
        if queue.count >= Self.maxQueued || !context.channel.isWritable {
            heldRead = true
        } else {
            context.read()
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is Shutdown {
            closing = true
            closeIfIdle(context: context)
        } else if case ChannelEvent.inputClosed = event {
            // The client sent its last request: answer everything received, then close.
            closing = true
            closeIfIdle(context: context)
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }

    private func closeIfIdle(context: ChannelHandlerContext) {
        if !busy && queue.isEmpty { context.close(promise: nil) }
    }

    private func drain(context: ChannelHandlerContext) {
        while !busy, let frame = queue.popFirst() {
            switch frame {
            case .tooLong:
                logger.notice("Closing connection: line too long", metadata: ["connection.id": "\(id)"])
                let err = RPCCodec.response(
                    id: .null,
                    error: RPCError(
                        code: RPCErrorCode.limitExceeded, kind: "line_too_long",
                        message: "request line exceeds \(limits.maxLineBytes) bytes; closing the connection",
                        details: ["limit": .int(Int64(limits.maxLineBytes))]))
                queue.removeAll()
                closing = true
                context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: err.jsonBytes + [0x0A])), promise: nil)
                context.close(promise: nil)
                return
            case .line(let line):
                if line.readableBytesView.allSatisfy({ $0 == 0x20 || $0 == 0x09 }) { continue }
                let prepared = dispatcher.prepare(line: line.readableBytesView)
                if dispatcher.runsInline(prepared) {
                    send(dispatcher.execute(prepared, connection: connection), context: context)
                    continue
                }
                busy = true
                let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
                let connection = self.connection
                let dispatcher = self.dispatcher
                dispatcher.pool.runIfActive(eventLoop: context.eventLoop) {
                    dispatcher.execute(prepared, connection: connection)
                }.whenComplete { result in
                    let (handler, context) = loopBound.value
                    handler.busy = false
                    switch result {
                    case .success(let reply): handler.send(reply, context: context)
                    case .failure:
                        let err = RPCCodec.response(id: .null, error: RPCError(
                            code: RPCErrorCode.unavailable, kind: "shutting_down", message: "the daemon is shutting down"))
                        handler.send(err.jsonBytes, context: context)
                    }
                    handler.drain(context: context)
                }
                return
            }
        }
        if heldRead && queue.count < Self.maxQueued && context.channel.isWritable {
            heldRead = false
            context.read()
        }
        if closing { closeIfIdle(context: context) }
    }

    private func send(_ reply: [UInt8]?, context: ChannelHandlerContext) {
        if var reply {
            reply.append(0x0A)
            context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: reply)), promise: nil)
        }
        // Subscriptions created by this request start now that their `subscribe` response is out.
        for sub in connection.takePending() where !sub.isCancelled {
            deliveries[sub.id] = Delivery(sub: sub, delivered: sub.start)
            pump(sub.id, context: context)
        }
    }

    // MARK: subscriptions

    /// Catches a subscription up: attaches it to the live feed when nothing is left to replay, else replays one page
    /// from the durable feed on the I/O pool and comes back.
    private func pump(_ id: String, context: ChannelHandlerContext) {
        guard let d = deliveries[id], connection.contains(d.sub) else {
            deliveries[id] = nil
            return
        }
        let sub = d.sub
        let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let attachment = sub.database.feed.attach(after: d.delivered) { signal in
            loopBound.eventLoop.execute {
                let (handler, context) = loopBound.value
                handler.receive(signal, for: sub, context: context)
            }
        }
        switch attachment {
        case .attached(let token):
            sub.attached(token)
        case .ended(let error):
            end(sub, Dispatcher.rpcError(error) ?? .internalError(), context: context)
        case .behind:
            let after = d.delivered
            dispatcher.pool.runIfActive(eventLoop: context.eventLoop) {
                try sub.database.feedEntries(after: after)
            }.whenComplete { result in
                let (handler, context) = loopBound.value
                guard handler.deliveries[sub.id] != nil, !sub.isCancelled else { return }
                switch result {
                case .success(let entries):
                    handler.write(entries, for: sub, context: context)
                    if context.channel.isWritable {
                        handler.pump(sub.id, context: context)
                    } else {
                        handler.deliveries[sub.id]?.waiting = true
                    }
                case .failure(let error as StoreError):
                    handler.end(sub, Dispatcher.rpcError(error) ?? .internalError(), context: context)
                case .failure(let error):
                    handler.logger.error(
                        "Subscription replay failed",
                        metadata: ["connection.id": "\(handler.id)", "subscription": "\(sub.id)", "error": "\(error)"])
                    handler.end(sub, .internalError(), context: context)
                }
            }
        }
    }

    /// A live signal from the feed (on this loop, in commit order).
    private func receive(_ signal: FeedSignal, for sub: Subscription, context: ChannelHandlerContext) {
        guard deliveries[sub.id]?.sub === sub, !sub.isCancelled else { return }
        switch signal {
        case .entries(let entries):
            let backlog = (try? context.channel.syncOptions?.getOption(.bufferedWritableBytes)) ?? 0
            if backlog > limits.maxSubscriberBacklogBytes {
                logger.notice(
                    "Dropping a subscriber that does not keep up",
                    metadata: ["connection.id": "\(id)", "subscription": "\(sub.id)", "backlog.bytes": "\(backlog)"])
                end(
                    sub,
                    RPCError(
                        code: RPCErrorCode.limitExceeded, kind: "subscriber_too_slow",
                        message: "more than \(limits.maxSubscriberBacklogBytes) bytes were waiting for this connection "
                            + "to read them; the subscription is dropped: subscribe again with since to resume",
                        details: ["lastSeq": .int(deliveries[sub.id]?.delivered ?? sub.start)]),
                    context: context)
                return
            }
            write(entries, for: sub, context: context)
        case .ended(let error):
            end(sub, Dispatcher.rpcError(error) ?? .internalError(), context: context)
        }
    }

    /// Writes the events of `entries` not yet delivered to `sub`.
    private func write(_ entries: [FeedEntry], for sub: Subscription, context: ChannelHandlerContext) {
        guard let delivered = deliveries[sub.id]?.delivered else { return }
        let fresh = entries.lazy.filter { $0.seq > delivered }
        guard let last = fresh.last?.seq else { return }
        deliveries[sub.id]?.delivered = last
        if let line = sub.notification(fresh) {
            context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: line)), promise: nil)
        }
    }

    /// Ends a subscription with one final error notification.
    private func end(_ sub: Subscription, _ error: RPCError, context: ChannelHandlerContext) {
        guard deliveries.removeValue(forKey: sub.id) != nil, connection.remove(sub.id) != nil else { return }
        context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: sub.finalNotification(error))), promise: nil)
    }
}

/// The kernel's `struct ucred` (pid, uid, gid), which Swift's Glibc module does not export.
struct PeerCredentials: Sendable {
    var pid: Int32 = 0
    var uid: UInt32 = 0
    var gid: UInt32 = 0
}

/// Sends one error line as soon as the connection is active, then closes it (the initializer runs too early to write).
final class RefuseHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    let line: [UInt8]

    init(line: [UInt8]) { self.line = line }

    func channelActive(context: ChannelHandlerContext) {
        let channel = context.channel
        let buffer = channel.allocator.buffer(bytes: line)
        context.writeAndFlush(NIOAny(buffer)).whenComplete { _ in channel.close(promise: nil) }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}
}

/// Closes a connection when `IdleStateHandler` reports it idle, unless it holds subscriptions (a watcher is silent
/// by nature; it stays until it unsubscribes or disconnects).
final class IdleCloser: ChannelInboundHandler, Sendable {
    typealias InboundIn = NIOAny
    let connection: ConnectionHandle

    init(connection: ConnectionHandle) { self.connection = connection }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is IdleStateHandler.IdleStateEvent {
            if connection.count == 0 { context.close(promise: nil) }
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }
}

/// The live connections, for the connection limit and for closing inputs at shutdown.
final class ConnectionTable: Sendable {
    private let state = Mutex<(next: Int, channels: [Int: any Channel], closing: Bool)>((1, [:], false))
    /// Live subscriptions over all connections.
    let subscriptions = Atomic<Int>(0)

    /// Number of open connections.
    var count: Int { state.withLock { $0.channels.count } }

    func add(_ channel: any Channel, max: Int) -> Int? {
        state.withLock { s in
            guard !s.closing, s.channels.count < max else { return nil }
            let id = s.next
            s.next += 1
            s.channels[id] = channel
            return id
        }
    }

    func remove(_ id: Int) {
        _ = state.withLock { $0.channels.removeValue(forKey: id) }
    }

    /// Refuses new connections from now on and returns the live ones.
    func beginShutdown() -> [any Channel] {
        state.withLock { s in
            s.closing = true
            return Array(s.channels.values)
        }
    }
}

/// A one-shot event that any number of tasks can wait for.
final class Event: Sendable {
    private let state = Mutex<(fired: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    func fire() {
        let waiters = state.withLock { s in
            s.fired = true
            defer { s.waiters = [] }
            return s.waiters
        }
        for w in waiters { w.resume() }
    }

    func wait() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let fired = state.withLock { s in
                if s.fired { return true }
                s.waiters.append(c)
                return false
            }
            if fired { c.resume() }
        }
    }
}
