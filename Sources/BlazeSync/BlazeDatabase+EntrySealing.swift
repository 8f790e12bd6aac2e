import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeWire
import Foundation

/// A batch whose entries verified, with their decoded changes, ready to be stored.
public struct VerifiedBatch: Sendable {
    /// The batch as received.
    public let batch: EntryBatch
    /// Its changes, in entry order.
    public let changes: [Change]
    /// Each change's text as its entry carried it (what the op log stores, instead of encoding the change again).
    public var texts: [[UInt8]] = []

    /// The most batches a receiver stores in one transaction (`BlazeDatabase.store(group:)`) while no other write
    /// waits for the database: a device catching up reads and writes a document once for all the changes a group
    /// makes to it, and writes each page once per group. A group also ends at the batch that brings its transaction to
    /// `SyncLogStore.maxGroupDocuments` documents, which bounds its memory when its changes touch many documents.
    public static let maxGroup = 24
    /// The most batches a receiver stores in one transaction while another write waits (`BlazeDatabase.writesWaiting`),
    /// whether it waited when the group formed or began to wait while it is stored: a local write waits for a short
    /// transaction, not a long one.
    public static let maxGroupWhileOthersWait = 4

    /// The most batches to store in the next transaction of a receiver of `db`.
    static func groupLimit(_ db: BlazeDatabase) -> Int { db.writesWaiting ? maxGroupWhileOthersWait : maxGroup }

    /// The batch as the store records it.
    var received: ReceivedBatch {
        ReceivedBatch(
            origin: batch.origin, entries: batch.entries.map { SyncLogEntry(seq: $0.header.seq, hash: $0.hash, bytes: $0.bytes) },
            firstPrev: batch.entries[0].header.prev, changes: changes, texts: texts.count == changes.count ? texts : nil,
            head: (batch.head.seq, batch.head.bytes))
    }

    /// A verified batch of `changes` (with their `texts`, as their entries carried them).
    public init(batch: EntryBatch, changes: [Change], texts: [[UInt8]] = []) {
        self.batch = batch
        self.changes = changes
        self.texts = texts
    }
}

/// The cryptographic side of a database's sync log, over the store's `SyncLogStore` (which keeps the bytes): sealing local changes into entries and signing heads, reading
/// batches back as sealed entries, verifying received batches before the store records them (ARCHITECTURE.md, "Sync
/// and transports").
///
/// Local changes are sealed soon after they commit (`SyncEngine+Sealing`) and before a session sends, in order and once: the hash chain of this replica's
/// origin is fixed the moment an entry is stored. Entries of other origins are stored exactly as received, after
/// verification, so forwarding them keeps their origin's signatures intact.
extension BlazeDatabase {
    /// Seals this replica's changes that have no entry yet, in order, signing one head per `batch` entries or
    /// `headBytes` bytes of entries, whichever comes first (and one for the last), so that a batch between two heads
    /// always fits a frame. Returns how many were sealed. `fullBatchesOnly` and `continuing` as in
    /// `SyncLogStore.sealPending` (the background sealing seals whole batches only, and stops when the daemon does).
    /// Entries are sealed in the newest format every member of `membership` opens (`sealingFormat`).
    @discardableResult
    public func sealLocal(
        key: SpaceKey, identity: DeviceIdentity, membership: MembershipState? = nil, batch: Int = 1000,
        headBytes: Int = 1 << 20, fullBatchesOnly: Bool = false, continuing: () -> Bool = { true }
    ) throws -> Int {
        // A device holding no key to seal with (a reader, a removed member, a joiner) publishes nothing.
        guard key.canSeal else { return 0 }
        let node = self.node
        return try syncLog.sealPending(batch: batch, fullBatchesOnly: fullBatchesOnly, continuing: continuing) {
            lastSeq, lastHash, bodies in
            var seq = lastSeq
            var prev = lastHash ?? SealedEntry.genesis
            let format = try self.sealingFormat(membership: membership)
            var entries: [SyncLogEntry] = []
            var heads: [(seq: UInt64, bytes: [UInt8])] = []
            var unsigned: SealedEntry?
            var unsignedBytes = 0
            func signHead() {
                guard let entry = unsigned else { return }
                heads.append((entry.header.seq, SignedHead(signing: entry, identity: identity).bytes))
                unsigned = nil
                unsignedBytes = 0
            }
            for body in bodies {
                seq += 1
                let entry = SealedEntry.seal(Array(body.utf8), space: key, origin: node.bytes, seq: seq, prev: prev, format: format)
                entries.append(SyncLogEntry(seq: seq, hash: entry.hash, bytes: entry.bytes))
                prev = entry.hash
                unsigned = entry
                unsignedBytes += entry.bytes.count
                if unsignedBytes >= headBytes { signHead() }
            }
            signHead()
            return (entries, heads)
        }
    }

    /// The latest head held for `origin`, nil when none.
    public func latestHead(origin: NodeID) throws -> SignedHead? {
        try syncLog.latestHeadBytes(origin: origin).map { try SignedHead(bytes: $0[...]) }
    }

    /// The next batch of `origin`'s entries after `after`: up to the furthest head within `maxEntries` entries and
    /// `maxBytes` bytes, or to the nearest head when that is further. Nil when no head lies beyond `after`.
    public func entryBatch(origin: NodeID, after: UInt64, maxEntries: Int, maxBytes: Int = 4 << 20) throws -> EntryBatch? {
        guard let range = try syncLog.entryRange(origin: origin, after: after, maxEntries: maxEntries, maxBytes: maxBytes) else {
            return nil
        }
        return EntryBatch(
            origin: origin, entries: try range.entries.map { try SealedEntry(stored: $0.bytes, hash: $0.hash) },
            head: try SignedHead(bytes: range.head[...]))
    }

