import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeWire
import NIOCore

/// Where a relay keeps what it serves: one SQLite file (`RelayStore`, the default) or a PostgreSQL database shared by
/// several relay processes (`PostgresRelayStore`). Both hold the same things and apply the same rules (`RelayRules`);
/// only the second tells other processes what changed (`watch`).
public protocol RelayBackend: Sendable {
    /// The limits each space is held to.
    var limits: RelayLimits { get }
    /// Serves `capability`'s space from now on; false when it was served already (with the same capability).
    func add(_ capability: RelayCapability) async throws -> Bool
    /// The capabilities of every space served, as handshake keys.
    func spaces() async throws -> [SpaceKey]
    /// Entries and bytes stored for `space`.
    func usage(space: SpaceID) async throws -> (entries: Int, bytes: Int)
    /// Every membership operation held for `space`.
    func ops(space: SpaceID) async throws -> [MembershipOp]
    /// Stores operations (verified when decoded) of `space`; returns those that were new.
    func addOps(_ ops: [MembershipOp], space: SpaceID) async throws -> [MembershipOp]
    /// The highest seq held per origin of `space`.
    func vector(space: SpaceID) async throws -> [NodeID: UInt64]
    /// The entries of `origin` after `after` up to the furthest head within `maxEntries` and `maxBytes` (or the
    /// nearest head past them), as one batch; nil when nothing is held after `after`.
    func batch(space: SpaceID, origin: NodeID, after: UInt64, maxEntries: Int, maxBytes: Int) async throws -> EntryBatch?
    /// Checks a received batch as far as a relay can (`RelayRules`) and stores what is new of it; returns how many
    /// entries were new. Throws a `SyncRejection` for what the batch's origin signed, any other error for a local
    /// failure.
    func store(_ batch: EntryBatch, space: SpaceID, membership: MembershipState?) async throws -> Int
    /// Keeps each acknowledgement (verified when decoded, its signer checked against the log by the caller) that is
    /// newer, by `issuedMs`, than the one held of its signer in `space`; returns those kept.
    func keepAcks(_ acks: [Acknowledgement], space: SpaceID) async throws -> [Acknowledgement]
    /// The latest acknowledgement held of each signer of `space`.
    func acks(space: SpaceID) async throws -> [Acknowledgement]
    /// Keeps each statement of entry formats (verified when decoded, its signer checked against the log by the caller)
    /// that is newer than the one held of its signer in `space`; returns those kept (SYNC.md §6, "Entry formats").
    func keepFormats(_ statements: [FormatStatement], space: SpaceID) async throws -> [FormatStatement]
    /// The latest statement of entry formats held of each signer of `space`.
    func formats(space: SpaceID) async throws -> [FormatStatement]
    /// Writes `part` (checked by the caller against its manifest and the pieces before it, `SnapshotUpload`) as a
    /// piece of upload `upload` of `space`, begun at `startedMs` (Unix ms): staged until the upload is kept or dropped.
    func stageSnapshotPart(_ part: SnapshotPart, upload: [UInt8], space: SpaceID, startedMs: Int64) async throws
    /// Drops what upload `upload` staged (declined, or its connection closed).
    func dropSnapshotUpload(_ upload: [UInt8]) async throws
    /// Drops what uploads begun before `cutoffMs` (Unix ms) staged: a relay process that stopped mid-upload left them.
    /// Returns how many pieces went.
    func dropSnapshotUploads(startedBefore cutoffMs: Int64) async throws -> Int
    /// Keeps `manifest` with the pieces upload `upload` staged (every one it counts, each checked by the caller as it
    /// came) as the space's snapshot, in one transaction, unless they are not all staged, the one held is as recent
    /// or this one covers less than a base (below) of some origin. For each origin whose held entries end below what
    /// it covers, those entries and heads go and the manifest's head becomes the origin's base: the next entry must
    /// link to it. The staged pieces go either way. Returns whether it was kept.
    func keepSnapshot(_ manifest: SnapshotManifest, upload: [UInt8], space: SpaceID) async throws -> Bool
    /// The manifest of the space's snapshot, nil when none is held.
    func snapshotManifest(space: SpaceID) async throws -> SnapshotManifest?
    /// Piece `index` of the space's snapshot.
    func snapshotPart(space: SpaceID, index: UInt32) async throws -> SnapshotPart?
    /// Per origin of `space`, the entry its held entries follow when a snapshot covers what is not held.
    func bases(space: SpaceID) async throws -> [NodeID: PrunedHead]
    /// Drops everything held of each space whose last write (entries or operations) is older than `cutoffMs` (Unix
    /// ms) — entries, heads, operations, usage — keeping the space served; returns those spaces. Devices hold all of it
    /// and hand it back when they next connect (the relay's `STATE` then shows nothing held).
    func expire(idleBefore cutoffMs: Int64) async throws -> [SpaceID]
    /// Holds `join` for `space` until `join.expiresMs`, replacing what was held for its device; a space holds at
    /// most `limit` unexpired joins, the oldest going first to make room (`RelayServer.maxJoinsPerSpace`).
    func holdJoin(_ join: HeldJoin, space: SpaceID, limit: Int, nowMs: Int64) async throws
    /// The joins of `space` not expired at `nowMs`.
    func joins(space: SpaceID, nowMs: Int64) async throws -> [HeldJoin]
    /// Marks the join of the device whose Ed25519 key is `device`, for invite `invite`, refused for `reason`; false
    /// when no such join is held, or it was refused for that reason already.
    func refuseJoin(space: SpaceID, invite: [UInt8], device: [UInt8], reason: InviteRefusal) async throws -> Bool
    /// Drops the join of `device` (Ed25519 key) held by `holder`: its connection closed, or it was told its refusal.
    func dropJoin(space: SpaceID, device: [UInt8], holder: String) async throws
    /// Renews the leases of those of chunks `ids` that `space` holds to `nowMs`; returns how many it holds.
    func keepChunks(_ ids: [ChunkID], space: SpaceID, nowMs: Int64) async throws -> Int
    /// Drops up to `limit` chunks (of any space) last kept before `keptBeforeMs`, with their bytes taken off their
    /// spaces' usage; returns how many went and their bytes.
    func dropUnkeptChunks(keptBeforeMs: Int64, limit: Int) async throws -> (chunks: Int, bytes: Int)
    /// Of `ids`, the blob chunks `space` holds.
    func heldChunks(_ ids: [ChunkID], space: SpaceID) async throws -> Set<ChunkID>
    /// Bytes of the blob chunks `space` holds.
    func chunkBytes(space: SpaceID) async throws -> Int
    /// Stores the sealed chunk `id` of `space` (format-checked by the caller; a relay cannot open it), counted in the
    /// space's chunk bytes: not when they would pass `limits.maxChunkBytesPerSpace`.
    func storeChunk(_ id: ChunkID, sealed: [UInt8], space: SpaceID) async throws -> ChunkStored
    /// The sealed chunk `id` of `space`; nil when it is not held.
    func chunk(_ id: ChunkID, space: SpaceID) async throws -> [UInt8]?
    /// Drops the copies of `space` that members found bad (each only if it is still the copy served), freeing their
    /// bytes; returns how many went.
    func dropChunks(_ copies: [ChunkCopy], space: SpaceID) async throws -> Int
    /// Runs `onChange` for every change another relay process makes, until the task is cancelled; returns at once
    /// when no other process can share the store.
    func watch(_ onChange: @escaping @Sendable (RelayChange) -> Void) async
}

