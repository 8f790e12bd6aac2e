import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDB

/// The owner of a database's sync log as storage (ARCHITECTURE.md, "Sync and transports"): its space binding, sealed
/// entries and signed heads as opaque bytes (`sync_entries`, `sync_heads`, `sync_pruned`) and fork evidence
/// (`sync_forks`). Sealing, signing and verifying are BlazeSync's (`BlazeDatabase+EntrySealing` there); the store only
/// keeps the bytes, and stores received entries in the same transaction that applies their changes, so a crash never
/// separates an entry from its change. It holds no state of its own beyond those tables: a value made on demand
/// (`BlazeDatabase.syncLog`).
public struct SyncLogStore: Sendable {
    /// The database whose sync log this is.
    let database: BlazeDatabase

    /// The sync log of `database`.
    init(_ database: BlazeDatabase) { self.database = database }

    /// The space this database syncs in (hex), nil while it is not shared.
    public func spaceID() throws -> String? {
        try database.read { db in try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'space_id'") }
    }

    /// Binds the database to a space; refuses to change an existing binding.
    public func setSpaceID(_ idHex: String) throws {
        try database.connections.write { db in
            if let current = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'space_id'") {
                guard current == idHex else {
                    throw StoreError(.alreadyExists, kind: "already_shared", "database \(database.name) already syncs in space \(current)")
                }
                return
            }
            try db.execute(sql: "INSERT INTO meta(key, value) VALUES ('space_id', ?)", arguments: [idHex])
        }
    }

    /// Per origin, the highest sequence this replica holds, applied or stored as an entry: what peers need not send.
    public func syncVector() throws -> [NodeID: UInt64] {
        try database.read { db in
            // The applied vector, from memory when the writer knows it: every sync round reads this, and a space
            // with many origins (a legacy space's token holder can mint them) would cost a table read each time.
            var out = try database.committedVersions.peek()?.entries ?? database.makeStorage(db).versionVector().entries
            // An origin's entries go beyond its applied seq only while changes of it are parked (entries are stored
            // with their changes, which apply or park in the same transaction): one index probe per parked origin.
            let parked = try String.fetchAll(db, sql: "SELECT DISTINCT origin FROM parked").compactMap { NodeID(hex: $0) }
            let probe = try db.cachedStatement(sql: "SELECT max(seq) FROM sync_entries WHERE origin = ?")
            for origin in parked {
                if let seq = try Int64.fetchOne(probe, arguments: [Data(origin.bytes)]) {
                    out[origin] = max(out[origin] ?? 0, UInt64(seq))
                }
            }
            return out
        }
    }

    /// Seals this replica's own changes that have no entry yet, in order, `batch` changes at a time: `seal` gets the
    /// last entry's sequence and hash (nil before the first) and the next change bodies, and returns their entries
    /// and the heads to store with them. Returns how many were sealed.
    ///
    /// The bodies are read and sealed outside the writer, which only stores the result (a transaction per batch), so
    /// sealing runs beside local writes and received batches instead of holding them up. Two sealers may race (a
    /// session's and the background one): the store checks that the log still ends where the sealing began, and the
    /// one that lost seals again from the new end.
    @discardableResult
    public func sealPending(
        batch: Int, _ seal: (_ lastSeq: UInt64, _ lastHash: [UInt8]?, _ bodies: [String]) throws -> (
            entries: [SyncLogEntry], heads: [(seq: UInt64, bytes: [UInt8])]
        )
    ) throws -> Int {
        let node = database.node
        let origin = Data(node.bytes)
        var sealed = 0
        while true {
            let (end, rows) = try database.read { db in
                let end = try Self.chainEnd(origin, db)
                let rows = try Row.fetchAll(
                    db, sql: "SELECT seq, body FROM changes WHERE origin = ? AND seq > ? ORDER BY seq LIMIT ?",
                    arguments: [node.hex, Int64(end?.seq ?? 0), batch])
                return (end, rows.map { (seq: UInt64($0[0] as Int64), body: $0[1] as String) })
            }
            guard let first = rows.first else { return sealed }
            var seq = end?.seq ?? 0
            var lastHash = end?.hash
            // Compaction pruned the changes before `first` while no entry was sealed (the database was not shared): the
            // chain starts after them, and joiners get those changes in a snapshot.
            let startsAfterPruned = first.seq != seq + 1
            if startsAfterPruned {
                guard end == nil else {
                    throw StoreError(.internalFailure, kind: "corrupt_sync_log", "changes of \(node) after \(seq) are missing")
                }
                seq = first.seq - 1
                lastHash = PrunedHead.chainStart
            }
            let (entries, heads) = try seal(seq, lastHash, rows.map(\.body))
            let stored = try database.connections.write { db -> Bool in
                let now = try Self.chainEnd(origin, db)
                guard now?.seq == end?.seq, now?.hash == end?.hash else { return false }
                if startsAfterPruned {
                    try db.execute(
                        sql: "INSERT INTO sync_pruned(origin, seq, hash) VALUES (?, ?, ?)",
                        arguments: [origin, Int64(seq), Data(PrunedHead.chainStart)])
                }
                let insert = try db.cachedStatement(sql: "INSERT INTO sync_entries(origin, seq, hash, bytes) VALUES (?, ?, ?, ?)")
                for e in entries {
                    try insert.execute(arguments: [origin, Int64(e.seq), Data(e.hash), Data(e.bytes)])
                }
                for h in heads {
                    try db.execute(
                        sql: "INSERT INTO sync_heads(origin, seq, head) VALUES (?, ?, ?)", arguments: [origin, Int64(h.seq), Data(h.bytes)])
                }
                return true
            }
            // Another sealer stored first: seal again from where the log ends now.
            guard stored else { continue }
            sealed += rows.count
            if rows.count < batch { return sealed }
        }
    }

