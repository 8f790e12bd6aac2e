import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import Foundation
import GRDB

/// Consecutive sealed entries of one origin, ending at a head that origin signed: the unit peers exchange.
public struct EntryBatch: Sendable {
    /// The origin of every entry.
    public var origin: NodeID
    /// The entries, in sequence order.
    public var entries: [SealedEntry]
    /// The origin's signature over the last entry.
    public var head: SignedHead

    /// Creates a batch.
    public init(origin: NodeID, entries: [SealedEntry], head: SignedHead) {
        self.origin = origin
        self.entries = entries
        self.head = head
    }

    /// Bytes of its entries.
    public var byteCount: Int { entries.reduce(0) { $0 + $1.bytes.count } }
}

/// A batch whose entries verified, with their decoded changes, ready to be stored.
public struct VerifiedBatch: Sendable {
    /// The batch as received.
    public let batch: EntryBatch
    /// Its changes, in entry order.
    public let changes: [Change]
}

/// Two entries one origin signed for the same sequence number: proof that its log forked.
public struct ForkEvidence: Sendable, Equatable {
    /// The forked origin (quarantined).
    public var origin: NodeID
    /// The sequence number with two entries.
    public var seq: UInt64
    /// Hash of the entry held here.
    public var heldHash: [UInt8]
    /// Hash of the other entry, which a head signed by the origin covers.
    public var otherHash: [UInt8]
    /// When it was found (Unix milliseconds).
    public var detectedAtMs: Int64
}

/// What receiving a verified batch did.
public struct BatchOutcome: Sendable, Equatable {
    /// Entries stored for the first time.
    public var stored = 0
    /// Entries already held (same hash).
    public var duplicates = 0
    /// What applying their changes did.
    public var report = ReceiveReport()
}

/// The database's side of sync (DESIGN §8): its space, its sealed entries and heads, its peers.
///
/// Local changes are sealed lazily, when sync first needs them, in order and once: the hash chain of this replica's
/// origin is fixed the moment an entry is stored. Entries of other origins are stored exactly as received, after
/// verification, in the same transaction that applies their changes, so forwarding them keeps their origin's
/// signatures intact and a crash never separates an entry from its change.
extension BlazeDatabase {
    /// The space this database syncs in (hex), nil while it is not shared.
    public func spaceID() throws -> String? {
        try read { db in try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'space_id'") }
    }

    /// Binds the database to a space; refuses to change an existing binding.
    public func setSpaceID(_ idHex: String) throws {
        try pool.write { db in
            if let current = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'space_id'") {
                guard current == idHex else {
                    throw StoreError(.alreadyExists, kind: "already_shared", "database \(name) already syncs in space \(current)")
                }
                return
            }
            try db.execute(sql: "INSERT INTO meta(key, value) VALUES ('space_id', ?)", arguments: [idHex])
        }
    }

    /// Per origin, the highest sequence this replica holds, applied or stored as an entry: what peers need not send.
    public func syncVector() throws -> [NodeID: UInt64] {
        try read { db in
            var out = try self.makeStorage(db).versionVector().entries
            // Entries exist only for origins that were applied or parked; one index probe each (a GROUP BY over
            // sync_entries would scan every entry, on every sync round).
            let parked = try String.fetchAll(db, sql: "SELECT DISTINCT origin FROM parked").compactMap { NodeID(hex: $0) }
            let probe = try db.cachedStatement(sql: "SELECT max(seq) FROM sync_entries WHERE origin = ?")
            for origin in Set(Array(out.keys) + parked) {
                if let seq = try Int64.fetchOne(probe, arguments: [Data(origin.bytes)]) {
                    out[origin] = max(out[origin] ?? 0, UInt64(seq))
                }
            }
            return out
        }
    }