    /// Verifies a batch from a peer and, only if all of it verifies, stores its entries and head and applies its
    /// changes in one transaction. Throws `SyncRejection` (nothing stored) for anything that does not verify, including
    /// a fork: an entry that differs from the one held for the same origin and sequence.
    public func receive(batch: EntryBatch, key: SpaceKey, membership: MembershipState? = nil) throws -> BatchOutcome {
        try store(try verify(batch: batch, key: key, membership: membership))
    }

    /// The first half of `receive`: checks a batch's signature, AEAD and links and decodes its changes, without touching
    /// the database (so it can run while the previous batch is being stored). In a space with a membership log, every
    /// entry's origin must be a writing member, or a removed one within its removal's cutoff.
    public func verify(batch: EntryBatch, key: SpaceKey, membership: MembershipState? = nil) throws(SyncRejection)
        -> VerifiedBatch
    {
        guard batch.head.origin == batch.origin.bytes, !batch.entries.isEmpty else { throw .malformed }
        if let membership {
            guard let member = membership.member(batch.origin.bytes) else { throw .notMember }
            guard member.role.writes else { throw .reader }
            guard member.acceptsEntries(upTo: batch.head.seq, hashAt: batch.hash(at:)) else { throw .revoked }
        }
        let payloads = try EntryChain.verify(batch.entries, head: batch.head, previousHash: nil, key: key)
        var changes: [Change] = []
        changes.reserveCapacity(payloads.count)
        var texts: [[UInt8]] = []
        texts.reserveCapacity(payloads.count)
        let now = UInt64(max(0, Date().timeIntervalSince1970 * 1000))
        for (entry, payload) in zip(batch.entries, payloads) {
            // A document's values sit four levels into its change ({x: [{set: {field: value}}]}).
            guard let change = try? Change(text: payload, maxDepth: limits.maxDepth + 4), change.origin == batch.origin,
                change.seq == entry.header.seq
            else { throw .badPayload }
            guard (try? syncLog.checkReceived(change, size: payload.count)) != nil else { throw .invalidChange }
            do {
                try ChangeBounds.checkClock(change, now: now, maxAhead: limits.maxClockAheadMilliseconds)
            } catch {
                throw .clockAhead
            }
            changes.append(change)
            texts.append(payload)
        }
        return VerifiedBatch(batch: batch, changes: changes, texts: texts)
    }

    /// The second half of `receive`: in one transaction, checks the batch continues the log held here, refuses forks,
    /// skips duplicates, stores entries and head, and applies the new changes.
    public func store(_ verified: VerifiedBatch) throws -> BatchOutcome {
        let r = verified.received
        do {
            return try syncLog.recordEntries(
                origin: r.origin, r.entries, firstPrev: r.firstPrev, changes: r.changes, texts: r.texts, head: r.head)
        } catch let conflict as SyncLogConflict {
            switch conflict {
            case .quarantined: throw SyncRejection.quarantined
            case .brokenChain: throw SyncRejection.brokenChain
            case .fork: throw SyncRejection.fork
            case .tooManyParked: throw SyncRejection.tooManyParked
            }
        }
    }

    /// Stores several verified batches, in order, as `store` does but in one transaction. Nil, with nothing stored,
    /// when any of them would be refused (`SyncRejection`): store them one by one then, for each one's verdict.
    /// Past `VerifiedBatch.maxGroupWhileOthersWait` batches it stops early while another write waits for the
    /// database, and after the batch that brings it to `maxDocuments` documents held: the outcomes then cover the
    /// first batches only, and the rest are for a later transaction.
    public func store(group: [VerifiedBatch], maxDocuments: Int = SyncLogStore.maxGroupDocuments) throws -> [BatchOutcome]? {
        try syncLog.recordEntries(
            group: group.map(\.received), yieldAfter: VerifiedBatch.maxGroupWhileOthersWait, maxDocuments: maxDocuments)
    }

    /// Stores the evidence of a fork of `head.origin`: `head` (verified here) signs `hash` at `seq`, while the entry
    /// held here at that seq is another one. Returns false when there is no such evidence. From then on the origin is
    /// quarantined (`SyncRejection.quarantined`); the first evidence per origin is kept.
    @discardableResult
    public func recordFork(head: SignedHead, seq: UInt64, hash: [UInt8], key: SpaceKey) throws -> Bool {
        try head.verify(space: key.id)
        return try syncLog.recordForkEvidence(origin: NodeID(bytes: head.origin), seq: seq, hash: hash, otherHead: head.bytes)
    }

    /// Stores the fork evidence a verified batch carries: its first entry that differs from the one held for the same
    /// origin and seq (`recordFork(head:seq:hash:key:)`). Returns false when the batch differs from nothing held.
    @discardableResult
    public func recordFork(batch: EntryBatch, key: SpaceKey) throws -> Bool {
        for entry in batch.entries {
            if try recordFork(head: batch.head, seq: entry.header.seq, hash: entry.hash, key: key) { return true }
        }
        return false
    }

    /// Checks an origin's own latest head (as its device announces it) against what is held for that origin:
    /// `.fork` when the entry held at the head's sequence is another one, `.rollback` when a later head is held.
    public func checkOwnHead(_ head: SignedHead, key: SpaceKey) throws {
        try head.verify(space: key.id)
        let origin = NodeID(bytes: head.origin)
        if let held = try syncLog.heldHash(origin: origin, seq: head.seq), held != head.hash { throw SyncRejection.fork }
        if let latest = try syncLog.latestHeadSeq(origin: origin), latest > head.seq { throw SyncRejection.rollback }
    }
}