    /// Where `origin`'s chain ends as `db` sees it: its last entry held, or else the last one pruned; nil before the
    /// first.
    private static func chainEnd(_ origin: Data, _ db: Database) throws -> (seq: UInt64, hash: [UInt8])? {
        let row =
            try Row.fetchOne(
                db.cachedStatement(sql: "SELECT seq, hash FROM sync_entries WHERE origin = ? ORDER BY seq DESC LIMIT 1"),
                arguments: [origin])
            ?? Row.fetchOne(db.cachedStatement(sql: "SELECT seq, hash FROM sync_pruned WHERE origin = ?"), arguments: [origin])
        return row.map { (UInt64(max(0, $0[0] as Int64)), Array($0[1] as Data)) }
    }

    /// The latest head held for `origin` (its bytes), nil when none.
    public func latestHeadBytes(origin: NodeID) throws -> [UInt8]? {
        try database.read { db in
            try Data.fetchOne(
                db, sql: "SELECT head FROM sync_heads WHERE origin = ? ORDER BY seq DESC LIMIT 1", arguments: [Data(origin.bytes)]
            ).map { Array($0) }
        }
    }

    /// The next run of `origin`'s entries after `after`: up to the furthest head within `maxEntries` entries and
    /// `maxBytes` bytes, or to the nearest head when that is further, with that head's bytes. Nil when no head lies
    /// beyond `after`.
    public func entryRange(origin: NodeID, after: UInt64, maxEntries: Int, maxBytes: Int) throws
        -> (entries: [(bytes: [UInt8], hash: [UInt8])], head: [UInt8])?
    {
        try database.read { db in
            // Cached statements read in place: a round reads a batch every few hundred entries, and preparing these
            // five statements again for each batch cost the sender more than reading the entries.
            let o = Blob(bytes: origin.bytes)
            let start = Int64(after)
            if let pruned = try RawStatement(db, "SELECT seq FROM sync_pruned WHERE origin = ?1").firstRow(o, { $0.int64(0) }),
                start < pruned
            {
                throw StoreError(
                    .notFound, kind: "entries_pruned",
                    "entries of \(origin) up to \(pruned) were compacted away; a device that lacks them needs a snapshot")
            }
            var heads: [Int64] = []
            try RawStatement(db, "SELECT seq FROM sync_heads WHERE origin = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq")
                .forEachRow(o, start, start + Int64(maxEntries)) { heads.append($0.int64(0)) }
            var within: Int64?
            if let furthest = heads.last {
                // length() of a blob is read from the record header: no entry is read here.
                var bytes = 0
                var remaining = heads[...]
                try RawStatement(
                    db, "SELECT seq, length(bytes) FROM sync_entries WHERE origin = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq"
                ).forEachRow(o, start, furthest) { row in
                    guard bytes <= maxBytes else { return }
                    bytes += Int(row.int64(1))
                    guard bytes <= maxBytes else { return }
                    let seq = row.int64(0)
                    if seq == remaining.first {
                        within = seq
                        remaining = remaining.dropFirst()
                    }
                }
            }
            let nearest = try RawStatement(db, "SELECT min(seq) FROM sync_heads WHERE origin = ?1 AND seq > ?2")
                .firstRow(o, start) { $0.isNull(0) ? nil : $0.int64(0) } ?? nil
            guard let end = within ?? nearest,
                let headBytes = try RawStatement(db, "SELECT head FROM sync_heads WHERE origin = ?1 AND seq = ?2")
                    .firstRow(o, end, { $0.blob(0) })
            else { return nil }
            // Read in place (no row objects): a batch is a thousand entries of a few hundred bytes.
            var entries: [(bytes: [UInt8], hash: [UInt8])] = []
            entries.reserveCapacity(Int(end - start))
            try RawStatement(db, "SELECT bytes, hash FROM sync_entries WHERE origin = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq")
                .forEachRow(o, start, end) { row in entries.append((row.blob(0), row.blob(1))) }
            // Entries below a head are always stored with it; a gap means the log was damaged on disk.
            guard entries.count == Int(end - start) else {
                throw StoreError(.internalFailure, kind: "corrupt_sync_log", "entries of \(origin) after \(after) are missing")
            }
            return (entries, headBytes)
        }
    }

