import BlazeCrypto
import BlazeWire
import NIOCore
import NIOEmbedded
import BlazeTestSupport
import Testing

/// Records what a `HandshakeHandler` reports; as a server, it answers a proof with a verdict the test gives later
/// (as the relay does while it reads a space's log).
final class RecordingDelegate: HandshakeDelegate {
    let key: SpaceKey
    /// The proof, accepted against `key` (nil: it did not verify), and the verdict's promise.
    var accepted: Handshake.Accepted?
    var verdict: EventLoopPromise<HandshakeVerdict>?
    var failures: [HandshakeFailure] = []
    var started = 0

    init(key: SpaceKey) { self.key = key }

    func accept(_ auth: [UInt8], with server: Handshake.Server, context: ChannelHandlerContext) -> HandshakeVerdict {
        accepted = try? server.accept(auth, spaces: [key])
        let promise = context.eventLoop.makePromise(of: HandshakeVerdict.self)
        verdict = promise
        return .later(promise.futureResult)
    }

    func established(_ link: EstablishedLink, context: ChannelHandlerContext) throws -> [any ChannelHandler] { [] }
    func started(_ link: EstablishedLink, context: ChannelHandlerContext) { started += 1 }
    func failed(_ failure: HandshakeFailure, context: ChannelHandlerContext) { failures.append(failure) }
}

/// The shared handshake handler while its server side waits for a verdict: nothing is kept or admitted that a
/// client could not have sent, or after the connection ended.
@Suite struct WireHandshakeTests {
    let key = SpaceKey.generate()
    let timeout = TimeAmount.seconds(5)

    /// A server and a client whose client has sent its proof: the server is deciding.
    func deciding() throws -> (server: EmbeddedChannel, client: EmbeddedChannel, s: RecordingDelegate, c: RecordingDelegate) {
        let s = RecordingDelegate(key: key), c = RecordingDelegate(key: key)
        let server = try active([HandshakeHandler(server: DeviceIdentity(), timeout: timeout, delegate: s)])
        let client = try active([HandshakeHandler(client: key, identity: DeviceIdentity(), timeout: timeout, delegate: c)])
        try client.writeInbound(try #require(try server.readOutbound(as: ByteBuffer.self)))  // hello
        try server.writeInbound(try #require(try client.readOutbound(as: ByteBuffer.self)))  // proof
        #expect(s.verdict != nil && s.accepted != nil)
        return (server, client, s, c)
    }

    @Test func aVerdictGivenLaterEstablishesBothSides() throws {
        let (server, client, s, c) = try deciding()
        #expect(try server.readOutbound(as: ByteBuffer.self) == nil, "no reply before the verdict")
        s.verdict?.succeed(.accepted(try #require(s.accepted)))
        try client.writeInbound(try #require(try server.readOutbound(as: ByteBuffer.self)))
        #expect(s.started == 1 && c.started == 1 && s.failures.isEmpty && c.failures.isEmpty)
        #expect(server.isActive && client.isActive)
    }

    /// A client cannot seal before the server's reply: bytes past its proof while the server decides are refused at
    /// once, not buffered, and the verdict that comes later admits nothing.
    @Test func bytesPastTheProofWhileTheServerDecidesAreRefused() throws {
        let (server, _, s, _) = try deciding()
        try server.writeInbound(ByteBuffer(bytes: [UInt8](repeating: 7, count: 64 << 10)))
        #expect(!server.isActive && s.failures == [.rejected(.badFrame, .awaitingAuth)])
        s.verdict?.succeed(.accepted(try #require(s.accepted)))
        #expect(try server.readOutbound(as: ByteBuffer.self) == nil && s.started == 0)
    }

    /// The deadline covers the wait for a verdict; one that comes after it admits nothing.
    @Test func aVerdictAfterTheDeadlineAdmitsNothing() throws {
        let (server, _, s, _) = try deciding()
        server.embeddedEventLoop.advanceTime(by: timeout)
        #expect(!server.isActive && s.failures == [.timedOut(.awaitingAuth)])
        s.verdict?.succeed(.accepted(try #require(s.accepted)))
        #expect(try server.readOutbound(as: ByteBuffer.self) == nil && s.started == 0)
    }

    /// A refusal closes without a word; a peer closing while the server decides is reported once.
    @Test func refusalsAndClosesWhileDecidingAreReportedOnce() throws {
        let (server, _, s, _) = try deciding()
        s.verdict?.succeed(.refused)
        #expect(!server.isActive && s.failures == [.refused] && s.started == 0)
        #expect(try server.readOutbound(as: ByteBuffer.self) == nil)

        let (other, _, o, _) = try deciding()
        other.pipeline.fireChannelInactive()
        #expect(o.failures == [.closedByPeer(.awaitingAuth)])
        o.verdict?.succeed(.accepted(try #require(o.accepted)))
        #expect(o.started == 0 && o.failures.count == 1)
        _ = try? other.finish(acceptAlreadyClosed: true)
    }
}
