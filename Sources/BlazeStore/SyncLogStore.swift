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
    ///
    /// Sealers take turns (`BlazeDatabase.sealing`): one that waited finds what the other sealed, instead of sealing
    /// the same changes again and losing the race to store them. With `fullBatchesOnly`, a trailing run shorter than
    /// `batch` is left for the next call (each call signs a head at its end: a sealer that runs often would otherwise
    /// sign one per few entries). `continuing` is asked before each batch; false stops after the batches stored.
    @discardableResult
    public func sealPending(
        batch: Int, fullBatchesOnly: Bool = false, continuing: () -> Bool = { true },
        _ seal: (_ lastSeq: UInt64, _ lastHash: [UInt8]?, _ bodies: [String]) throws -> (
            entries: [SyncLogEntry], heads: [(seq: UInt64, bytes: [UInt8])]
        )
    ) throws -> Int {
        try database.sealing.withLock { _ in
            try sealBatches(batch: batch, fullBatchesOnly: fullBatchesOnly, continuing: continuing, seal)
        }
    }

    /// `sealPending`, with the sealing lock held.
    private func sealBatches(
        batch: Int, fullBatchesOnly: Bool, continuing: () -> Bool,
        _ seal: (_ lastSeq: UInt64, _ lastHash: [UInt8]?, _ bodies: [String]) throws -> (
            entries: [SyncLogEntry], heads: [(seq: UInt64, bytes: [UInt8])]
        )
    ) throws -> Int {
        let node = database.node
        let origin = Data(node.bytes)
        var sealed = 0
        while continuing() {
            let (end, rows) = try database.read { db in
                let end = try Self.chainEnd(origin, db)
                let rows = try Row.fetchAll(
                    db, sql: "SELECT seq, body FROM changes WHERE origin = ? AND seq > ? ORDER BY seq LIMIT ?",
                    arguments: [node.hex, Int64(end?.seq ?? 0), batch])
                return (end, rows.map { (seq: UInt64($0[0] as Int64), body: $0[1] as String) })
            }
            guard let first = rows.first, rows.count == batch || !fullBatchesOnly else { return sealed }
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
        return sealed
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