    /// Stores verified entries of `origin` with the head that covers them and applies the changes that are new, in
    /// one transaction: the first entry must continue the log held here (`firstPrev` is the hash it links to), an
    /// entry held already must be the same (else `SyncLogConflict.fork`), and a quarantined origin stores nothing.
    public func recordEntries(
        origin: NodeID, _ entries: [SyncLogEntry], firstPrev: [UInt8], changes: [Change], texts: [[UInt8]]? = nil,
        head: (seq: UInt64, bytes: [UInt8])
    ) throws -> BatchOutcome {
        let batch = ReceivedBatch(origin: origin, entries: entries, firstPrev: firstPrev, changes: changes, texts: texts, head: head)
        return try database.connections.write { db in try record([batch], in: db)[0] }
    }

    /// Stores several batches as `recordEntries` does, in one transaction: a commit (with its fsync and the pages its
    /// batches share) per group rather than per batch. Nil, with nothing stored, when any batch is refused for a
    /// conflict (`SyncLogConflict`): the caller then stores them one by one, so each gets its own verdict.
    public func recordEntries(group: [ReceivedBatch]) throws -> [BatchOutcome]? {
        do {
            return try database.connections.write { db in try record(group, in: db) }
        } catch is SyncLogConflict {
            return nil
        }
    }

    /// `recordEntries` of `batches`, in order, inside the caller's write transaction. Their new changes are applied
    /// together, so a document several of them change is read and written once; the outcome of the last batch
    /// carries what applying them did.
    private func record(_ batches: [ReceivedBatch], in db: Database) throws -> [BatchOutcome] {
        var outcomes: [BatchOutcome] = []
        var fresh: [Change] = []
        var freshTexts: [ChangeID: [UInt8]] = [:]
        let count = batches.reduce(0) { $0 + $1.changes.count }
        fresh.reserveCapacity(count)
        freshTexts.reserveCapacity(count)
        for batch in batches { outcomes.append(try store(batch, in: db, fresh: &fresh, freshTexts: &freshTexts)) }
        guard !fresh.isEmpty else { return outcomes }
        let report = try database.receive(fresh, in: db, texts: freshTexts)
        outcomes[outcomes.count - 1].report = report
        // Changes waiting for dependencies are bounded per origin: past the limit the batch is refused whole (the
        // transaction rolls back), and comes again once what it waits for has arrived.
        if report.parked > 0 {
            let count = try db.cachedStatement(sql: "SELECT count(*) FROM parked WHERE origin = ?")
            for origin in Set(batches.map(\.origin)) {
                let parked = try Int.fetchOne(count, arguments: [origin.hex]) ?? 0
                if parked > database.limits.maxParkedPerOrigin { throw SyncLogConflict.tooManyParked }
            }
        }
        return outcomes
    }