/// A copy of a chunk a relay served: its id and the first bytes of the copy (its header, whose nonce, drawn at random
/// for each sealing, tells two copies apart).
public struct ChunkCopy: Sendable, Hashable {
    /// The chunk's id.
    public var id: ChunkID
    /// The copy's first `SealedChunkLayout.headerCount` bytes.
    public var prefix: [UInt8]

    /// A copy of `id` beginning with `prefix`.
    public init(id: ChunkID, prefix: [UInt8]) { (self.id, self.prefix) = (id, prefix) }
}

/// What became of a chunk a relay was given to store.
public enum ChunkStored: Sendable, Equatable {
    /// Stored now.
    case stored
    /// Held already: nothing changed.
    case held
    /// Not stored: the space's bytes would pass its quota.
    case overQuota
}

/// A device's request to join a space (`JOIN`, SYNC.md §9, "Invites"), held where every relay process sees it until
/// a member admits it, its connection closes or it expires (Protocol/RELAY.md, "Joins").
public struct HeldJoin: Sendable, Equatable {
    /// The invite's id (16 bytes).
    public var invite: [UInt8]
    /// The joiner's device keys, the ones it proved in the handshake.
    public var device: DevicePublicKeys
    /// The joiner's proof of the invite's secret, bound to its keys (64 bytes; 32 for a version-1 invite).
    public var proof: [UInt8]
    /// The connection holding it: the relay process and its connection number.
    public var holder: String
    /// When it expires (Unix ms).
    public var expiresMs: Int64
    /// The issuing admin's refusal, once it came (`JOIN_REFUSED`).
    public var refusal: InviteRefusal?