    /// Seals this replica's changes that have no entry yet, in order, signing one head per `batch` entries or
    /// `headBytes` bytes of entries, whichever comes first (and one for the last), so that a batch between two heads
    /// always fits a frame. Returns how many were sealed.
    @discardableResult
    public func sealLocal(key: SpaceKey, identity: DeviceIdentity, batch: Int = 1000, headBytes: Int = 1 << 20) throws
        -> Int
    {
        let origin = Data(node.bytes)
        var sealed = 0
        while true {
            // One transaction per batch: the writer is never held for a whole backlog.
            let n = try pool.write { db -> Int in
                let last = try Row.fetchOne(
                    db, sql: "SELECT seq, hash FROM sync_entries WHERE origin = ? ORDER BY seq DESC LIMIT 1", arguments: [origin])
                var seq = UInt64(last.map { $0[0] as Int64 } ?? 0)
                var prev = last.map { Array($0[1] as Data) } ?? SealedEntry.genesis
                let bodies = try String.fetchAll(
                    db, sql: "SELECT body FROM changes WHERE origin = ? AND seq > ? ORDER BY seq LIMIT ?",
                    arguments: [node.hex, Int64(seq), batch])
                var unsigned: SealedEntry?
                var unsignedBytes = 0
                func signHead() throws {
                    guard let entry = unsigned else { return }
                    let head = SignedHead(signing: entry, identity: identity)
                    try db.execute(
                        sql: "INSERT INTO sync_heads(origin, seq, head) VALUES (?, ?, ?)",
                        arguments: [origin, Int64(entry.header.seq), Data(head.bytes)])
                    unsigned = nil
                    unsignedBytes = 0
                }
                for body in bodies {
                    seq += 1
                    let entry = SealedEntry.seal(Array(body.utf8), space: key, origin: node.bytes, seq: seq, prev: prev)
                    try db.cachedStatement(sql: "INSERT INTO sync_entries(origin, seq, hash, bytes) VALUES (?, ?, ?, ?)")
                        .execute(arguments: [origin, Int64(seq), Data(entry.hash), Data(entry.bytes)])
                    prev = entry.hash
                    unsigned = entry
                    unsignedBytes += entry.bytes.count
                    if unsignedBytes >= headBytes { try signHead() }
                }
                try signHead()
                return bodies.count
            }
            sealed += n
            if n < batch { return sealed }
        }
    }

    /// The latest head held for `origin`, nil when none.
    public func latestHead(origin: NodeID) throws -> SignedHead? {
        try read { db in
            try Data.fetchOne(
                db, sql: "SELECT head FROM sync_heads WHERE origin = ? ORDER BY seq DESC LIMIT 1", arguments: [Data(origin.bytes)]
            ).map { try SignedHead(bytes: Array($0)[...]) }
        }
    }

    /// The next batch of `origin`'s entries after `after`: up to the furthest head within `maxEntries` entries and
    /// `maxBytes` bytes, or to the nearest head when that is further. Nil when no head lies beyond `after`.
    public func entryBatch(origin: NodeID, after: UInt64, maxEntries: Int, maxBytes: Int = 4 << 20) throws -> EntryBatch? {
        try read { db in
            let o = Data(origin.bytes)
            let heads = try Int64.fetchAll(
                db, sql: "SELECT seq FROM sync_heads WHERE origin = ? AND seq > ? AND seq <= ? ORDER BY seq",
                arguments: [o, Int64(after), Int64(after) + Int64(maxEntries)])
            var within: Int64?
            if let furthest = heads.last {
                // length() of a blob is read from the record header: no entry is read here.
                let sizes = try Row.fetchAll(
                    db, sql: "SELECT seq, length(bytes) FROM sync_entries WHERE origin = ? AND seq > ? AND seq <= ? ORDER BY seq",
                    arguments: [o, Int64(after), furthest])
                var bytes = 0
                var remaining = heads[...]
                for row in sizes {
                    bytes += row[1] as Int
                    guard bytes <= maxBytes else { break }
                    let seq: Int64 = row[0]
                    if seq == remaining.first {
                        within = seq
                        remaining = remaining.dropFirst()
                    }
                }
            }
            let nearest = try Int64.fetchOne(
                db, sql: "SELECT min(seq) FROM sync_heads WHERE origin = ? AND seq > ?", arguments: [o, Int64(after)])
            guard let end = within ?? nearest,
                let headBytes = try Data.fetchOne(
                    db, sql: "SELECT head FROM sync_heads WHERE origin = ? AND seq = ?", arguments: [o, end])
            else { return nil }
            let rows = try Row.fetchAll(
                db, sql: "SELECT bytes, hash FROM sync_entries WHERE origin = ? AND seq > ? AND seq <= ? ORDER BY seq",
                arguments: [o, Int64(after), end])
            // Entries below a head are always stored with it; a gap means the log was damaged on disk.
            guard rows.count == Int(end - Int64(after)) else {
                throw StoreError(.internalFailure, kind: "corrupt_sync_log", "entries of \(origin) after \(after) are missing")
            }
            return EntryBatch(
                origin: origin, entries: try rows.map { try SealedEntry(stored: Array($0[0] as Data), hash: Array($0[1] as Data)) },
                head: try SignedHead(bytes: Array(headBytes)[...]))
        }
    }