    /// Checks that `batch` continues the log held here and stores its entries and head; adds the changes of the
    /// entries not held before to `fresh` (their texts to `freshTexts`).
    private func store(
        _ batch: ReceivedBatch, in db: Database, fresh: inout [Change], freshTexts: inout [ChangeID: [UInt8]]
    ) throws -> BatchOutcome {
        let (origin, entries, firstPrev, changes, texts, head) =
            (batch.origin, batch.entries, batch.firstPrev, batch.changes, batch.texts, batch.head)
        precondition(entries.count == changes.count && !entries.isEmpty, "one change per entry")
        precondition(texts.map { $0.count == changes.count } ?? true, "one text per change")
        let o = Data(origin.bytes)
        let firstSeq = entries[0].seq
        var outcome = BatchOutcome()
        guard try !Self.isQuarantined(o, db) else { throw SyncLogConflict.quarantined }
        let held = try db.cachedStatement(sql: "SELECT hash FROM sync_entries WHERE origin = ? AND seq = ?")
        // Statements per batch are cached: preparing them again cost about as much as storing a few entries.
        let pruned = try Row.fetchOne(
            db.cachedStatement(sql: "SELECT seq, hash FROM sync_pruned WHERE origin = ?"), arguments: [o])
            .map { PrunedHead(seq: UInt64(max(0, $0[0] as Int64)), hash: Array($0[1] as Data)) }
        if let pruned, pruned.seq >= firstSeq - 1 {
            // Entries up to `pruned.seq` are no longer held: the batch must agree with the chain head kept.
            let hashAtPruned = pruned.seq == firstSeq - 1 ? firstPrev : entries.first { $0.seq == pruned.seq }?.hash
            if let hashAtPruned, pruned.hash != PrunedHead.chainStart, hashAtPruned != pruned.hash {
                throw pruned.seq == firstSeq - 1 ? SyncLogConflict.brokenChain : SyncLogConflict.fork
            }
        } else if firstSeq > 1 {
            // A batch must continue the log held here: no gap, and linked to the entry before it.
            guard let before = try Data.fetchOne(held, arguments: [o, Int64(firstSeq - 1)]), Array(before) == firstPrev
            else { throw SyncLogConflict.brokenChain }
        }
        // One statement per entry: the insert is ignored when the entry is held already, and only then is the
        // held one read (the same entry, or evidence of a fork).
        let insert = try RawStatement(
            db, "INSERT INTO sync_entries(origin, seq, hash, bytes) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING")
        let originBlob = Blob(bytes: origin.bytes)
        for (i, (entry, change)) in zip(entries, changes).enumerated() {
            if let pruned, entry.seq <= pruned.seq {
                // Held once and pruned since: its change is applied.
                outcome.duplicates += 1
                continue
            }
            if try insert.run(originBlob, Int64(entry.seq), Blob(bytes: entry.hash), Blob(bytes: entry.bytes)) == 0 {
                guard let existing = try Data.fetchOne(held, arguments: [o, Int64(entry.seq)]),
                    Array(existing) == entry.hash
                else { throw SyncLogConflict.fork }
                outcome.duplicates += 1
                continue
            }
            outcome.stored += 1
            fresh.append(change)
            if let texts { freshTexts[ChangeID(change)] = texts[i] }
        }
        try db.cachedStatement(sql: "INSERT OR IGNORE INTO sync_heads(origin, seq, head) VALUES (?, ?, ?)")
            .execute(arguments: [o, Int64(head.seq), Data(head.bytes)])
        return outcome
    }

    private static func isQuarantined(_ origin: Data, _ db: Database) throws -> Bool {
        try Bool.fetchOne(
            db.cachedStatement(sql: "SELECT EXISTS(SELECT 1 FROM sync_forks WHERE origin = ?)"), arguments: [origin]) ?? false
    }

