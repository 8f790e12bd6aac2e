import BlazeProtocol
import Crypto
import Foundation
import Testing

@testable import BlazeCrypto

/// One handshake between `server` and `client` devices over `key` (the server serving `spaces`).
struct HandshakeRun {
    let serverDevice = DeviceIdentity(), clientDevice = DeviceIdentity()
    let server: Handshake.Server
    var client: Handshake.Client
    var auth: [UInt8] = []

    init(
        key: SpaceKey, serverProtocols: ClosedRange<UInt8> = Handshake.protocols,
        clientProtocols: ClosedRange<UInt8> = Handshake.protocols
    ) throws {
        server = Handshake.Server(identity: serverDevice, protocols: serverProtocols)
        client = Handshake.Client(key: key, identity: clientDevice, protocols: clientProtocols)
        auth = try client.respond(to: server.hello)
    }
}

@Suite struct HandshakeTests {
    @Test func peersWithTheKeyAgreeOnSessionKeysAndLearnEachOthersDevice() throws {
        let spaces = [SpaceKey.generate(), SpaceKey.generate(), SpaceKey.generate()]
        let run = try HandshakeRun(key: spaces[1])
        #expect(run.auth.count == Handshake.authSize)
        let accepted = try run.server.accept(run.auth, spaces: spaces)
        #expect(accepted.space == spaces[1])
        #expect(accepted.device == run.clientDevice.publicKeys)
        #expect(accepted.reply.count == Handshake.replySize)
        let (serverDevice, clientSession, version) = try run.client.finish(accepted.reply)
        #expect(version == Handshake.protocols.upperBound && accepted.protocolVersion == version)
        #expect(serverDevice == run.serverDevice.publicKeys)
        #expect(serverDevice.nodeID == run.serverDevice.nodeID)
        var c = clientSession, s = accepted.session
        for i in 0..<3 {
            let message = Array("frame \(i)".utf8)
            #expect(try s.openFrame(c.seal(message)[...]) == message)
            #expect(try c.openFrame(s.seal(message)[...]) == message)
        }
    }

    @Test func devicesStayHiddenFromOnlookers() throws {
        let key = SpaceKey.generate()
        let run = try HandshakeRun(key: key)
        let accepted = try run.server.accept(run.auth, spaces: [key])
        let wire = hexString(run.server.hello + run.auth + accepted.reply)
        for device in [run.clientDevice, run.serverDevice] {
            let keys = device.publicKeys
            for part in [keys.signing, keys.agreement, device.nodeID] { #expect(!wire.contains(hexString(part))) }
        }
        #expect(!wire.contains(key.idHex))
    }

    @Test func aStrangerIsRefusedAndLearnsNothing() throws {
        let key = SpaceKey.generate()
        let stranger = try HandshakeRun(key: SpaceKey.generate())
        #expect(throws: SyncRejection.badFrame) { try stranger.server.accept(stranger.auth, spaces: [key]) }
        // A fake server (no key) cannot produce the proof the client checks.
        let run = try HandshakeRun(key: key)
        #expect(throws: SyncRejection.badFrame) { try run.client.finish([UInt8](repeating: 0, count: Handshake.replySize)) }
        // Garbage is refused.
        #expect(throws: SyncRejection.badFrame) { try run.server.accept([1, 2, 3], spaces: [key]) }
        var c2 = Handshake.Client(key: key, identity: DeviceIdentity())
        #expect(throws: SyncRejection.badFrame) { try c2.respond(to: Array("HTTP/1.1 200 OK".utf8)) }
        // A version 2 hello (before device identities) is refused, not misread, and said to be of another version.
        var old = run.server.hello
        old[4] = 2
        #expect(throws: SyncRejection.badFrame) { try c2.respond(to: old) }
        #expect(c2.otherHandshake(old) == ProtocolMismatch(ours: Handshake.protocols, handshake: 2))
    }

    @Test func everyAlteredByteOfAnIdentityOrProofIsRefused() throws {
        let key = SpaceKey.generate()
        let run = try HandshakeRun(key: key)
        // Client side: every byte after the ephemeral key (sealed identity and proof).
        for i in 64..<Handshake.authSize {
            var altered = run.auth
            altered[i] ^= 0x01
            #expect(throws: SyncRejection.badFrame) { try run.server.accept(altered, spaces: [key]) }
        }
        // Server side: every byte of the reply.
        let accepted = try run.server.accept(run.auth, spaces: [key])
        for i in 0..<Handshake.replySize {
            var altered = accepted.reply
            altered[i] ^= 0x80
            #expect(throws: SyncRejection.badFrame) { try run.client.finish(altered) }
        }
    }

    @Test func anIdentityIsBoundToItsConnection() throws {
        let key = SpaceKey.generate()
        let first = try HandshakeRun(key: key)
        // The same AUTH replayed to a new server (a new hello: new nonce and ephemeral key) is refused.
        let other = Handshake.Server(identity: DeviceIdentity())
        #expect(throws: SyncRejection.badFrame) { try other.accept(first.auth, spaces: [key]) }
        // A server's reply cannot be moved to another connection either.
        let second = try HandshakeRun(key: key)
        let reply = try first.server.accept(first.auth, spaces: [key]).reply
        #expect(throws: SyncRejection.badFrame) { try second.client.finish(reply) }
    }

    @Test(arguments: [4...4, Handshake.protocols] as [ClosedRange<UInt8>])
    func replayedReorderedOrAlteredFramesFailToOpen(protocols: ClosedRange<UInt8>) throws {
        let key = SpaceKey.generate()
        let run = try HandshakeRun(key: key, serverProtocols: protocols)
        let accepted = try run.server.accept(run.auth, spaces: [key])
        var c = try run.client.finish(accepted.reply).session
        var receiver = accepted.session
        let headerSize = receiver.opener.headerSize
        #expect(headerSize == SessionCipher.headerSize(protocols.upperBound))
        let f1 = c.seal(Array("one".utf8))
        let f2 = c.seal(Array("two".utf8))
        #expect(f1.count == headerSize + 3 + SessionCipher.tagSize)
        var replay = receiver
        #expect(throws: SyncRejection.badFrame) { try replay.openFrame(f2[...]) }  // reordered
        #expect(try receiver.openFrame(f1[...]) == Array("one".utf8))
        #expect(throws: SyncRejection.badFrame) { try receiver.openFrame(f1[...]) }  // replayed
        // Every single bit flip, in the length or the body, is refused; the length before any body byte is read.
        for bit in 0..<(f2.count * 8) {
            var altered = f2
            altered[bit / 8] ^= 1 << (bit % 8)
            var r = receiver
            #expect(throws: SyncRejection.badFrame) { try r.openFrame(altered[...]) }
            if bit < headerSize * 8 {
                #expect(throws: SyncRejection.badFrame) { try r.openLength(altered.prefix(headerSize)) }
            }
        }
        #expect(throws: SyncRejection.badFrame) { try receiver.openFrame(f2.dropLast()) }  // truncated
        #expect(try receiver.openLength(f2.prefix(headerSize)) == 3 + SessionCipher.tagSize)
    }
}