    /// Verifies a batch from a peer and, only if all of it verifies, stores its entries and head and applies its
    /// changes in one transaction. Throws `SyncRejection` (nothing stored) for anything that does not verify, including
    /// a fork: an entry that differs from the one held for the same origin and sequence.
    public func receive(batch: EntryBatch, key: SpaceKey) throws -> BatchOutcome {
        try store(try verify(batch: batch, key: key))
    }

    /// The first half of `receive`: checks a batch's signature, AEAD and links and decodes its changes, without touching
    /// the database (so it can run while the previous batch is being stored).
    public func verify(batch: EntryBatch, key: SpaceKey) throws(SyncRejection) -> VerifiedBatch {
        guard batch.head.origin == batch.origin.bytes, !batch.entries.isEmpty else { throw .malformed }
        let payloads = try EntryChain.verify(batch.entries, head: batch.head, previousHash: nil, key: key)
        var changes: [Change] = []
        changes.reserveCapacity(payloads.count)
        let now = Self.nowMilliseconds()
        for (entry, payload) in zip(batch.entries, payloads) {
            // A document's values sit four levels into its change ({x: [{set: {field: value}}]}).
            guard let json = try? JSONParser(maxDepth: limits.maxDepth + 4).parse(String(decoding: payload, as: UTF8.self)),
                let change = try? Change(json: json), change.origin == batch.origin, change.seq == entry.header.seq
            else { throw .badPayload }
            guard (try? validate(change, size: payload.count)) != nil else { throw .invalidChange }
            do {
                try ChangeBounds.checkClock(change, now: now, maxAhead: limits.maxClockAheadMilliseconds)
            } catch {
                throw .clockAhead
            }
            changes.append(change)
        }
        return VerifiedBatch(batch: batch, changes: changes)
    }

    /// The second half of `receive`: in one transaction, checks the batch continues the log held here, refuses forks,
    /// skips duplicates, stores entries and head, and applies the new changes.
    public func store(_ verified: VerifiedBatch) throws -> BatchOutcome {
        let batch = verified.batch
        let changes = verified.changes
        let first = batch.entries[0]
        let o = Data(batch.origin.bytes)
        let firstSeq = first.header.seq
        return try pool.write { db in
            var outcome = BatchOutcome()
            var fresh: [Change] = []
            guard try !Self.isQuarantined(o, db) else { throw SyncRejection.quarantined }
            let held = try db.cachedStatement(sql: "SELECT hash FROM sync_entries WHERE origin = ? AND seq = ?")
            if firstSeq > 1 {
                // A batch must continue the log held here: no gap, and linked to the entry before it.
                guard let before = try Data.fetchOne(held, arguments: [o, Int64(firstSeq - 1)]),
                    Array(before) == first.header.prev
                else { throw SyncRejection.brokenChain }
            }
            for (entry, change) in zip(batch.entries, changes) {
                let hash = entry.hash
                if let existing = try Data.fetchOne(held, arguments: [o, Int64(entry.header.seq)]) {
                    guard Array(existing) == hash else { throw SyncRejection.fork }
                    outcome.duplicates += 1
                    continue
                }
                try db.cachedStatement(sql: "INSERT INTO sync_entries(origin, seq, hash, bytes) VALUES (?, ?, ?, ?)")
                    .execute(arguments: [o, Int64(entry.header.seq), Data(hash), Data(entry.bytes)])
                outcome.stored += 1
                fresh.append(change)
            }
            try db.execute(
                sql: "INSERT OR IGNORE INTO sync_heads(origin, seq, head) VALUES (?, ?, ?)",
                arguments: [o, Int64(batch.head.seq), Data(batch.head.bytes)])
            if !fresh.isEmpty { outcome.report = try self.receive(fresh, in: db) }
            return outcome
        }
    }