    /// Stores evidence that `origin` forked at `seq`: a head it signed (`otherHead`, verified by the caller) covers
    /// `hash`, while the entry held here is another one. False when there is no such evidence (nothing held at that
    /// seq, or the same entry). The first evidence per origin is kept; from then on the origin is quarantined.
    public func recordForkEvidence(origin: NodeID, seq: UInt64, hash: [UInt8], otherHead: [UInt8]) throws -> Bool {
        let o = Data(origin.bytes)
        return try database.connections.write { db in
            guard SyncBounds.isValidSeq(seq),
                let held = try Data.fetchOne(
                    db, sql: "SELECT hash FROM sync_entries WHERE origin = ? AND seq = ?", arguments: [o, Int64(seq)]),
                Array(held) != hash
            else { return false }
            try db.execute(
                sql: "INSERT OR IGNORE INTO sync_forks(origin, seq, held_hash, other_hash, other_head, detected_at) "
                    + "VALUES (?, ?, ?, ?, ?, ?)",
                arguments: [o, Int64(seq), held, Data(hash), Data(otherHead), Int64(Date().timeIntervalSince1970 * 1000)])
            return true
        }
    }

    /// Evidence of the forks found in this database's space, one per quarantined origin.
    public func forks() throws -> [ForkEvidence] {
        try database.read { db in
            try Row.fetchAll(
                db, sql: "SELECT origin, seq, held_hash, other_hash, detected_at FROM sync_forks ORDER BY origin"
            ).map { row in
                ForkEvidence(
                    origin: NodeID(bytes: Array(row[0] as Data)), seq: UInt64(row[1] as Int64),
                    heldHash: Array(row[2] as Data), otherHash: Array(row[3] as Data), detectedAtMs: row[4])
            }
        }
    }

    /// The hash of the entry held for `origin` at `seq` (or pruned last, at `seq`), nil when none.
    public func heldHash(origin: NodeID, seq: UInt64) throws -> [UInt8]? {
        try database.read { db in
            let o = Data(origin.bytes)
            if let hash = try Data.fetchOne(
                db, sql: "SELECT hash FROM sync_entries WHERE origin = ? AND seq = ?", arguments: [o, Int64(seq)])
            {
                return Array(hash)
            }
            return try Data.fetchOne(
                db, sql: "SELECT hash FROM sync_pruned WHERE origin = ? AND seq = ? AND hash != zeroblob(32)",
                arguments: [o, Int64(seq)]
            ).map { Array($0) }
        }
    }

    /// The sequence of the latest head held for `origin`, nil when none.
    public func latestHeadSeq(origin: NodeID) throws -> UInt64? {
        try database.read { db in
            try Int64.fetchOne(db, sql: "SELECT max(seq) FROM sync_heads WHERE origin = ?", arguments: [Data(origin.bytes)])
                .map { UInt64($0) }
        }
    }

    /// Checks a received change against this database's limits (document size, depth, names), as a local write is.
    public func checkReceived(_ change: Change, size: Int) throws {
        try database.validate(change, size: size)
    }
}

/// The sync log's owner, and the calls other modules make through the database (forwarded to `SyncLogStore`).
extension BlazeDatabase {
    /// The database's sync log as storage.
    public var syncLog: SyncLogStore { SyncLogStore(self) }

    /// The space this database syncs in (hex), nil while it is not shared (`SyncLogStore.spaceID`).
    public func spaceID() throws -> String? { try syncLog.spaceID() }

    /// Binds the database to a space; refuses to change an existing binding (`SyncLogStore.setSpaceID`).
    public func setSpaceID(_ idHex: String) throws { try syncLog.setSpaceID(idHex) }

    /// Per origin, the highest sequence this replica holds (`SyncLogStore.syncVector`).
    public func syncVector() throws -> [NodeID: UInt64] { try syncLog.syncVector() }

    /// The latest head held for `origin` (its bytes), nil when none (`SyncLogStore.latestHeadBytes`).
    public func latestHeadBytes(origin: NodeID) throws -> [UInt8]? { try syncLog.latestHeadBytes(origin: origin) }

    /// Evidence of the forks found in this database's space (`SyncLogStore.forks`).
    public func forks() throws -> [ForkEvidence] { try syncLog.forks() }

    /// The hash of the entry held for `origin` at `seq`, nil when none (`SyncLogStore.heldHash`).
    public func heldHash(origin: NodeID, seq: UInt64) throws -> [UInt8]? { try syncLog.heldHash(origin: origin, seq: seq) }
}
