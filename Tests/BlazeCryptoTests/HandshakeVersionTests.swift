import BlazeProtocol
import Crypto
import Foundation
import Testing

@testable import BlazeCrypto

/// Protocol versions chosen inside the handshake (SYNC.md §8, "Versions"): each side's nonce announces its range, the
/// highest version both speak is used, the announcement is bound by the proofs, and sides that share none are told
/// which versions each speaks.
@Suite struct HandshakeVersionTests {
    @Test func bothSidesUseTheHighestVersionTheyShare() throws {
        let key = SpaceKey.generate()
        let cases: [(server: ClosedRange<UInt8>, client: ClosedRange<UInt8>, agreed: UInt8)] = [
            (Handshake.protocols, Handshake.protocols, Handshake.protocols.upperBound),
            (4...4, Handshake.protocols, 4), (Handshake.protocols, 4...4, 4), (4...7, 5...6, 6), (5...9, 4...5, 5),
        ]
        for (server, client, agreed) in cases {
            let run = try HandshakeRun(key: key, serverProtocols: server, clientProtocols: client)
            let accepted = try run.server.accept(run.auth, spaces: [key])
            let (_, clientSession, version) = try run.client.finish(accepted.reply)
            #expect(version == agreed && accepted.protocolVersion == agreed, "server \(server), client \(client)")
            var c = clientSession, s = accepted.session
            #expect(c.sealer.version == agreed && s.opener.version == agreed)
            let message = Array("hello at \(agreed)".utf8)
            #expect(try s.openFrame(c.seal(message)[...]) == message)
        }
    }

    @Test func aNonceWithoutTheAnnouncementIsAProtocol4Build() {
        // A build that speaks protocol 4 only draws all 32 bytes at random.
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<1000 {
            let nonce = (0..<32).map { _ in UInt8.random(in: 0...255, using: &rng) }
            #expect(Handshake.announced(in: nonce[...]) == 4...4)
        }
        #expect(Handshake.announced(in: Handshake.nonce(announcing: 4...9)[...]) == 4...9)
        // An impossible range (below 4, or empty) is not believed.
        for (low, high) in [(3, 5), (6, 5), (0, 0)] as [(UInt8, UInt8)] {
            #expect(Handshake.announced(in: (Handshake.announcement + [low, high] + [UInt8](repeating: 7, count: 24))[...]) == 4...4)
        }
    }

    @Test func sidesThatShareNoVersionAreToldWhichEachSpeaksOnceEachVerifiedTheOther() throws {
        let key = SpaceKey.generate()
        // A newer server (speaking 7 only) and a client of this build: the client answers anyway, the server finds
        // the mismatch once the client's proof holds and still replies, and the client believes it once the
        // server's proof over the hello holds.
        let run = try HandshakeRun(key: key, serverProtocols: 7...7)
        let accepted = try run.server.accept(run.auth, spaces: [key])
        #expect(accepted.protocolVersion == 0)
        let serverSide = try #require(accepted.mismatch)
        #expect(serverSide == ProtocolMismatch(ours: 7...7, theirs: Handshake.protocols))
        #expect(serverSide.description.hasSuffix("the peer speaks sync protocol 4–6, this build speaks sync protocol 7: the peer must upgrade"))
        var client = run.client
        #expect(throws: SyncRejection.incompatibleProtocol) { try client.finish(accepted.reply) }
        client = run.client
        let clientSide = try #require(client.mismatch)
        #expect(clientSide == ProtocolMismatch(ours: Handshake.protocols, theirs: 7...7))
        #expect(clientSide.description.contains("peer speaks sync protocol 7, this build speaks sync protocol 4–6"))
        #expect(clientSide.description.hasSuffix("upgrade this device"))

        // A stranger announcing a newer range gets no such words from this build: its reply does not verify.
        let strangerServer = Handshake.Server(identity: DeviceIdentity(), protocols: 9...9)
        var c = Handshake.Client(key: key, identity: DeviceIdentity())
        _ = try c.respond(to: strangerServer.hello)
        #expect(throws: SyncRejection.badFrame) { try c.finish([UInt8](repeating: 1, count: Handshake.replySize)) }
        // A stranger's AUTH with any range is refused before ranges are looked at.
        var liar = Handshake.Client(key: SpaceKey.generate(), identity: DeviceIdentity(), protocols: 4...9, announcing: 9...9)
        let server = Handshake.Server(identity: DeviceIdentity())
        #expect(throws: SyncRejection.badFrame) { try server.accept(try liar.respond(to: server.hello), spaces: [key]) }
        // An older side (4 only) reaching a server that dropped 4: "the peer must upgrade", on the server.
        var older = Handshake.Client(key: key, identity: DeviceIdentity(), protocols: 4...6, announcing: 4...4)
        let newerServer = Handshake.Server(identity: DeviceIdentity(), protocols: 5...6)
        let old = try newerServer.accept(try older.respond(to: newerServer.hello), spaces: [key])
        #expect(old.mismatch?.description.hasSuffix("the peer must upgrade") == true)
    }

