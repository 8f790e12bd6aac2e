import BlazeCrypto
import BlazeProtocol
import BlazeSync
import BlazeWire
import Foundation
import NIOCore
import NIOPosix
import Synchronization

/// One scripted device for the ABUSE workloads: the handshake's client side (`HandshakeHandler`, as a daemon's links
/// run it), then the messages it is given, each written once the one before it was (so a peer that stops reading
/// holds at most one of them), and a record of what came back.
final class ProbeDevice: ChannelInboundHandler, DialingDevice, @unchecked Sendable {
    // @unchecked Sendable: the mutable members are touched on the channel's event loop only; `seen` is a Mutex.
    typealias InboundIn = PeerMessage
    typealias OutboundOut = [UInt8]

    /// What a probe saw: whether its handshake finished and its connection closed, the operations (their hashes, and
    /// the first 10,000 whole) and entries the other end sent, its `ERROR` reason, and how many messages it wrote.
    struct Seen: Sendable {
        var established = false, closed = false
        var ops = Set<EntryHash>()
        var log: [MembershipOp] = []
        var entries = 0
        var error: String?
        var written = 0
    }

    let key: SpaceKey
    let identity: DeviceIdentity
    private var script: [[UInt8]]
    private var context: ChannelHandlerContext?
    private let seen = Mutex(Seen())
    /// The connection, when the caller keeps it here.
    var channel: (any Channel)? {
        get { kept.withLock { $0 } }
        set { kept.withLock { $0 = newValue } }
    }
    private let kept = Mutex<(any Channel)?>(nil)

    /// A probe proving `key` as `identity`, that sends `script` once established.
    convenience init(key: SpaceKey, identity: DeviceIdentity, script: [PeerMessage]) throws {
        self.init(key: key, identity: identity, encoded: try script.map { try $0.encoded() })
    }

    /// A probe that sends messages already encoded (copies of one array share its storage).
    init(key: SpaceKey, identity: DeviceIdentity, encoded: [[UInt8]]) {
        self.key = key
        self.identity = identity
        self.script = encoded.reversed()
    }

    /// What it saw so far.
    var state: Seen { seen.withLock { $0 } }

    /// Connects to `127.0.0.1:port`: over TCP, or over a WebSocket at `path` whose request carries `forwardedFor` as
    /// its `X-Forwarded-For` (a client behind a trusted proxy).
    func connect(port: Int, path: String? = nil, forwardedFor: String? = nil) async throws -> any Channel {
        let probe = self
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(10))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let handlers: @Sendable (any Channel) throws -> Void = { channel in
                        try channel.pipeline.syncOperations.addHandlers([
                            HandshakeHandler(client: probe.key, identity: probe.identity, timeout: .seconds(30), delegate: probe),
                            probe,
                        ])
                    }
                    guard let path else { return try handlers(channel) }
                    try WebSocketClient.configure(
                        channel, host: "127.0.0.1", port: port, path: path,
                        headers: forwardedFor.map { [("X-Forwarded-For", $0)] } ?? [],
                        refused: { _ in probe.seen.withLock { $0.closed = true } }, upgraded: handlers)
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        // Closed before the upgrade or the handshake finished, this handler never joins the pipeline.
        channel.closeFuture.whenComplete { _ in probe.seen.withLock { $0.closed = true } }
        return channel
    }

    /// Sends `message` now (after what is still queued).
    func send(_ message: PeerMessage, on channel: any Channel) throws {
        let bytes = try message.encoded()
        channel.eventLoop.execute {
            self.script.insert(bytes, at: 0)
            if let context = self.context, self.state.established, self.script.count == 1 { self.writeNext(context: context) }
        }
    }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func channelInactive(context: ChannelHandlerContext) {
        seen.withLock { $0.closed = true }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) { context.close(promise: nil) }

    // MARK: Handshake

    func started(_ link: EstablishedLink, context: ChannelHandlerContext) {
        seen.withLock { $0.established = true }
        // `context` is the handshake handler's: this device writes from its own, above the sealed-frame encoder.
        guard let own = self.context else { return }
        writeNext(context: own)
        // A `PING` every 10 s, as a daemon's quiet link sends, so the other end's silence limit never closes it.
        let bound = NIOLoopBound((self, own), eventLoop: own.eventLoop)
        let ping = try? PeerMessage.ping.encoded()
        let task = own.eventLoop.scheduleRepeatedTask(initialDelay: .seconds(10), delay: .seconds(10)) { _ in
            let (probe, context) = bound.value
            if let ping, probe.script.isEmpty { context.writeAndFlush(probe.wrapOutboundOut(ping), promise: nil) }
        }
        own.channel.closeFuture.whenComplete { _ in task.cancel() }
    }

    func failed(_ failure: HandshakeFailure, context: ChannelHandlerContext) { seen.withLock { $0.closed = true } }

    // MARK: Session

    private func writeNext(context: ChannelHandlerContext) {
        guard let bytes = script.popLast() else { return }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        context.writeAndFlush(wrapOutboundOut(bytes)).whenSuccess {
            let (probe, context) = bound.value
            probe.seen.withLock { $0.written += 1 }
            probe.writeNext(context: context)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .members(let ops):
            seen.withLock { s in
                for op in ops where s.ops.insert(op.hash).inserted && s.log.count < 10_000 { s.log.append(op) }
            }
        case .entries(let batch): seen.withLock { $0.entries += batch.entries.count }
        case .error(let reason): seen.withLock { $0.error = reason }
        default: break
        }
    }
}

/// A simulated device that only dials: it answers no handshake, and its session is the sealed framing and message
/// decoding every end runs.
protocol DialingDevice: HandshakeDelegate {}

extension DialingDevice {
    func accept(_ auth: [UInt8], with server: Handshake.Server, context: ChannelHandlerContext) -> HandshakeVerdict { .refused }

    func established(_ link: EstablishedLink, context: ChannelHandlerContext) throws -> [any ChannelHandler] {
        [
            ByteToMessageHandler(SealedFrameDecoder(opener: link.cipher.opener, counters: nil)),
            MessageToByteHandler(SealedFrameEncoder(sealer: link.cipher.sealer, counters: nil)),
            PeerMessageDecoder(),
        ]
    }
}

/// Waits (polling, at most `timeout`) until `condition` holds; throws naming `what` when it does not.
func waitFor(_ what: String, timeout: Duration = .seconds(120), _ condition: () throws -> Bool) throws {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try condition() { return }
        usleep(5_000)
    }
    throw BenchFailure("ABUSE: \(what) did not happen within \(timeout)")
}
