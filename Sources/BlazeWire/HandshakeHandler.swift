import BlazeCrypto
import NIOCore

/// Where a handshake stands when it fails.
public enum HandshakePhase: Sendable, Equatable {
    /// Client: waiting for the server's hello.
    case awaitingHello
    /// Client: waiting for the server's proof.
    case awaitingReply
    /// Server: waiting for the client's proof.
    case awaitingAuth
}

/// Why a handshake ended without a session.
public enum HandshakeFailure: Sendable, Equatable {
    /// Not finished within the deadline.
    case timedOut(HandshakePhase)
    /// A frame or proof that does not verify.
    case rejected(SyncRejection, HandshakePhase)
    /// Server: the delegate refused a proof that verified (no served space, no place left).
    case refused
    /// The peer closed the connection first.
    case closedByPeer(HandshakePhase)
    /// The two sides share no protocol version: a server learns it once the client's proof holds, a client once the
    /// server's does; or the server's hello is of another handshake version (which cannot be verified).
    case incompatible(ProtocolMismatch, HandshakePhase)
}

/// A server's answer to a client's proof: now, refused, or once something it waits for (a store read) is done.
public enum HandshakeVerdict: Sendable {
    /// Accepted: the reply goes to the client and the session starts.
    case accepted(Handshake.Accepted)
    /// Refused: the connection closes without a word.
    case refused
    /// The client proved a key served here but shares no protocol version with this side (`Accepted.mismatch`): the
    /// reply goes to the client, so that it can verify this side before it believes the mismatch, then the
    /// connection closes, reported as the mismatch.
    case incompatible(Handshake.Accepted)
    /// Decided later, on the connection's event loop.
    case later(EventLoopFuture<HandshakeVerdict>)
}

/// A handshake that succeeded: the space, the device at the other end (proven by its signature) and the session's
/// cipher.
public struct EstablishedLink: Sendable {
    /// The space whose capability both ends proved.
    public let space: SpaceKey
    /// The device at the other end.
    public let device: DevicePublicKeys
    /// The session's cipher.
    public let cipher: SessionCipher
    /// The protocol version both sides agreed on (SYNC.md §8, "Versions").
    public let protocolVersion: UInt8
}

/// What a `HandshakeHandler` asks of the side it runs for, on the connection's event loop.
public protocol HandshakeDelegate: AnyObject {
    /// Server: decides on a client's proof (`auth`), with `server` to check it against the spaces served.
    func accept(_ auth: [UInt8], with server: Handshake.Server, context: ChannelHandlerContext) -> HandshakeVerdict
    /// The handshake succeeded: returns the handlers that carry the session, put right after the handshake handler
    /// (which then leaves the pipeline and hands them any bytes the peer sent past the handshake). Throwing closes the
    /// connection.
    func established(_ link: EstablishedLink, context: ChannelHandlerContext) throws -> [any ChannelHandler]
    /// The session's handlers are in place and the handshake handler is about to leave: the moment to announce the
    /// link down the pipeline.
    func started(_ link: EstablishedLink, context: ChannelHandlerContext)
    /// The handshake failed; the connection is closed right after.
    func failed(_ failure: HandshakeFailure, context: ChannelHandlerContext)
}

/// Runs the peer handshake (SYNC.md §8, "Handshake") over length-prefixed frames within a deadline, then steps
/// aside for the session's handlers: the one definition both ends use (a daemon's links, the relay, blazebench's
/// simulated devices).
///
/// Each handshake frame must have exactly its message's length (a client reads a hello of 5 to 1,024 bytes far enough
/// to name another handshake version); anything else is refused at once. A close made on this side is nobody's
/// refusal: it is not reported.
public final class HandshakeHandler: ChannelDuplexHandler, RemovableChannelHandler {
    public typealias InboundIn = ByteBuffer
    public typealias InboundOut = ByteBuffer
    public typealias OutboundIn = ByteBuffer
    public typealias OutboundOut = ByteBuffer

    private enum State {
        case awaitingHello(Handshake.Client)
        case awaitingReply(Handshake.Client)
        case awaitingAuth(Handshake.Server)
        /// Server: the delegate is deciding on a proof.
        case deciding
        case done
    }