    private static func isQuarantined(_ origin: Data, _ db: Database) throws -> Bool {
        try Bool.fetchOne(
            db, sql: "SELECT EXISTS(SELECT 1 FROM sync_forks WHERE origin = ?)", arguments: [origin]) ?? false
    }

    /// Stores the evidence of a fork of `head.origin`: `head` (verified) signs `hash` at `seq`, while the entry held
    /// here at that seq is another one. Returns false when there is no such evidence (nothing held at that seq, or
    /// the same entry). From then on the origin is quarantined (`SyncRejection.quarantined`); the first evidence
    /// per origin is kept.
    @discardableResult
    public func recordFork(head: SignedHead, seq: UInt64, hash: [UInt8], key: SpaceKey) throws -> Bool {
        try head.verify(space: key.id)
        let o = Data(head.origin)
        return try pool.write { db in
            guard SyncBounds.isValidSeq(seq),
                let held = try Data.fetchOne(
                    db, sql: "SELECT hash FROM sync_entries WHERE origin = ? AND seq = ?", arguments: [o, Int64(seq)]),
                Array(held) != hash
            else { return false }
            try db.execute(
                sql: "INSERT OR IGNORE INTO sync_forks(origin, seq, held_hash, other_hash, other_head, detected_at) "
                    + "VALUES (?, ?, ?, ?, ?, ?)",
                arguments: [o, Int64(seq), held, Data(hash), Data(head.bytes), Int64(Date().timeIntervalSince1970 * 1000)])
            return true
        }
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

    /// Evidence of the forks found in this database's space, one per quarantined origin.
    public func forks() throws -> [ForkEvidence] {
        try read { db in
            try Row.fetchAll(
                db, sql: "SELECT origin, seq, held_hash, other_hash, detected_at FROM sync_forks ORDER BY origin"
            ).map { row in
                ForkEvidence(
                    origin: NodeID(bytes: Array(row[0] as Data)), seq: UInt64(row[1] as Int64),
                    heldHash: Array(row[2] as Data), otherHash: Array(row[3] as Data), detectedAtMs: row[4])
            }
        }
    }

    /// Checks an origin's own latest head (as its device announces it) against what is held for that origin:
    /// `.fork` when the entry held at the head's sequence is another one, `.rollback` when a later head is held.
    public func checkOwnHead(_ head: SignedHead, key: SpaceKey) throws {
        try head.verify(space: key.id)
        let o = Data(head.origin)
        try read { db in
            if let held = try Data.fetchOne(
                db, sql: "SELECT hash FROM sync_entries WHERE origin = ? AND seq = ?", arguments: [o, Int64(head.seq)]),
                Array(held) != head.hash
            {
                throw SyncRejection.fork
            }
            if let latest = try Int64.fetchOne(db, sql: "SELECT max(seq) FROM sync_heads WHERE origin = ?", arguments: [o]),
                latest > Int64(head.seq)
            {
                throw SyncRejection.rollback
            }
        }
    }

    /// Addresses of the peers this database syncs with.
    public func peers() throws -> [String] {
        try read { db in try String.fetchAll(db, sql: "SELECT address FROM sync_peers ORDER BY address") }
    }

    /// Adds a peer address; returns false when it was already there.
    public func addPeer(_ address: String) throws -> Bool {
        try pool.write { db in
            try db.execute(
                sql: "INSERT OR IGNORE INTO sync_peers(address, added_at) VALUES (?, ?)",
                arguments: [address, Int64(Date().timeIntervalSince1970 * 1000)])
            return db.changesCount > 0
        }
    }

    /// Removes a peer address; returns false when it was not there.
    public func removePeer(_ address: String) throws -> Bool {
        try pool.write { db in
            try db.execute(sql: "DELETE FROM sync_peers WHERE address = ?", arguments: [address])
            return db.changesCount > 0
        }
    }
}