    /// A join as a connection holds it.
    public init(
        invite: [UInt8], device: DevicePublicKeys, proof: [UInt8], holder: String, expiresMs: Int64, refusal: InviteRefusal? = nil
    ) {
        (self.invite, self.device, self.proof, self.holder, self.expiresMs, self.refusal) =
            (invite, device, proof, holder, expiresMs, refusal)
    }
}

/// A change another relay process made to a shared store.
public enum RelayChange: Sendable, Equatable {
    /// New entries of `space`.
    case entries(space: SpaceID)
    /// New membership operations of `space`.
    case ops(space: SpaceID)
    /// New acknowledgements of `space`.
    case acks(space: SpaceID)
    /// New statements of entry formats of `space`.
    case formats(space: SpaceID)
    /// A join of `space` was held or refused.
    case joins(space: SpaceID)
    /// A space was added.
    case spaces
    /// What `space` held was dropped for retention (`expire`).
    case expired(space: SpaceID)
    /// Changes may have been missed (the notification link was down): anything may be new.
    case resync
}

/// The rules a relay holds every batch to, whatever its store: what it can check without opening an entry.
enum RelayRules {
    /// The batch's origin must be a writing member of `membership` within any removal's cutoff (through the entry
    /// it signed there, in a log that commits to its cutoffs), and the batch well
    /// formed; nil membership (no log held yet) is checked by the caller.
    static func checkAuthor(_ batch: EntryBatch, membership: MembershipState?) throws {
        guard batch.head.origin == batch.origin.bytes, !batch.entries.isEmpty else { throw SyncRejection.malformed }
        guard let membership else { return }
        guard let member = membership.member(batch.origin.bytes) else { throw SyncRejection.notMember }
        guard member.role.writes else { throw SyncRejection.reader }
        guard member.acceptsEntries(upTo: batch.head.seq, hashAt: batch.hash(at:)) else { throw SyncRejection.revoked }
    }

    /// The seqs the store must show hashes of to check `batch` against `held` (the highest seq it holds of the
    /// origin): the one before the batch (its link) and those the batch repeats.
    static func seqsToCheck(_ batch: EntryBatch, held: UInt64, base: PrunedHead? = nil) throws -> ClosedRange<UInt64>? {
        let first = batch.entries[0].header.seq
        // Entries at or below a base are not held and cannot be checked: a device sends from past the relay's STATE.
        if let base, first <= base.seq { throw SyncRejection.brokenChain }
        // The batch must start within or right after what is held (no gap).
        guard first >= 1, first <= held + 1 else { throw SyncRejection.brokenChain }
        let low = first == 1 ? 1 : first - 1
        let high = min(held, batch.head.seq)
        return low <= high ? low...high : nil
    }

    /// The entries of `batch` to store: it links to `hashes[first - 1]` and repeats held entries exactly (else
    /// `fork`); throws what `EntryChain.verifyLinks` throws.
    static func fresh(_ batch: EntryBatch, space: SpaceID, held: UInt64, hashes: [UInt64: [UInt8]]) throws -> [SealedEntry] {
        let first = batch.entries[0].header.seq
        let previous = first == 1 ? nil : hashes[first - 1]
        if first > 1, previous == nil { throw SyncRejection.brokenChain }
        try EntryChain.verifyLinks(batch.entries, head: batch.head, previousHash: previous, space: space)
        var out: [SealedEntry] = []
        for e in batch.entries {
            if e.header.seq <= held {
                guard hashes[e.header.seq] == e.hash else { throw SyncRejection.fork }
            } else {
                out.append(e)
            }
        }
        return out
    }

    /// The acknowledgements of `acks` a relay keeps for `space`: of this space, signed by a key the log lists for
    /// their node (only a log names members: a space without one keeps none, as nothing is stable there, SYNC.md
    /// §11), and at most `maxAckBytes` each. The latest per signer is kept, so what a space holds is bounded by its log.
    static func acceptableAcks(_ acks: [Acknowledgement], space: SpaceID, membership: MembershipState?) -> [Acknowledgement] {
        guard let membership else { return [] }
        var latest: [[UInt8]: Acknowledgement] = [:]
        for ack in acks where ack.space == space && ack.bytes.count <= maxAckBytes {
            guard let member = membership.member(ack.node), member.keys.signing == ack.deviceKey else { continue }
            if let held = latest[ack.node], held.issuedMs >= ack.issuedMs { continue }
            latest[ack.node] = ack
        }
        return latest.values.sorted { $0.node.lexicographicallyPrecedes($1.node) }
    }

