import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeSync
import BlazeWire
import Foundation
import NIOCore
import Synchronization

@testable import BlazeRelay

/// A relay store that stops answering while `stalled` is set: each call made meanwhile waits until it is cancelled,
/// as a query lost with its PostgreSQL connection would; calls made after it is cleared answer again.
final class StallingBackend: RelayBackend {
    let inner: RelayStore
    let stalled = Atomic<Bool>(false)
    /// While set, each `store` waits until it is cleared (or its task is cancelled): a store that answers late.
    let storesHeld = Atomic<Bool>(false)
    /// The origins of the batches whose `store` waited on `storesHeld`.
    let heldOrigins = Mutex<[NodeID]>([])
    /// `store` calls that added nothing (the batch was held already).
    let storesAddingNothing = Atomic<Int>(0)

    init(_ inner: RelayStore) { self.inner = inner }

    var limits: RelayLimits { inner.limits }

    private func gate() async throws {
        // Never returns while not cancelled (the stall is for good, whatever happens to `stalled` later).
        while stalled.load(ordering: .relaxed) { try await Task.sleep(for: .seconds(3600)) }
    }

    func add(_ capability: RelayCapability) async throws -> Bool { try await inner.add(capability) }
    func spaces() async throws -> [SpaceKey] { try await inner.spaces() }
    func usage(space: SpaceID) async throws -> (entries: Int, bytes: Int) { try await inner.usage(space: space) }
    func ops(space: SpaceID) async throws -> [MembershipOp] {
        try await gate()
        return try await inner.ops(space: space)
    }
    func addOps(_ ops: [MembershipOp], space: SpaceID) async throws -> [MembershipOp] {
        try await gate()
        return try await inner.addOps(ops, space: space)
    }
    func vector(space: SpaceID) async throws -> [NodeID: UInt64] {
        try await gate()
        return try await inner.vector(space: space)
    }
    func batch(space: SpaceID, origin: NodeID, after: UInt64, maxEntries: Int, maxBytes: Int) async throws -> EntryBatch? {
        try await gate()
        return try await inner.batch(space: space, origin: origin, after: after, maxEntries: maxEntries, maxBytes: maxBytes)
    }
    func store(_ batch: EntryBatch, space: SpaceID, membership: MembershipState?) async throws -> Int {
        try await gate()
        if storesHeld.load(ordering: .relaxed) {
            heldOrigins.withLock { $0.append(batch.origin) }
            while storesHeld.load(ordering: .relaxed) { try await Task.sleep(for: .milliseconds(5)) }
        }
        let added = try await inner.store(batch, space: space, membership: membership)
        if added == 0 { storesAddingNothing.add(1, ordering: .relaxed) }
        return added
    }
    func keepAcks(_ acks: [Acknowledgement], space: SpaceID) async throws -> [Acknowledgement] {
        try await gate()
        return try await inner.keepAcks(acks, space: space)
    }
    func acks(space: SpaceID) async throws -> [Acknowledgement] {
        try await gate()
        return try await inner.acks(space: space)
    }
    func keepFormats(_ statements: [FormatStatement], space: SpaceID) async throws -> [FormatStatement] {
        try await gate()
        return try await inner.keepFormats(statements, space: space)
    }
    func formats(space: SpaceID) async throws -> [FormatStatement] {
        try await gate()
        return try await inner.formats(space: space)
    }
    func stageSnapshotPart(_ part: SnapshotPart, upload: [UInt8], space: SpaceID, startedMs: Int64) async throws {
        try await gate()
        try await inner.stageSnapshotPart(part, upload: upload, space: space, startedMs: startedMs)
    }
    func heldChunks(_ ids: [ChunkID], space: SpaceID) async throws -> Set<ChunkID> {
        try await gate()
        return try await inner.heldChunks(ids, space: space)
    }
    func storeChunk(_ id: ChunkID, sealed: [UInt8], space: SpaceID) async throws -> ChunkStored {
        try await gate()
        return try await inner.storeChunk(id, sealed: sealed, space: space)
    }
    func chunk(_ id: ChunkID, space: SpaceID) async throws -> [UInt8]? {
        try await gate()
        return try await inner.chunk(id, space: space)
    }
    func chunkBytes(space: SpaceID) async throws -> Int {
        try await gate()
        return try await inner.chunkBytes(space: space)
    }
    func dropChunks(_ copies: [ChunkCopy], space: SpaceID) async throws -> Int {
        try await gate()
        return try await inner.dropChunks(copies, space: space)
    }

    func keepChunks(_ ids: [ChunkID], space: SpaceID, nowMs: Int64) async throws -> Int {
        try await gate()
        return try await inner.keepChunks(ids, space: space, nowMs: nowMs)
    }

    func dropUnkeptChunks(keptBeforeMs: Int64, limit: Int) async throws -> (chunks: Int, bytes: Int) {
        try await gate()
        return try await inner.dropUnkeptChunks(keptBeforeMs: keptBeforeMs, limit: limit)
    }
    func dropSnapshotUpload(_ upload: [UInt8]) async throws {
        try await gate()
        try await inner.dropSnapshotUpload(upload)
    }
    func dropSnapshotUploads(startedBefore cutoffMs: Int64) async throws -> Int {
        try await gate()
        return try await inner.dropSnapshotUploads(startedBefore: cutoffMs)
    }
    func keepSnapshot(_ manifest: SnapshotManifest, upload: [UInt8], space: SpaceID) async throws -> Bool {
        try await gate()
        return try await inner.keepSnapshot(manifest, upload: upload, space: space)
    }
    func snapshotManifest(space: SpaceID) async throws -> SnapshotManifest? {
        try await gate()
        return try await inner.snapshotManifest(space: space)
    }
    func snapshotPart(space: SpaceID, index: UInt32) async throws -> SnapshotPart? {
        try await gate()
        return try await inner.snapshotPart(space: space, index: index)
    }
    func bases(space: SpaceID) async throws -> [NodeID: PrunedHead] {
        try await gate()
        return try await inner.bases(space: space)
    }
    func holdJoin(_ join: HeldJoin, space: SpaceID, limit: Int, nowMs: Int64) async throws {
        try await gate()
        try await inner.holdJoin(join, space: space, limit: limit, nowMs: nowMs)
    }
    func joins(space: SpaceID, nowMs: Int64) async throws -> [HeldJoin] {
        try await gate()
        return try await inner.joins(space: space, nowMs: nowMs)
    }
    func refuseJoin(space: SpaceID, invite: [UInt8], device: [UInt8], reason: InviteRefusal) async throws -> Bool {
        try await gate()
        return try await inner.refuseJoin(space: space, invite: invite, device: device, reason: reason)
    }
    func dropJoin(space: SpaceID, device: [UInt8], holder: String) async throws {
        try await gate()
        try await inner.dropJoin(space: space, device: device, holder: holder)
    }
    func expire(idleBefore cutoffMs: Int64) async throws -> [SpaceID] { try await inner.expire(idleBefore: cutoffMs) }
    func watch(_ onChange: @escaping @Sendable (RelayChange) -> Void) async {}
}
