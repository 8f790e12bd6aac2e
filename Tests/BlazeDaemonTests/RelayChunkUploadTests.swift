import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import BlazeWire
import Foundation
import Logging
import NIOCore
import NIOPosix
import Testing

@testable import BlazeRelay

/// Uploads of blob chunks to a relay (Protocol/RELAY.md, "Blob chunks"): the relay asks for chunks only once its
/// upload budget (shared by every connection) has room for them, and gives the room back as they are stored, as the
/// device says it no longer holds one, and when the connection closes.
@Suite struct RelayChunkUploadTests {
    /// The next message of `type` from `device`, with those before it.
    static func next(_ type: UInt8, from device: HostileMember) throws -> (message: [UInt8], before: [UInt8]) {
        var before: [UInt8] = []
        while let message = try device.receive() {
            if message.first == type { return (message, before) }
            if let first = message.first { before.append(first) }
        }
        throw HostileError("the relay closed the connection before a message of type \(type)")
    }

    /// The ids a `CHUNK_WANT` names.
    static func ids(_ want: [UInt8]) -> [ChunkID] {
        stride(from: 3, to: want.count, by: ChunkID.count).compactMap { ChunkID(bytes: want[$0..<($0 + ChunkID.count)]) }
    }

    @Test func anOfferWaitsForRoomInTheUploadBudgetAndEveryRoomComesBack() async throws {
        let dir = TempDir()
        let store = try RelayStore(path: dir.path + "/relay.db")
        var logger = Logger(label: "relay")
        logger.logLevel = .critical
        let server = RelayServer(store: store, identity: DeviceIdentity(), group: MultiThreadedEventLoopGroup.singleton, logger: logger)
        let port = try await server.listen(host: "127.0.0.1", port: 0)
        let a = try syncDaemon()
        let ca = try a.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try ca.call("db.share", ["db": "team"])
        let capability = try RelayCapability(text: try ca.relayCapability("team"))
        _ = try await server.add(capability)
        let address = "ws://127.0.0.1:\(port)/v1/sync"
        _ = try ca.call("peer.add", ["db": "team", "address": .string(address)])
        #expect(try await waitUntil { try store.pool.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM relay_ops") ?? 0 } > 0 })
        _ = try ca.call("peer.remove", ["db": "team", "address": .string(address)])

        // The writer's own device key: the relay takes uploads from current writing members only.
        let writer = HostileMember(key: capability.key, identity: try DeviceIdentity.loadOrCreate(directory: a.dataDir + "/keys"))
        try writer.connect(port: port, webSocket: "/v1/sync")
        // Every connection's uploads have filled the budget: an offer is not answered while it stays full.
        let share = RelayServer.maxChunksInFlightPerSpace * PeerMessage.maxSealedChunkBytes
        let others = (0..<(RelayServer.chunkUploadBytes / share)).map { "another space \($0)" }
        for other in others { #expect(server.chunkUploads.reserve(share, for: other)) }
        let offered = (0..<3).map { _ in ChunkID(bytes: SpaceKey.randomBytes(32))! }
        try writer.send(try PeerMessage.chunkOffer(offered).encoded())
        // A want sent after the offer is answered meanwhile (the answer to the offer would come before it otherwise
        // once the store was read, as both are).
        try writer.send(try PeerMessage.chunkWant([ChunkID(bytes: SpaceKey.randomBytes(32))!]).encoded())
        let missing = try Self.next(13, from: writer)
        #expect(!missing.before.contains(11), "an offer was answered with the budget full")
        // Room comes free: the offer is answered, and the room of the chunks asked for is held.
        server.chunkUploads.release(share, for: others[0])
        let want = try Self.next(11, from: writer)
        #expect(Set(Self.ids(want.message)) == Set(offered))
        #expect(server.chunkUploads.inUse == RelayServer.chunkUploadBytes - share + 3 * PeerMessage.maxSealedChunkBytes)
        for other in others.dropFirst() { server.chunkUploads.release(share, for: other) }
        // One stored, one no longer held: their room comes back; the third's goes with the connection.
        let sealed = SealedChunkLayout.magic + [0, 0, 0, 1] + SpaceKey.randomBytes(12 + SealedChunkLayout.padding + 16)
        try writer.send(try PeerMessage.chunk(id: offered[0], sealed: sealed[...]).encoded())
        try writer.send(try PeerMessage.chunkMissing([offered[1]]).encoded())
        #expect(await waitUntil { server.chunkUploads.inUse == PeerMessage.maxSealedChunkBytes })
        #expect(try await store.heldChunks(offered, space: capability.space) == [offered[0]])
        #expect(server.counters.chunksStored == 1)
        writer.close()
        #expect(await waitUntil { server.chunkUploads.inUse == 0 }, "a closed connection kept its room")
        a.stop()
        await server.shutdown()
    }
}
