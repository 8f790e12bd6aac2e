import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeTestSupport
import BlazeWire
import NIOCore
import NIOEmbedded
import NIOWebSocket
import Testing

@testable import BlazeSync

/// The sync path's handlers, each in an `EmbeddedChannel` (or, where they run work on the I/O pool, an
/// `NIOAsyncTestingChannel`).
@Suite(.serialized) struct SyncHandlers {
    func handshakePair(_ s: SharedPair, key: SpaceKey? = nil) throws
        -> (server: EmbeddedChannel, client: EmbeddedChannel, serverSeen: Recorder<PeerMessage>, clientSeen: Recorder<PeerMessage>, clientReport: LinkReport)
    {
        let serverSeen = Recorder<PeerMessage>(), clientSeen = Recorder<PeerMessage>()
        let serverReport = LinkReport(book: s.a.engine.status, peer: "inbound", direction: .inbound, db: nil)
        let clientReport = LinkReport(book: s.b.engine.status, peer: "a", direction: .outbound, db: s.dbB.name)
        let server = try active([HandshakeHandler(engine: s.a.engine, report: serverReport), serverSeen])
        let client = try active([
            HandshakeHandler(engine: s.b.engine, report: clientReport, space: s.space(s.b, s.dbB, key ?? s.key)), clientSeen,
        ])
        return (server, client, serverSeen, clientSeen, clientReport)
    }

    @Test(arguments: [Int.max, 1, 7])
    func handshakeEstablishesBothSidesAndHandsOverToTheSessionHandlers(chunk: Int) async throws {
        try await withSharedSpace { s in
            let (server, client, serverSeen, clientSeen, _) = try handshakePair(s)
            try shuttle(server, client, chunk: chunk)
            #expect(serverSeen.established == ["notes"] && clientSeen.established == ["mine"])
            // Each side learned which device is at the other end.
            #expect(serverSeen.devices == [s.b.identity.publicKeys] && clientSeen.devices == [s.a.identity.publicKeys])
            for channel in [server, client] {
                #expect(throws: (any Error).self) { try channel.pipeline.syncOperations.handler(type: HandshakeHandler.self) }
                #expect((try? channel.pipeline.syncOperations.handler(type: PeerMessageDecoder.self)) != nil)
            }
            // The session handlers seal and open: a message written on one side arrives decoded on the other.
            try client.writeOutbound(try PeerMessage.error("hello").encoded())
            try shuttle(server, client, chunk: chunk)
            guard case .error("hello")? = serverSeen.messages.last else {
                Issue.record("server read \(serverSeen.messages)")
                return
            }
            #expect(s.a.engine.strangersRefusedCount == 0)
            _ = try server.finish(acceptAlreadyClosed: true)
            _ = try client.finish(acceptAlreadyClosed: true)
        }
    }

