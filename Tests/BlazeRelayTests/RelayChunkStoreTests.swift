import BlazeCrypto
import BlazeProtocol
import Foundation
import Testing

@testable import BlazeRelay

/// Blob chunks in the relay's store, both backends (Protocol/RELAY.md, "Blob chunks"): held per space, counted in its
/// bytes within the quota, dropped as bad copies and with the space's retention.
@Suite struct RelayChunkStoreTests {
    let key = SpaceKey.generate()

    func id() -> ChunkID { ChunkID(bytes: SpaceKey.randomBytes(32))! }
    func sealed(_ blocks: Int) -> [UInt8] {
        SealedChunkLayout.magic + [0, 0, 0, 1] + SpaceKey.randomBytes(12 + blocks * SealedChunkLayout.padding + 16)
    }

    @Test(arguments: Backend.allCases) func chunksAreHeldPerSpaceServedExactlyAndCountedInItsBytes(backend: Backend) async throws {
        let temp = try await TempRelay(backend)
        let relay = temp.store
        _ = try await relay.add(RelayCapability(key: key))
        let other = SpaceKey.generate()
        _ = try await relay.add(RelayCapability(key: other))
        let (a, b) = (id(), id())
        let (sa, sb) = (sealed(1), sealed(3))
        #expect(try await relay.heldChunks([a, b], space: key.id).isEmpty)
        #expect(try await relay.storeChunk(a, sealed: sa, space: key.id) == .stored)
        #expect(try await relay.storeChunk(b, sealed: sb, space: key.id) == .stored)
        #expect(try await relay.storeChunk(a, sealed: sealed(2), space: key.id) == .held, "the first copy stays")
        #expect(try await relay.heldChunks([a, b, id()], space: key.id) == [a, b])
        #expect(try await relay.chunk(a, space: key.id) == sa)
        #expect(try await relay.chunk(b, space: key.id) == sb)
        #expect(try await relay.chunkBytes(space: key.id) == sa.count + sb.count)
        #expect(try await relay.usage(space: key.id).bytes == 0, "chunks have a quota of their own")
        // Another space holds none of them, and reads none of them.
        #expect(try await relay.heldChunks([a, b], space: other.id).isEmpty)
        #expect(try await relay.chunk(a, space: other.id) == nil)
        // Dropped as a bad copy: only the copy that was served (a copy uploaded since stays), gone with its bytes;
        // dropping what is not held changes nothing.
        func copy(_ id: ChunkID, _ sealed: [UInt8]) -> ChunkCopy {
            ChunkCopy(id: id, prefix: Array(sealed.prefix(SealedChunkLayout.headerCount)))
        }
        #expect(try await relay.dropChunks([copy(a, sealed(1)), copy(id(), sa)], space: key.id) == 0)
        #expect(try await relay.dropChunks([copy(a, sa), copy(id(), sa)], space: key.id) == 1)
        #expect(try await relay.chunk(a, space: key.id) == nil)
        #expect(try await relay.chunkBytes(space: key.id) == sb.count)
        #expect(try await relay.storeChunk(a, sealed: sa, space: key.id) == .stored, "a member's next offer restores it")
        // Retention drops chunks with the rest of the space.
        let dropped = try await relay.expire(idleBefore: Int64(Date().timeIntervalSince1970 * 1000) + 60_000)
        #expect(dropped == [key.id])
        #expect(try await relay.heldChunks([a, b], space: key.id).isEmpty)
        #expect(try await relay.chunkBytes(space: key.id) == 0)
    }

    @Test(arguments: Backend.allCases) func aChunkNobodyKeepsLeavesTheRelayAndOneStillHeldStays(backend: Backend) async throws {
        let temp = try await TempRelay(backend)
        let relay = temp.store
        _ = try await relay.add(RelayCapability(key: key))
        let other = SpaceKey.generate()
        _ = try await relay.add(RelayCapability(key: other))
        let (kept, left, elsewhere) = (id(), id(), id())
        let (sk, sl, se) = (sealed(1), sealed(2), sealed(1))
        #expect(try await relay.storeChunk(kept, sealed: sk, space: key.id) == .stored)
        #expect(try await relay.storeChunk(left, sealed: sl, space: key.id) == .stored)
        #expect(try await relay.storeChunk(elsewhere, sealed: se, space: other.id) == .stored)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        // Kept later than the cutoff: only held chunks of that space count, an id of another space or none changes nothing.
        let later = now + 7_200_000
        #expect(try await relay.keepChunks([kept, elsewhere, id()], space: key.id, nowMs: later) == 1)
        #expect(try await relay.keepChunks([elsewhere], space: other.id, nowMs: later) == 1)
        // A keep never moves a lease back, and one within the hour after the last writes nothing.
        #expect(try await relay.keepChunks([kept], space: key.id, nowMs: now - 600_000) == 0)
        #expect(try await relay.keepChunks([kept], space: key.id, nowMs: later + 60_000) == 0)
        let dropped = try await relay.dropUnkeptChunks(keptBeforeMs: now + 300_000, limit: 100)
        #expect(dropped.chunks == 1 && dropped.bytes == sl.count)
        #expect(try await relay.heldChunks([kept, left], space: key.id) == [kept])
        #expect(try await relay.heldChunks([elsewhere], space: other.id) == [elsewhere])
        #expect(try await relay.chunkBytes(space: key.id) == sk.count)
        #expect(try await relay.keepChunks([left], space: key.id, nowMs: now) == 0, "its lease went with it")
        // Stored again, its lease starts again; a copy dropped as bad takes its lease along.
        #expect(try await relay.storeChunk(left, sealed: sl, space: key.id) == .stored)
        #expect(try await relay.dropUnkeptChunks(keptBeforeMs: now - 60_000, limit: 100).chunks == 0)
        let copy = ChunkCopy(id: left, prefix: Array(sl.prefix(SealedChunkLayout.headerCount)))
        #expect(try await relay.dropChunks([copy], space: key.id) == 1)
        #expect(try await relay.keepChunks([left], space: key.id, nowMs: now) == 0)
        // In batches: the limit bounds one call.
        let many = (0..<5).map { _ in id() }
        for c in many { #expect(try await relay.storeChunk(c, sealed: sealed(1), space: key.id) == .stored) }
        let future = now + 10_800_000
        #expect(try await relay.dropUnkeptChunks(keptBeforeMs: future, limit: 3).chunks == 3)
        #expect(try await relay.dropUnkeptChunks(keptBeforeMs: future, limit: 100).chunks == 4)
        #expect(try await relay.chunkBytes(space: key.id) == 0)
        #expect(try await relay.chunkBytes(space: other.id) == 0)
    }

    @Test(arguments: Backend.allCases) func aChunkOverTheQuotaIsLeftOut(backend: Backend) async throws {
        var limits = RelayLimits()
        limits.maxChunkBytesPerSpace = 3 * SealedChunkLayout.padding
        let temp = try await TempRelay(backend, limits: limits)
        let relay = temp.store
        _ = try await relay.add(RelayCapability(key: key))
        let (a, b) = (id(), id())
        #expect(try await relay.storeChunk(a, sealed: sealed(1), space: key.id) == .stored)
        #expect(try await relay.storeChunk(b, sealed: sealed(2), space: key.id) == .overQuota)
        #expect(try await relay.heldChunks([a, b], space: key.id) == [a])
        #expect(try await relay.chunkBytes(space: key.id) <= limits.maxChunkBytesPerSpace)
    }
}