    private let delegate: any HandshakeDelegate
    private var state: State
    /// Client: the space whose capability it proves.
    private let clientKey: SpaceKey?
    private let timeout: TimeAmount
    /// Bytes read but not yet consumed.
    private var pending = ByteBuffer()
    private var deadline: Scheduled<Void>?

    /// The connecting side, proving `key`'s capability as `identity`, finished within `timeout`, speaking `protocols`.
    public init(
        client key: SpaceKey, identity: DeviceIdentity, timeout: TimeAmount, delegate: any HandshakeDelegate,
        protocols: ClosedRange<UInt8> = Handshake.protocols
    ) {
        self.state = .awaitingHello(Handshake.Client(key: key, identity: identity, protocols: protocols))
        self.clientKey = key
        self.timeout = timeout
        self.delegate = delegate
    }

    /// The accepting side as `identity`, speaking `protocols`: the delegate decides which served space a client's
    /// proof is for.
    public init(
        server identity: DeviceIdentity, timeout: TimeAmount, delegate: any HandshakeDelegate,
        protocols: ClosedRange<UInt8> = Handshake.protocols
    ) {
        self.state = .awaitingAuth(Handshake.Server(identity: identity, protocols: protocols))
        self.clientKey = nil
        self.timeout = timeout
        self.delegate = delegate
    }

