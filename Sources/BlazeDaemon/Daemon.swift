import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
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
    let registry: MethodRegistry
    let listening = Event()
    let connections = ConnectionTable()

    /// Opens the data directory (creating the default database on first start).
    public init(config: DaemonConfig, logger: Logger) throws {
        self.config = config
        self.logger = logger
        try Store.prepareDirectory(config.dataDirectory)
        self.identity = try DeviceIdentity.loadOrCreate(directory: config.dataDirectory + "/keys")
        self.store = try Store(
            directory: config.dataDirectory, limits: config.storeLimits, node: NodeID(bytes: identity.nodeID))
        self.registry = MethodRegistry(Methods.all())
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
        let fd = try SocketListener.listen(path: config.socketPath)
        let context = RequestContext(
            store: store, config: config, logger: logger, startedAt: .now, registry: registry)
        let dispatcher = Dispatcher(context: context)
        let limits = config.limits
        let connections = self.connections
        let logger = self.logger
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .bind(fd) { channel in
                Self.initialize(channel, limits: limits, connections: connections, logger: logger)
            }
        logger.info("Listening", metadata: ["socket.path": "\(config.socketPath)", "data.dir": "\(config.dataDirectory)"])
        listening.fire()

        let shutdown: @Sendable () -> Void = {
            logger.info("Shutting down: no new connections, finishing in-flight requests")
            server.channel.close(promise: nil)
            connections.closeAllInputs()
        }
        await withTaskCancellationHandler {
            await withGracefulShutdownHandler {
                await withDiscardingTaskGroup { group in
                    do {
                        try await server.executeThenClose { inbound in
                            for try await accepted in inbound {
                                guard case .accepted(let id, let channel) = accepted else { continue }
                                group.addTask {
                                    await Self.serve(channel, id: id, dispatcher: dispatcher, limits: limits, logger: logger)
                                    connections.remove(id)
                                }
                            }
                        }
                    } catch {
                        logger.debug("Accept loop ended", metadata: ["error": "\(error)"])
                    }
                }
            } onGracefulShutdown: {
                shutdown()
            }
        } onCancel: {
            shutdown()
        }
        unlink(config.socketPath)
        store.closeAll()
        logger.info("Stopped")
    }

    enum Accepted: Sendable {
        case accepted(Int, NIOAsyncChannel<InboundFrame, ByteBuffer>)
        case refused
    }

    /// Child channel setup on its event loop: peer uid check, connection limit, then the line codec.
    static func initialize(_ channel: any Channel, limits: ServerLimits, connections: ConnectionTable, logger: Logger)
        -> EventLoopFuture<Accepted>
    {
        let provider = channel as! any SocketOptionProvider
        let creds: EventLoopFuture<PeerCredentials> = provider.unsafeGetSocketOption(
            level: .socket, name: NIOBSDSocket.Option(rawValue: SO_PEERCRED))
        return creds.flatMap { cred -> EventLoopFuture<Accepted> in
            guard cred.uid == getuid() else {
                logger.warning(
                    "Refused connection from another user", metadata: ["peer.uid": "\(cred.uid)", "peer.pid": "\(cred.pid)"])
                return channel.close().map { .refused }
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
                    return .refused
                }
            }
            return channel.eventLoop.makeCompletedFuture {
                if limits.idleTimeoutSeconds > 0 {
                    try channel.pipeline.syncOperations.addHandler(
                        IdleStateHandler(readTimeout: .seconds(Int64(limits.idleTimeoutSeconds))))
                    try channel.pipeline.syncOperations.addHandler(IdleCloser())
                }
                try channel.pipeline.syncOperations.addHandler(
                    ByteToMessageHandler(LineFrameDecoder(maxLength: limits.maxLineBytes)))
                let async = try NIOAsyncChannel<InboundFrame, ByteBuffer>(
                    wrappingChannelSynchronously: channel,
                    configuration: .init(isOutboundHalfClosureEnabled: true))
                return .accepted(id, async)
            }
        }
    }

    /// Serves one connection: requests are answered in order; an oversized line gets an error and a close.
    static func serve(
        _ channel: NIOAsyncChannel<InboundFrame, ByteBuffer>, id: Int, dispatcher: Dispatcher, limits: ServerLimits,
        logger: Logger
    ) async {
        do {
            try await channel.executeThenClose { inbound, outbound in
                for try await frame in inbound {
                    switch frame {
                    case .line(let line):
                        if line.readableBytesView.allSatisfy({ $0 == 0x20 || $0 == 0x09 }) { continue }
                        guard var reply = await dispatcher.handle(line: line.readableBytesView, connection: id) else {
                            continue
                        }
                        reply.append(0x0A)
                        try await outbound.write(ByteBuffer(bytes: reply))
                    case .tooLong:
                        logger.notice("Closing connection: line too long", metadata: ["connection.id": "\(id)"])
                        let err = RPCCodec.response(
                            id: .null,
                            error: RPCError(
                                code: RPCErrorCode.limitExceeded, kind: "line_too_long",
                                message: "request line exceeds \(limits.maxLineBytes) bytes; closing the connection",
                                details: ["limit": .int(Int64(limits.maxLineBytes))]))
                        try await outbound.write(ByteBuffer(bytes: err.jsonBytes + [0x0A]))
                        return
                    }
                }
            }
        } catch {
            logger.debug("Connection ended with an error", metadata: ["connection.id": "\(id)", "error": "\(error)"])
        }
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

/// Closes a connection when `IdleStateHandler` reports it idle.
final class IdleCloser: ChannelInboundHandler, Sendable {
    typealias InboundIn = NIOAny

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is IdleStateHandler.IdleStateEvent {
            context.close(promise: nil)
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }
}

/// The live connections, for the connection limit and for closing inputs at shutdown.
final class ConnectionTable: Sendable {
    private let state = Mutex<(next: Int, channels: [Int: any Channel], closing: Bool)>((1, [:], false))

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

    /// Stops reading on every connection: each finishes its current request, answers it, and closes.
    func closeAllInputs() {
        let channels = state.withLock { s in
            s.closing = true
            return Array(s.channels.values)
        }
        for c in channels {
            c.close(mode: .input).whenFailure { _ in c.close(promise: nil) }
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
