import BlazeCrypto
import BlazeStore
import BlazeWire
import NIOCore

/// Runs the peer handshake (SYNC.md, "Peer handshake") over plain length-prefixed frames, within the handshake
/// timeout, then steps aside.
///
/// Each handshake frame must have exactly its message's length; anything else is refused at once. An inbound
/// connection that proves no key served here (or none in time) is closed without a word and counted as a stranger;
/// an outbound link whose peer answers wrongly counts the reason on that peer's status. On success the handler puts
/// the session's handlers (`SyncPipeline.session`) in its place, fires `SyncLinkEstablished`, and hands them any bytes
/// the peer sent past the handshake.
final class HandshakeHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private enum State {
        /// Outbound: waiting for the server's hello.
        case awaitingHello(Handshake.Client)
        /// Outbound: waiting for the server's proof.
        case awaitingReply(Handshake.Client)
        /// Inbound: waiting for the client's proof.
        case awaitingAuth(Handshake.Server)
        case done
    }

    let engine: SyncEngine
    let report: LinkReport
    private var state: State
    /// Outbound: the space the link serves.
    private let space: SharedSpace?
    /// Fired once the handshake succeeds (outbound links reset their backoff).
    private let onEstablished: (() -> Void)?
    /// Bytes read but not yet consumed.
    private var pending = ByteBuffer()
    private var deadline: Scheduled<Void>?

    /// The connecting side of a link serving `space`, proving its capability.
    init(engine: SyncEngine, report: LinkReport, space: SharedSpace, onEstablished: (() -> Void)? = nil) {
        self.engine = engine
        self.report = report
        self.space = space
        self.onEstablished = onEstablished
        self.state = .awaitingHello(Handshake.Client(key: space.key, identity: engine.identity))
    }

    /// The accepting side: the client's proof decides which served database the connection is for.
    init(engine: SyncEngine, report: LinkReport) {
        self.engine = engine
        self.report = report
        self.space = nil
        self.onEstablished = nil
        self.state = .awaitingAuth(Handshake.Server(identity: engine.identity))
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { start(context: context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        start(context: context)
        context.fireChannelActive()
    }

    /// Sends the server's hello and arms the deadline, once.
    private func start(context: ChannelHandlerContext) {
        guard deadline == nil else { return }
        if case .awaitingAuth(let server) = state {
            context.writeAndFlush(wrapOutboundOut(Self.frame(server.hello)), promise: nil)
        }
        // The handshake has its own, short deadline (a stranger holding a connection open gains nothing).
        let limit = engine.handshakeTimeout
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        deadline = context.eventLoop.scheduleTask(in: limit) {
            let (handler, context) = bound.value
            handler.timedOut(after: limit, context: context)
        }
    }

    private func timedOut(after limit: TimeAmount, context: ChannelHandlerContext) {
        switch state {
        case .done:
            return
        case .awaitingAuth:
            engine.strangersRefused.add(1, ordering: .relaxed)
        case .awaitingHello, .awaitingReply:
            report.update { $0.errors += 1; $0.lastError = "timed out: handshake not finished within \(limit.nanoseconds / 1_000_000) ms" }
        }
        engine.logger.info("Sync connection timed out", metadata: ["db": "\(report.db ?? "-")", "peer": "\(report.peer)"])
        state = .done
        context.close(promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        guard case .done = state else {
            pending.writeBuffer(&bytes)
            do {
                try drain(context: context)
            } catch {
                refuse(error, context: context)
            }
            return
        }
        // Closed, or established and not yet out of the pipeline: bytes after a refusal are dropped.
        if context.channel.isActive { pending.writeBuffer(&bytes) }
    }

    /// Takes every complete handshake frame read so far.
    private func drain(context: ChannelHandlerContext) throws(SyncRejection) {
        while true {
            switch state {
            case .done:
                return
            case .awaitingHello(var client):
                guard let hello = try nextFrame(size: Handshake.helloSize) else { return }
                let auth = try client.respond(to: hello)
                state = .awaitingReply(client)
                context.writeAndFlush(wrapOutboundOut(Self.frame(auth)), promise: nil)
            case .awaitingReply(let client):
                guard let reply = try nextFrame(size: Handshake.replySize), let space else { return }
                let (device, cipher) = try client.finish(reply)
                try establish(space: space, device: device, cipher: cipher, context: context)
            case .awaitingAuth(let server):
                guard let auth = try nextFrame(size: Handshake.authSize) else { return }
                let spaces = engine.servedSpaces()
                let accepted = try server.accept(auth, spaces: spaces.map(\.key))
                guard let space = spaces.first(where: { $0.id == accepted.space.id }) else { throw .badFrame }
                context.writeAndFlush(wrapOutboundOut(Self.frame(accepted.reply)), promise: nil)
                try establish(space: space, device: accepted.device, cipher: accepted.session, context: context)
            }
        }
    }

    /// The next handshake message if it has fully arrived; a frame of any other length is refused at once.
    private func nextFrame(size: Int) throws(SyncRejection) -> [UInt8]? {
        guard let length = pending.getInteger(at: pending.readerIndex, as: UInt32.self) else { return nil }
        guard Int(length) == size else { throw .badFrame }
        guard pending.readableBytes >= 4 + size else { return nil }
        pending.moveReaderIndex(forwardBy: 4)
        return pending.readBytes(length: size)
    }

    /// A failed handshake: an inbound stranger (or a peer of a paused database) is closed without a word; an outbound
    /// link counts the reason on its peer.
    private func refuse(_ reason: SyncRejection, context: ChannelHandlerContext) {
        if case .awaitingAuth = state {
            engine.strangersRefused.add(1, ordering: .relaxed)
        } else {
            report.reject(reason)
            engine.logger.warning(
                "Sync rejected", metadata: ["db": "\(report.db ?? "-")", "peer": "\(report.peer)", "reason": "\(reason.rawValue)"])
        }
        state = .done
        pending.clear()
        context.close(promise: nil)
    }

    /// Installs the session handlers after this one, announces the link, and leaves the pipeline. (A device the space
    /// removed gets a session only to receive the proof of its removal: `SyncSession.startMembership`.)
    private func establish(
        space: SharedSpace, device: DevicePublicKeys, cipher: SessionCipher, context: ChannelHandlerContext
    ) throws(SyncRejection) {
        state = .done
        deadline?.cancel()
        report.db = space.db.name
        do {
            try context.pipeline.syncOperations.addHandlers(
                SyncPipeline.session(engine: engine, cipher: cipher, report: report), position: .after(self))
        } catch {
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(SyncLinkEstablished(space: space, device: device))
        onEstablished?()
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
    }

    /// Leaving the pipeline: bytes the peer sent past the handshake go to the session's frame decoder.
    func removeHandler(context: ChannelHandlerContext, removalToken: ChannelHandlerContext.RemovalToken) {
        deadline?.cancel()
        if pending.readableBytes > 0 {
            let rest = pending
            pending = ByteBuffer()
            context.fireChannelRead(wrapInboundOut(rest))
            context.fireChannelReadComplete()
        }
        context.leavePipeline(removalToken: removalToken)
    }

    /// A close made on this side (a link stopped, a peer removed, shutdown) is nobody's refusal: nothing is reported.
    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        if mode == .all { state = .done }
        context.close(mode: mode, promise: promise)
    }

    func channelInactive(context: ChannelHandlerContext) {
        deadline?.cancel()
        // An outbound link the peer closed mid-handshake says why it most likely did: a member closes silently on a
        // proof of a space it does not serve, so "refused" is told apart from "unreachable" (a failed connect).
        switch state {
        case .awaitingHello:
            report.update {
                $0.errors += 1
                $0.lastError = "closed by the peer before its hello: over its connection limits, or not a BlazeDB sync listener"
            }
        case .awaitingReply:
            report.update {
                $0.errors += 1
                $0.lastError =
                    "refused by the peer: it closed the handshake after this device's proof, so it serves no space with "
                    + "this key (it does not hold the database, paused its sync or is stopping, removed this device, or "
                    + "is a relay not given this space's capability)"
            }
        case .awaitingAuth, .done:
            break
        }
        state = .done
        context.fireChannelInactive()
    }

    /// A handshake frame (`HandshakeFrame.encode`).
    static func frame(_ body: [UInt8]) -> ByteBuffer { HandshakeFrame.encode(body) }
}