    @Test func bytesSentRightAfterTheHandshakeReachTheSession() async throws {
        try await withSharedSpace { s in
            let (server, client, _, clientSeen, _) = try handshakePair(s)
            // Hello to the client, its proof back; the server's reply and its first sealed frame then travel together.
            try client.writeInbound(try #require(try server.readOutbound(as: ByteBuffer.self)))
            try server.writeInbound(try #require(try client.readOutbound(as: ByteBuffer.self)))
            var both = try #require(try server.readOutbound(as: ByteBuffer.self))
            try server.writeOutbound(try PeerMessage.ping.encoded())
            var sealed = try #require(try server.readOutbound(as: ByteBuffer.self))
            both.writeBuffer(&sealed)
            try client.writeInbound(both)
            #expect(clientSeen.established == ["mine"])
            guard case .ping? = clientSeen.messages.first else {
                Issue.record("client read \(clientSeen.messages)")
                return
            }
            _ = try server.finish(acceptAlreadyClosed: true)
            _ = try client.finish(acceptAlreadyClosed: true)
        }
    }

    @Test func aStrangerOrAWrongLengthFrameIsClosedSilentlyAndCounted() async throws {
        try await withSharedSpace { s in
            let (server, client, serverSeen, _, _) = try handshakePair(s, key: SpaceKey.generate())
            try shuttle(server, client)
            #expect(!server.isActive && serverSeen.established.isEmpty && s.a.engine.strangersRefusedCount == 1)
            #expect(try server.readOutbound(as: ByteBuffer.self) == nil)  // no proof sent back
            // The dialing side, closed by the server after its proof, names the refusal (not an unreachable peer).
            #expect(s.b.engine.status(db: s.dbB).first?.lastError == nil)
            client.pipeline.fireChannelInactive()
            let status = s.b.engine.status(db: s.dbB).first
            #expect(status?.lastError?.hasPrefix("refused by the peer: it closed the handshake after this device's proof") == true)
            #expect(status?.errors == 1)

            let report = LinkReport(book: s.a.engine.status, peer: "inbound", direction: .inbound, db: nil)
            let other = try active([HandshakeHandler(engine: s.a.engine, report: report)])
            _ = try other.readOutbound(as: ByteBuffer.self)
            var wrong = ByteBuffer()
            wrong.writeInteger(UInt32(Handshake.authSize - 1))
            try other.writeInbound(wrong)  // refused on the length alone, before any body
            #expect(!other.isActive && s.a.engine.strangersRefusedCount == 2)
            _ = try client.finish(acceptAlreadyClosed: true)
        }
    }

    /// A link closed on its own side mid-handshake (stopped, removed) reports nothing: no one refused it.
    @Test func aLinkClosedLocallyMidHandshakeReportsNoRefusal() async throws {
        try await withSharedSpace { s in
            let (server, client, _, _, _) = try handshakePair(s)
            try client.writeInbound(try #require(try server.readOutbound(as: ByteBuffer.self)))
            _ = try client.readOutbound(as: ByteBuffer.self)  // its proof, sent: now awaiting the reply
            try client.close().wait()
            let status = s.b.engine.status(db: s.dbB).first
            #expect(status?.lastError == nil && (status?.errors ?? 0) == 0, "\(String(describing: status))")
            _ = try server.finish(acceptAlreadyClosed: true)
        }
    }

    @Test func aBadHelloIsCountedOnTheOutboundLink() async throws {
        try await withSharedSpace { s in
            let report = LinkReport(book: s.b.engine.status, peer: "a", direction: .outbound, db: s.dbB.name)
            let client = try active([HandshakeHandler(engine: s.b.engine, report: report, space: s.space(s.b, s.dbB, s.key))])
            try client.writeInbound(HandshakeHandler.frame([UInt8](repeating: 0, count: Handshake.helloSize)))
            #expect(!client.isActive)
            #expect(s.b.engine.status(db: s.dbB).first?.rejected == ["bad_frame": 1])
        }
    }

    @Test func handshakeDeadlineClosesBothKinds() async throws {
        try await withSharedSpace { s in
            let (server, client, _, _, _) = try handshakePair(s)
            let limit = s.a.engine.handshakeTimeout
            server.embeddedEventLoop.advanceTime(by: limit)
            client.embeddedEventLoop.advanceTime(by: limit)
            #expect(!server.isActive && !client.isActive)
            #expect(s.a.engine.strangersRefusedCount == 1)
            #expect(s.b.engine.status(db: s.dbB).first?.lastError?.hasPrefix("timed out: handshake") == true)
        }
    }

    func cipherPair() throws -> (SessionCipher, SessionCipher) {
        let key = SpaceKey.generate()
        let server = Handshake.Server(identity: DeviceIdentity())
        var client = Handshake.Client(key: key, identity: DeviceIdentity())
        let accepted = try server.accept(try client.respond(to: server.hello), spaces: [key])
        return (try client.finish(accepted.reply).session, accepted.session)
    }

    @Test func sealedFramesOpenAcrossAnySplitAndCountTheirBytes() throws {
        var (sender, receiver) = try cipherPair()
        let report = LinkReport(book: StatusBook(), peer: "p", direction: .outbound, db: "d")
        let seen = Recorder<[UInt8]>()
        let channel = try active([ByteToMessageHandler(SealedFrameDecoder(opener: receiver.opener, counters: report)), seen])
        let messages: [[UInt8]] = [Array("one".utf8), [], Array(repeating: 7, count: 5000)]
        var wire = ByteBuffer(bytes: messages.flatMap { sender.seal($0) })
        let total = wire.readableBytes
        while wire.readableBytes > 0 { try channel.writeInbound(wire.readSlice(length: min(13, wire.readableBytes))!) }
        #expect(seen.messages == messages)
        #expect(report.unreported.received == total)

        let encoder = try active([MessageToByteHandler(SealedFrameEncoder(sealer: receiver.sealer, counters: report))])
        try encoder.writeOutbound(Array("back".utf8))
        let frame = try #require(try encoder.readOutbound(as: ByteBuffer.self))
        #expect(try sender.openFrame(Array(buffer: frame)[...]) == Array("back".utf8))
        #expect(report.unreported.sent == frame.readableBytes)
        // A CHUNK (protocol 5): its sealed chunk follows the frame's sealed part in the clear, and the decoder gives
        // back the whole message.
        let chunk = PeerMessage.chunkHeader(ChunkID(bytes: [UInt8](repeating: 3, count: 32))!) + (0..<4000).map { UInt8($0 % 251) }
        try encoder.writeOutbound(chunk)
        let chunkFrame = Array(buffer: try #require(try encoder.readOutbound(as: ByteBuffer.self)))
        #expect(receiver.sealer.version >= SessionCipher.clearPartsFrom && chunkFrame.count == receiver.sealer.overhead + chunk.count)
        // Type, id and the sealed chunk's 20-byte header are sealed; the rest crosses as it is.
        let clear = chunk.count - PeerMessage.chunkSealedPrefix
        #expect(Array(chunkFrame.suffix(clear)) == Array(chunk.suffix(clear)))
        #expect(!hexString(Array(chunkFrame.dropLast(clear))).contains(hexString(Array(chunk[33..<53]))))
        #expect(try sender.openFrame(chunkFrame[...]) == chunk)
        _ = try channel.finish()
    }

    @Test func aDamagedLengthIsRefusedBeforeItsBodyArrives() throws {
        var (sender, receiver) = try cipherPair()
        let report = LinkReport(book: StatusBook(), peer: "p", direction: .outbound, db: "d")
        let channel = try active([ByteToMessageHandler(SealedFrameDecoder(opener: receiver.opener, counters: report))])
        var frame = sender.seal(Array("x".utf8))
        frame[0] ^= 1
        #expect(throws: SyncRejection.badFrame) { try channel.writeInbound(ByteBuffer(bytes: frame.prefix(receiver.opener.headerSize))) }
    }

    @Test func aConnectionLostMidFrameIsCounted() throws {
        var (sender, receiver) = try cipherPair()
        let book = StatusBook()
        let report = LinkReport(book: book, peer: "p", direction: .outbound, db: "d")
        let channel = try active([ByteToMessageHandler(SealedFrameDecoder(opener: receiver.opener, counters: report))])
        try channel.writeInbound(ByteBuffer(bytes: sender.seal(Array("whole".utf8)) + sender.seal(Array("cut".utf8)).prefix(25)))
        #expect(try channel.readInbound(as: [UInt8].self) == Array("whole".utf8))
        _ = try channel.finish(acceptAlreadyClosed: false)
        #expect(book.peers(db: "d").first?.lastError == "connection lost mid-frame")
    }

    @Test func aMessageThatDoesNotDecodeFailsTheConnection() throws {
        let channel = try active([PeerMessageDecoder()])
        #expect(throws: SyncRejection.malformed) { try channel.writeInbound([UInt8]([0xEE, 1, 2])) }
        try channel.writeInbound(try PeerMessage.ping.encoded())
        guard case .ping? = try channel.readInbound(as: PeerMessage.self) else {
            Issue.record("ping did not decode")
            return
        }
    }

    @Test func gateTicketStopsCountingTheHandshakeThenReleasesOnce() async throws {
        try await withSharedSpace { s in
            let gate = ConnectionGate(limits: SyncListenerLimits())
            #expect(gate.admit(address: "10.0.0.1") && gate.admit(address: "10.0.0.1"))
            let established = try active([GateTicket(gate: gate, address: "10.0.0.1")])
            let abandoned = try active([GateTicket(gate: gate, address: "10.0.0.1")])
            #expect(gate.current == (2, 2, 0))
            established.pipeline.fireUserInboundEventTriggered(SyncLinkEstablished(space: s.space(s.a, s.dbA, s.key), device: s.b.identity.publicKeys, protocolVersion: 5))
            #expect(gate.current == (2, 1, 0))
            _ = try abandoned.finish(acceptAlreadyClosed: false)
            #expect(gate.current == (1, 0, 0))
            _ = try established.finish(acceptAlreadyClosed: false)
            #expect(gate.current == (0, 0, 0))
        }
    }

    @Test func reservedPlacesGoOnlyToKnownAddressesAndListedDevices() {
        var limits = SyncListenerLimits()
        limits.maxHandshakes = 3
        limits.reservedHandshakes = 1
        limits.maxConnections = 6
        limits.reservedConnections = 3
        let gate = ConnectionGate(limits: limits)
        // Two handshakes from unknown addresses take the places not reserved; a third unknown one is refused, a known
        // one takes the reserved place, and then nobody gets one.
        let a = GatePlace(gate: gate, address: "10.0.0.1"), b = GatePlace(gate: gate, address: "10.0.0.2")
        #expect(gate.admit(address: "10.0.0.1", known: false) && gate.admit(address: "10.0.0.2", known: false))
        #expect(!gate.admit(address: "10.0.0.3", known: false))
        #expect(gate.admit(address: "10.0.0.4", known: true))
        let c = GatePlace(gate: gate, address: "10.0.0.4")
        #expect(!gate.admit(address: "10.0.0.5", known: true))
        // A proxy's connection (counted for nobody yet) is checked again when it names its client.
        c.release()
        #expect(gate.admit(address: nil))
        let proxied = GatePlace(gate: gate, address: nil)
        #expect(!proxied.rebind(to: "10.0.0.6", known: false), "the only place left is reserved")
        #expect(proxied.rebind(to: "10.0.0.6", known: true))
        proxied.release()
        // Established: unlisted devices take at most maxConnections − reservedConnections places.
        #expect(a.established(listed: false) && b.established(listed: false))
        #expect(gate.admit(address: "10.0.0.7", known: false) && gate.admit(address: "10.0.0.8", known: false))
        let d = GatePlace(gate: gate, address: "10.0.0.7"), e = GatePlace(gate: gate, address: "10.0.0.8")
        #expect(d.established(listed: false))
        #expect(!e.established(listed: false), "no unlisted place left")
        #expect(e.established(listed: true), "a listed device takes a reserved one")
        #expect(gate.current == (4, 0, 3) && !gate.hasUnreservedPlace)
        // One admitted as unlisted (its log not read yet) that turns out listed moves to the reserved places, once.
        d.listed()
        d.listed()
        #expect(gate.current == (4, 0, 2) && gate.hasUnreservedPlace)
        a.release()
        #expect(gate.current == (3, 0, 1))
        for p in [b, d, e] { p.release() }
        #expect(gate.current == (0, 0, 0))
    }

    /// A pipeline of `BatchReceiver`, `SyncSession` and a recorder on an `NIOAsyncTestingChannel` (they run storage on
    /// the device's I/O pool), established for `db`.
    func session(_ device: Device, db: BlazeDatabase, key: SpaceKey) async throws -> NIOAsyncTestingChannel {
        let channel = NIOAsyncTestingChannel()
        let engine = device.engine
        try await channel.testingEventLoop.executeInContext {
            let report = LinkReport(book: engine.status, peer: "p", direction: .inbound, db: db.name)
            try channel.pipeline.syncOperations.addHandlers([
                BatchReceiver(engine: engine, report: report), SyncSession(engine: engine, report: report),
                Recorder<Never>(),
            ])
        }
        try await channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1))
        channel.pipeline.fireUserInboundEventTriggered(SyncLinkEstablished(
                space: BlazeSync.SharedSpace(db: db, id: key.id, identity: engine.identity, ops: [], stored: key, capability: nil),
                device: DeviceIdentity().publicKeys, protocolVersion: 4))
        return channel
    }

    /// The next message the session wrote.
    /// The next message written, acknowledgements aside (a session sends them whenever it learns new ones).
    func written(_ channel: NIOAsyncTestingChannel) async throws -> PeerMessage {
        while true {
            let message = try PeerMessage(decoding: try await channel.waitForOutboundWrite(as: [UInt8].self))
            if case .acks = message { continue }
            return message
        }
    }

    /// How many events of type `T` reached the end of `channel`'s pipeline.
    func seen<T>(_ type: T.Type, on channel: NIOAsyncTestingChannel) async throws -> Int {
        try await channel.testingEventLoop.executeInContext {
            try channel.pipeline.syncOperations.handler(type: Recorder<Never>.self).events.count { $0 is T }
        }
    }

    @Test func sessionSendsItsStateThenExactlyWhatThePeerLacks() async throws {
        let s = try SharedPair(documents: 5)
        let channel = try await session(s.a, db: s.dbA, key: s.key)
        guard case .state(let vector, let head?) = try await written(channel) else {
            Issue.record("the first message is not a STATE with a head")
            return
        }
        let mine = try s.dbA.syncVector()
        #expect(vector == mine && head.seq == mine[s.dbA.node])
        // The peer holds the first two entries: the rest come, ending at the latest head.
        try await channel.writeInbound(PeerMessage.state(vector: [s.dbA.node: 2], ownHead: nil))
        var received: [UInt64] = []
        while received.last != head.seq {
            guard case .entries(let batch) = try await written(channel) else { continue }
            received += batch.entries.map(\.header.seq)
        }
        #expect(received == Array(3...head.seq))
        try await channel.close()
        await s.close()
    }

    @Test func receiverStoresInOrderAndAReadIdleWhileBusyIsNotSilence() async throws {
        let s = try SharedPair()
        for i in 0..<6 {
            _ = try s.dbA.apply(.put(collection: "c", id: "d\(i)", doc: ["n": .int(Int64(i))]))
            try s.dbA.sealLocal(key: s.key, identity: s.a.identity, batch: 1)
        }
        let batches = try (0..<6).map { try #require(try s.dbA.entryBatch(origin: s.dbA.node, after: UInt64($0), maxEntries: 1)) }
        let channel = try await session(s.b, db: s.dbB, key: s.key)
        _ = try await written(channel)  // B's STATE
        // All six arrive in one go; a read-idle event meanwhile is swallowed (the receiver is busy, reading paused).
        try await channel.testingEventLoop.executeInContext {
            for batch in batches { channel.pipeline.fireChannelRead(PeerMessage.entries(batch)) }
            channel.pipeline.fireUserInboundEventTriggered(IdleStateHandler.IdleStateEvent.read)
        }
        #expect(try eventually { try s.dbB.summary().documents == 6 })
        #expect(try await seen(PeerHoldsBatch.self, on: channel) == 6)
        #expect(try await seen(IdleStateHandler.IdleStateEvent.self, on: channel) == 0)
        #expect(s.b.engine.status(db: s.dbB).first?.receivedEntries == 6)
        #expect(channel.isActive)
        // Idle now: the same event is the peer's silence, which closes the connection and says why.
        channel.pipeline.fireUserInboundEventTriggered(IdleStateHandler.IdleStateEvent.read)
        try await channel.closeFuture.get()
        #expect(s.b.engine.status(db: s.dbB).first?.lastError?.hasPrefix("timed out: peer silent") == true)
        await s.close()
    }

    @Test func aBatchThatDoesNotVerifyIsCountedToldToThePeerAndCloses() async throws {
        let s = try SharedPair(documents: 2)
        try s.dbA.sealLocal(key: s.key, identity: s.a.identity)
        var batch = try #require(try s.dbA.entryBatch(origin: s.dbA.node, after: 0, maxEntries: 10))
        batch.entries.removeFirst()  // no longer links to anything held
        let channel = try await session(s.b, db: s.dbB, key: s.key)
        _ = try await written(channel)
        try await channel.writeInbound(PeerMessage.entries(batch))
        guard case .error(let reason) = try await written(channel) else {
            Issue.record("no ERROR sent")
            return
        }
        try await channel.closeFuture.get()
        #expect(s.b.engine.status(db: s.dbB).first?.rejected[reason] == 1)
        #expect(try s.dbB.summary().documents == 0)
        await s.close()
    }

    @Test func theRestOfABatchAfterASequenceStillVerifies() async throws {
        let s = try SharedPair(documents: 5)
        try s.dbA.sealLocal(key: s.key, identity: s.a.identity)
        let batch = try #require(try s.dbA.entryBatch(origin: s.dbA.node, after: 0, maxEntries: 10))
        #expect(batch.entries.map(\.header.seq) == [1, 2, 3, 4, 5])
        #expect(batch.after(0)?.entries.count == 5)
        let rest = try #require(batch.after(3))
        #expect(rest.entries.map(\.header.seq) == [4, 5] && rest.head.seq == 5)
        #expect(batch.after(5) == nil && batch.after(9) == nil)
        // The head still signs the last entry, so the rest verifies on its own (its link to seq 3 is checked on store).
        let verified = try s.dbB.verify(batch: rest, key: s.key)
        #expect(verified.changes.count == 2)
        await s.close()
    }

    @Test func aQuietSessionPingsAndAPeerErrorCloses() async throws {
        let s = try SharedPair()
        let channel = try await session(s.a, db: s.dbA, key: s.key)
        _ = try await written(channel)
        channel.pipeline.fireUserInboundEventTriggered(IdleStateHandler.IdleStateEvent.write)
        guard case .ping = try await written(channel) else {
            Issue.record("no PING on write-idle")
            return
        }
        try await channel.writeInbound(PeerMessage.error("going away"))
        try await channel.closeFuture.get()
        let status = try #require(s.a.engine.status(db: s.dbA).first)
        #expect(status.lastError == "peer closed: going away" && status.connections == 0)
        await s.close()
    }
}