    /// The statements of entry formats of `statements` a relay keeps for `space` (SYNC.md §6, "Entry formats"): of
    /// this space, signed by a key the log lists for their node (a space without a log keeps none), the latest per
    /// signer, so what a space holds is bounded by its log.
    static func acceptableFormats(_ statements: [FormatStatement], space: SpaceID, membership: MembershipState?) -> [FormatStatement] {
        guard let membership else { return [] }
        var latest: [[UInt8]: FormatStatement] = [:]
        for s in statements where s.space == space {
            // The signer first (a current member with that key, since it was last added), then the signature.
            guard let member = membership.member(s.node), member.isCurrent, member.keys.signing == s.deviceKey,
                s.issuedMs >= member.addedAtMs
            else { continue }
            if let held = latest[s.node], held.issuedMs >= s.issuedMs { continue }
            guard s.isSigned else { continue }
            latest[s.node] = s
        }
        return latest.values.sorted { $0.node.lexicographicallyPrecedes($1.node) }
    }

    /// Checks the manifest that opens an upload before any piece is taken (SYNC.md §11): of this space, declaring as
    /// many pieces as its size can hold (and no fewer than it needs), signed by the device this connection proved
    /// (`device`), which the log lists with that key as a current writing member. `badSnapshot` otherwise. Its size
    /// against the relay's limit is the caller's (`SnapshotUploadLimits`): a larger one is declined, not refused.
    static func checkManifest(
        _ manifest: SnapshotManifest, space: SpaceID, membership: MembershipState?, device: DevicePublicKeys?
    ) throws(SyncRejection) {
        guard manifest.space == space, UInt64(manifest.parts) * UInt64(SnapshotPart.minBytes) <= manifest.size,
            manifest.size <= UInt64(manifest.parts) * UInt64(SnapshotPart.maxBytes), let device,
            manifest.authorKey == device.signing, let membership, let author = membership.member(device.nodeID),
            author.isCurrent, author.role.writes, author.keys == device
        else { throw .badSnapshot }
    }

    /// Whether `manifest` may replace `held` given the bases it would keep: more recent, and covering every base.
    static func supersedes(_ manifest: SnapshotManifest, held: SnapshotManifest?, bases: [NodeID: PrunedHead]) -> Bool {
        if let held, held.createdMs >= manifest.createdMs { return false }
        return bases.allSatisfy { origin, base in (manifest.heads[origin.bytes]?.seq ?? 0) >= base.seq }
    }

    /// The origins whose held entries (`held`: highest seq per origin) end below what `manifest` covers: each gets
    /// the manifest's head as its base.
    static func newBases(_ manifest: SnapshotManifest, held: [NodeID: UInt64]) -> [NodeID: PrunedHead] {
        var out: [NodeID: PrunedHead] = [:]
        for (origin, head) in manifest.heads where head.seq > 0 {
            let node = NodeID(bytes: origin)
            if (held[node] ?? 0) < head.seq { out[node] = PrunedHead(seq: head.seq, hash: head.hash) }
        }
        return out
    }

    /// The largest acknowledgement a relay keeps (about 10,000 origins); a larger one is passed on by members only.
    static let maxAckBytes = 256 << 10

    /// Throws `overQuota` when `entries` and `bytes` (after the batch) exceed the space's limits.
    static func checkQuota(entries: Int, bytes: Int, limits: RelayLimits) throws {
        guard entries <= limits.maxEntriesPerSpace, bytes <= limits.maxBytesPerSpace else { throw SyncRejection.overQuota }
    }

    /// Whether a batch may be read after `after` at all (`after` comes from a device's STATE: bounded before it
    /// takes part in arithmetic, SYNC.md §8).
    static func readable(after: UInt64, maxEntries: Int) -> Bool {
        after < SyncBounds.maxSeq && (1...1_000_000).contains(maxEntries)
    }

    /// Where a batch read after `after` ends: the furthest of `heads` (those within `maxEntries`) whose entries fit
    /// in `maxBytes` (`sizes`: seq and length of each entry within reach, in order), else `nearest`, the first head
    /// past `after`.
    static func batchEnd(heads: [Int64], nearest: Int64, sizes: [(seq: Int64, length: Int)], maxBytes: Int) -> Int64 {
        var end = nearest
        var bytes = 0
        let headSet = Set(heads)
        for (seq, length) in sizes {
            bytes += length
            guard bytes <= maxBytes else { break }
            if headSet.contains(seq) { end = max(end, seq) }
        }
        return end
    }
}