    public func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { start(context: context) }
    }

    public func channelActive(context: ChannelHandlerContext) {
        start(context: context)
        context.fireChannelActive()
    }

    /// Sends the server's hello and arms the deadline, once.
    private func start(context: ChannelHandlerContext) {
        guard deadline == nil else { return }
        if case .awaitingAuth(let server) = state {
            context.writeAndFlush(wrapOutboundOut(HandshakeFrame.encode(server.hello)), promise: nil)
        }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        deadline = context.eventLoop.scheduleTask(in: timeout) {
            let (handler, context) = bound.value
            guard let phase = handler.phase else { return }
            handler.fail(.timedOut(phase), context: context)
        }
    }

    /// The phase a failure now happens in; nil once the handshake is over.
    private var phase: HandshakePhase? {
        switch state {
        case .awaitingHello: .awaitingHello
        case .awaitingReply: .awaitingReply
        case .awaitingAuth, .deciding: .awaitingAuth
        case .done: nil
        }
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        switch state {
        case .done:
            // Established and not yet out of the pipeline: kept for the session. Closed: dropped.
            if context.channel.isActive { pending.writeBuffer(&bytes) }
        case .deciding:
            // A client cannot seal anything before the server's reply: bytes past its proof while the server decides
            // are not a client's, and are not kept (a stranger could otherwise fill memory while a store is read).
            guard bytes.readableBytes == 0 else { return fail(.rejected(.badFrame, .awaitingAuth), context: context) }
        case .awaitingHello, .awaitingReply, .awaitingAuth:
            pending.writeBuffer(&bytes)
            drain(context: context)
        }
    }

    /// Takes every complete handshake frame read so far.
    private func drain(context: ChannelHandlerContext) {
        do throws(SyncRejection) {
            while true {
                switch state {
                case .done, .deciding:
                    return
                case .awaitingHello(var client):
                    guard let hello = try nextFrame(size: Handshake.helloSize, orOtherHello: true) else { return }
                    if let other = client.otherHandshake(hello) { return fail(.incompatible(other, .awaitingHello), context: context) }
                    let auth = try client.respond(to: hello)
                    state = .awaitingReply(client)
                    context.writeAndFlush(wrapOutboundOut(HandshakeFrame.encode(auth)), promise: nil)
                case .awaitingReply(let client):
                    guard let reply = try nextFrame(size: Handshake.replySize), let key = clientKey else { return }
                    let device: DevicePublicKeys, cipher: SessionCipher, version: UInt8
                    do throws(SyncRejection) { (device, cipher, version) = try client.finish(reply) } catch {
                        guard error == .incompatibleProtocol, let mismatch = client.mismatch else { throw error }
                        return fail(.incompatible(mismatch, .awaitingReply), context: context)
                    }
                    establish(EstablishedLink(space: key, device: device, cipher: cipher, protocolVersion: version), context: context)
                case .awaitingAuth(let server):
                    guard let auth = try nextFrame(size: Handshake.authSize) else { return }
                    state = .deciding
                    decide(delegate.accept(auth, with: server, context: context), context: context)
                }
            }
        } catch {
            if let phase { fail(.rejected(error, phase), context: context) }
        }
    }

    /// Acts on the delegate's verdict: answers and establishes, refuses, or waits for it.
    private func decide(_ verdict: HandshakeVerdict, context: ChannelHandlerContext) {
        guard case .deciding = state else { return }
        switch verdict {
        case .accepted(let accepted):
            context.writeAndFlush(wrapOutboundOut(HandshakeFrame.encode(accepted.reply)), promise: nil)
            establish(
                EstablishedLink(
                    space: accepted.space, device: accepted.device, cipher: accepted.session,
                    protocolVersion: accepted.protocolVersion),
                context: context)
        case .refused:
            fail(.refused, context: context)
        case .incompatible(let accepted):
            // The reply first, then the close once it is written.
            let mismatch = accepted.mismatch ?? ProtocolMismatch(ours: Handshake.protocols, theirs: 4...4)
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            context.writeAndFlush(wrapOutboundOut(HandshakeFrame.encode(accepted.reply))).whenComplete { _ in
                let (handler, context) = bound.value
                handler.fail(.incompatible(mismatch, .awaitingAuth), context: context)
            }
        case .later(let future):
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            future.hop(to: context.eventLoop).whenComplete { result in
                let (handler, context) = bound.value
                switch result {
                case .success(let verdict): handler.decide(verdict, context: context)
                case .failure: handler.decide(.refused, context: context)
                }
            }
        }
    }

    /// The next handshake message if it has fully arrived; a frame of any other length is refused at once, except
    /// that `orOtherHello` takes a frame of 5 to 1,024 bytes, so that a hello of another handshake version (which
    /// may have another size) is told apart from damage (`Handshake.Client.mismatch`).
    private func nextFrame(size: Int, orOtherHello: Bool = false) throws(SyncRejection) -> [UInt8]? {
        guard let length = pending.getInteger(at: pending.readerIndex, as: UInt32.self) else { return nil }
        guard Int(length) == size || (orOtherHello && (5...1024).contains(length)) else { throw .badFrame }
        guard pending.readableBytes >= 4 + Int(length) else { return nil }
        pending.moveReaderIndex(forwardBy: 4)
        return pending.readBytes(length: Int(length))
    }

    /// Reports a failure and closes the connection.
    private func fail(_ failure: HandshakeFailure, context: ChannelHandlerContext) {
        guard phase != nil else { return }
        state = .done
        deadline?.cancel()
        pending.clear()
        delegate.failed(failure, context: context)
        context.close(promise: nil)
    }

    /// Installs the session's handlers after this one and leaves the pipeline.
    private func establish(_ link: EstablishedLink, context: ChannelHandlerContext) {
        state = .done
        deadline?.cancel()
        do {
            let handlers = try delegate.established(link, context: context)
            try context.pipeline.syncOperations.addHandlers(handlers, position: .after(self))
        } catch {
            context.close(promise: nil)
            return
        }
        delegate.started(link, context: context)
        context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
    }

    /// Leaving the pipeline: bytes the peer sent past the handshake go to the session's handlers.
    public func removeHandler(context: ChannelHandlerContext, removalToken: ChannelHandlerContext.RemovalToken) {
        deadline?.cancel()
        if pending.readableBytes > 0 {
            let rest = pending
            pending = ByteBuffer()
            context.fireChannelRead(wrapInboundOut(rest))
            context.fireChannelReadComplete()
        }
        context.leavePipeline(removalToken: removalToken)
    }

    /// A close made on this side (a link stopped, shutdown) is nobody's refusal: nothing is reported.
    public func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        if mode == .all { state = .done }
        context.close(mode: mode, promise: promise)
    }

    public func channelInactive(context: ChannelHandlerContext) {
        deadline?.cancel()
        if let phase {
            state = .done
            delegate.failed(.closedByPeer(phase), context: context)
        }
        context.fireChannelInactive()
    }
}