    @Test func aHelloOfAnotherHandshakeVersionNamesIt() {
        var client = Handshake.Client(key: SpaceKey.generate(), identity: DeviceIdentity())
        // A later handshake may change the hello's size: the version byte is read whatever the size.
        for hello in [Handshake.magic + [5] + [UInt8](repeating: 1, count: 100), Handshake.magic + [9]] {
            let mismatch = client.otherHandshake(hello)
            #expect(mismatch == ProtocolMismatch(ours: Handshake.protocols, handshake: hello[4]))
            // Nothing in it can be verified, and the words say so.
            #expect(mismatch?.description.contains("hello says its handshake is version \(hello[4]), this build's is 4") == true)
            #expect(mismatch?.description.contains("can be verified: if the peer is yours") == true)
            #expect(throws: SyncRejection.badFrame) { try client.respond(to: hello) }
        }
        // Not a BlazeDB hello at all, or one of this version: no other handshake.
        #expect(client.otherHandshake(Array("HTTP/1.1 200 OK".utf8)) == nil)
        #expect(client.otherHandshake(Handshake.Server(identity: DeviceIdentity()).hello) == nil)
    }

    @Test func aDowngradedAnnouncementFailsTheProofs() throws {
        let key = SpaceKey.generate()
        let server = Handshake.Server(identity: DeviceIdentity())
        // Someone on the path rewrites the server's announced range to 4 only, so that the sides speak 4.
        var hello = server.hello
        let high = 5 + Handshake.announcement.count + 1
        #expect(hello[high] == Handshake.protocols.upperBound)
        hello[high] = 4
        var client = Handshake.Client(key: key, identity: DeviceIdentity())
        let auth = try client.respond(to: hello)
        // The client's proof covers the hello it saw, so the server refuses it.
        #expect(throws: SyncRejection.badFrame) { try server.accept(auth, spaces: [key]) }
        // The same for the client's announcement: the server's reply covers the AUTH it saw.
        let run = try HandshakeRun(key: key)
        var altered = run.auth
        altered[Handshake.announcement.count + 1] = 4
        #expect(throws: SyncRejection.badFrame) { try run.server.accept(altered, spaces: [key]) }
    }

    @Test func aProtocol5FrameCarriesAClearPartItsTagAuthenticates() throws {
        let key = SpaceKey.generate()
        let run = try HandshakeRun(key: key)
        let accepted = try run.server.accept(run.auth, spaces: [key])
        var sender = try run.client.finish(accepted.reply).session.sealer
        let receiver = accepted.session.opener
        let plain: [UInt8] = [12] + [UInt8](repeating: 0xAB, count: 32)
        let clear = (0..<300).map { UInt8($0 & 0xFF) }
        var frame: [UInt8] = []
        sender.seal(plain[...], clear: clear[...]) { frame += $0 }
        #expect(frame.count == sender.overhead + plain.count + clear.count)
        // The clear part is on the wire as is; the plaintext is not.
        #expect(Array(frame.suffix(clear.count)) == clear)
        #expect(!hexString(frame).contains(hexString(Array(plain.suffix(16)))))
        var r = receiver
        #expect(try r.openFrame(frame[...]) == plain + clear)
        // Every bit flip in the clear part (and anywhere else) is refused.
        for bit in stride(from: 0, to: frame.count * 8, by: 7) {
            var altered = frame
            altered[bit / 8] ^= 1 << (bit % 8)
            var o = receiver
            #expect(throws: SyncRejection.badFrame) { try o.openFrame(altered[...]) }
        }
        // A clear part moved into the sealed part's place (or cut) does not open either.
        var o = receiver
        #expect(throws: SyncRejection.badFrame) { try o.openFrame(frame.dropLast(1)) }
    }

    @Test func aLengthPastTheBoundIsRefusedBeforeAnyBodyIsRead() throws {
        let key = SpaceKey.generate()
        let run = try HandshakeRun(key: key)
        let accepted = try run.server.accept(run.auth, spaces: [key])
        _ = try run.client.finish(accepted.reply)
        // A header sealed by a sender that claims a clear part beyond 16 MiB is refused by its length alone.
        let sessionKey = SymmetricKey(size: .bits256)
        var length: [UInt8] = []
        length.appendBE(UInt32(100))
        length.appendBE(UInt32(SessionCipher.maxBody))
        let header = try ChaChaPoly.seal(length, using: sessionKey, nonce: SessionCipher.nonce(0, part: 1))
        let opener = FrameOpener(key: sessionKey, version: 5)
        #expect(throws: SyncRejection.badFrame) { try opener.openHeader((Array(header.ciphertext) + Array(header.tag))[...]) }
        length = []
        length.appendBE(UInt32(100))
        length.appendBE(UInt32(SessionCipher.maxBody - 100))
        let fits = try ChaChaPoly.seal(length, using: sessionKey, nonce: SessionCipher.nonce(0, part: 1))
        #expect(try opener.openHeader((Array(fits.ciphertext) + Array(fits.tag))[...]) == FrameBody(sealed: 100, clear: SessionCipher.maxBody - 100))
    }

    /// The README's table of formats and SYNC.md name this build's range.
    @Test func theDocsNameTheRangeThisBuildSpeaks() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let (low, high) = (Handshake.protocols.lowerBound, Handshake.protocols.upperBound)
        let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
        #expect(readme.contains("a range each side announces in the handshake (\(low) to \(high) in this build)"))
        let sync = try String(contentsOf: root.appendingPathComponent("Protocol/SYNC.md"), encoding: .utf8)
        #expect(sync.contains("(this build: \(low) to \(high);"))
    }
}
