import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDB

/// Compaction (Protocol/SYNC.md §11): dropping history that no replica can need any more, in bounded steps.
///
/// `stable` is the database's causally stable vector: every change it covers is held by every current member, and
/// every change still to arrive is causally after it. For a database that is not shared the device is its only member
/// and everything it holds is stable. Compaction then drops
/// - op-log bodies (`changes`) of stable changes, and of any change whose sealed entry is held (the entry is the same
///   change), except those the retained feed points at and this device's changes not yet sealed;
/// - tombstones whose deleting change is stable (no change that can still arrive has a lower causal length);
/// - sealed entries and signed heads of stable changes, keeping per origin the last pruned entry's hash
///   (`sync_pruned`) so later entries still link and forks are still found, and each origin's latest head.
/// A device that needs what was pruned gets a snapshot instead (§11).
///
/// The owner of compaction: its steps, folding, the tombstone floor it raises (`droppedCausalLength`, which the
/// database keeps for every write to read) and the file-level steps it ends with (`Compactor+Space.swift`). It holds
/// no state of its own beyond the database's tables: a value made on demand (`BlazeDatabase.compactor`).
public struct Compactor: Sendable {
    /// The database this compacts.
    public let database: BlazeDatabase

    /// The compactor of `database`.
    init(_ database: BlazeDatabase) { self.database = database }

    /// Per origin, the last entry pruned here.
    public func prunedHeads() throws -> [NodeID: PrunedHead] {
        try database.read { db in try Self.prunedHeads(db) }
    }

    /// Per origin, the last entry pruned here, read in the caller's transaction.
    static func prunedHeads(_ db: Database) throws -> [NodeID: PrunedHead] {
        var out: [NodeID: PrunedHead] = [:]
        for row in try Row.fetchAll(db, sql: "SELECT origin, seq, hash FROM sync_pruned") {
            let origin: Data = row[0], seq: Int64 = row[1], hash: Data = row[2]
            guard origin.count == 16, seq > 0 else { continue }
            out[NodeID(bytes: Array(origin))] = PrunedHead(seq: UInt64(seq), hash: Array(hash))
        }
        return out
    }

    /// The report of the last compaction that removed anything, nil before the first.
    public func lastCompaction() throws -> CompactionReport? {
        try database.read { db in
            try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'last_compaction'")
                .flatMap { try? JSONParser().parse($0) }.flatMap(CompactionReport.init(json:))
        }
    }

    /// Compacts in steps of at most `stepRows` rows of each kind per write transaction (so a writer waits at most
    /// one step), then returns freed pages to the file system. `stable` is clamped to what this replica applied.
    /// With `defragment`, a file of which more than a quarter (and over 256 KiB) is unused space inside pages —
    /// rows deleted here and there, or grown by updates, leave pages part empty, which no page-level vacuum
    /// returns — is rewritten (`VACUUM`): writers wait for that. The write-ahead log is then emptied too.
    /// Tombstones go only up to `tombstonesStable` (default `stable`): the vector every member ever counted holds,
    /// with no horizon (SYNC.md §11) — a delete decides the fate of every late edit, so it must be stable for all.
    @discardableResult
    public func compact(
        stable: VersionVector, tombstonesStable: VersionVector? = nil, stepRows: Int = 1000, defragment: Bool = false
    ) throws -> CompactionReport {
        let started = Date()
        var total = CompactionReport()
        // The feed is trimmed to its retention exactly (writes trim it in steps). Its rows hold reverse deltas and
        // need no change, except rows of earlier versions that point into the op log: per origin, the changes from the
        // first one those need are kept. Read once: the feed only moves forward while this runs.
        try database.trimFeed()
        // The changes recorded after this read may have feed rows it did not see: none of them is pruned.
        let (feedNeeds, seen) = try database.read { db in
            let seen = try database.makeStorage(db).versionVector()
            var out: [String: Int64] = [:]
            for row in try Row.fetchAll(
                db,
                sql: """
                    SELECT origin, min(json_extract(events, '$.s')) FROM feed WHERE events LIKE '{"e":%' GROUP BY origin
                    """)
            {
                if let origin = row[0] as String?, let seq = row[1] as Int64? { out[origin] = seq }
            }
            return (out, seen)
        }
        while true {
            let step = try database.connections.write { db in
                try self.compactionStep(
                    db, stable: stable, tombstonesStable: tombstonesStable ?? stable, seen: seen, feedNeeds: feedNeeds, limit: stepRows)
            }
            total.add(step)
            if step.rows == 0 { break }
        }
        // Live documents whose every write is stable for every member keep one stamp. Candidates are found and
        // folded in a read transaction; each step's write only swaps the states that did not change meanwhile.
        let strict = tombstonesStable ?? stable
        var cursor: Int64 = 0
        while true {
            let (folds, next) = try database.read { db in try self.foldCandidates(db, stable: strict, after: cursor, scan: stepRows * 4) }
            if !folds.isEmpty {
                total.folded += try database.connections.write { db in
                    var n = 0
                    for f in folds {
                        try db.execute(
                            sql: "UPDATE docs SET state = ? WHERE rowid = ? AND state = ?", arguments: [f.state, f.rowid, f.old])
                        n += db.changesCount
                    }
                    return n
                }
                total.steps += 1
            }
            guard let next else { break }
            cursor = next
        }
        total.pagesFreed = try vacuumFreePages(stepPages: max(64, stepRows))
        if defragment { total.pagesFreed += try rewriteIfFragmented() }
        total.finishedAtMs = Int64(Date().timeIntervalSince1970 * 1000)
        total.durationMs = Int64(Date().timeIntervalSince(started) * 1000)
        if total.rows > 0 || total.folded > 0 || total.pagesFreed > 0 {
            let text = total.jsonValue.jsonText
            try database.connections.write { db in
                try db.execute(
                    sql: "INSERT INTO meta(key, value) VALUES ('last_compaction', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    arguments: [text])
            }
        }
        // Asked for space back: the write-ahead log the steps filled goes too (db.info counts it), unless reads keep
        // it (the database is compacted either way; only the size reported waits for a later checkpoint).
        if defragment, (try? FileManager.default.attributesOfItem(atPath: database.path + "-wal")[.size] as? NSNumber)?
            .int64Value ?? 0 > 0
        {
            _ = try? database.truncateLog()
        }
        return total
    }

    /// Up to `scan` live documents after rowid `after` whose history folds under `stable`, with their stored state
    /// and the folded one; and the rowid to go on from (nil at the end of the table).
    func foldCandidates(_ db: Database, stable: VersionVector, after: Int64, scan: Int) throws
        -> ([(rowid: Int64, old: String, state: String)], Int64?)
    {
        var out: [(rowid: Int64, old: String, state: String)] = []
        var last: Int64?
        let rows = try Row.fetchCursor(
            db, sql: "SELECT rowid, state, body FROM docs WHERE rowid > ? ORDER BY rowid LIMIT ?", arguments: [after, scan])
        while let row = try rows.next() {
            last = row[0]
            // Folded already (`{"l":…,"t":…}`), or no state yet: nothing to do.
            guard let state = row[1] as String?, state.contains("\"p\":") || state.contains("\"f\":") || state.contains("\"u\":")
            else { continue }
            let decoded = try SQLStorage.decode(state: state, body: row[2], database.coding)
            if let folded = decoded.folded(stable: stable) {
                let text = folded.compactText(database.coding)
                if text != state { out.append((row[0], state, text)) }
            }
        }
        return (out, last)
    }

    /// Raises the highest dropped causal length to `cl` in the caller's transaction (and in memory once it commits).
    func raiseDroppedCausalLength(_ cl: Int64, _ db: Database) throws {
        let current = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'tombstone_cl_floor'").flatMap { Int64($0) } ?? 0
        guard cl > current else { return }
        try db.execute(
            sql: "INSERT INTO meta(key, value) VALUES ('tombstone_cl_floor', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            arguments: [String(cl)])
        db.afterNextTransaction(onCommit: { [database] _ in database.droppedCausalLength.withLock { $0 = max($0, cl) } })
    }

    /// One bounded step inside the caller's write transaction.
    func compactionStep(
        _ db: Database, stable: VersionVector, tombstonesStable: VersionVector, seen: VersionVector, feedNeeds: [String: Int64],
        limit: Int
    ) throws -> CompactionReport {
        var report = CompactionReport()
        report.steps = 1
        let applied = try database.makeStorage(db).versionVector()
        let shared = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'space_id'") != nil
        let forked = Set(try Data.fetchAll(db, sql: "SELECT origin FROM sync_forks").map { Array($0) })
        // The clock must stay ahead of every change ever made here, pruned ones included.
        let keepClock = database.clock.withLock { $0.last.raw }
        try db.execute(
            sql: "INSERT INTO meta(key, value) VALUES ('hlc_floor', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            arguments: [String(keepClock)])
        for (origin, held) in applied.entries.sorted(by: { $0.key < $1.key }) {
            let o = Data(origin.bytes)
            let stableSeq = Int64(min(stable[origin], held))
            let maxEntry = shared ? try Int64.fetchOne(db, sql: "SELECT max(seq) FROM sync_entries WHERE origin = ?", arguments: [o]) : nil
            // Op-log bodies: stable ones, and (shared) those whose entry is held, which is the same change.
            var changesUpTo = min(max(stableSeq, min(maxEntry ?? 0, Int64(held))), Int64(seen[origin]))
            if shared && origin == database.node {
                // This device's changes are sealed from their bodies: none goes before its entry exists.
                let pruned = try Int64.fetchOne(db, sql: "SELECT seq FROM sync_pruned WHERE origin = ?", arguments: [o]) ?? 0
                changesUpTo = min(changesUpTo, max(maxEntry ?? 0, pruned))
            }
            if let needed = feedNeeds[origin.hex] { changesUpTo = min(changesUpTo, needed - 1) }
            if changesUpTo > 0 {
                try db.execute(
                    sql: "DELETE FROM changes WHERE rowid IN (SELECT rowid FROM changes WHERE origin = ? AND seq <= ? ORDER BY seq LIMIT ?)",
                    arguments: [origin.hex, changesUpTo, limit])
                report.changes += db.changesCount
            }
            let deletesStable = Int64(min(tombstonesStable[origin], held))
            if deletesStable > 0 {
                // Local writes start new documents above every causal length dropped (`localState`).
                if let dropped = try Int64.fetchOne(
                    db,
                    sql: """
                        SELECT max(json_extract(state, '$.l')) FROM (
                            SELECT state FROM tombstones WHERE del_origin = ? AND del_seq <= ? LIMIT ?)
                        """,
                    arguments: [origin.hex, deletesStable, limit])
                {
                    try raiseDroppedCausalLength(dropped, db)
                }
                try db.execute(
                    sql: """
                        DELETE FROM tombstones WHERE (collection, id) IN (
                            SELECT collection, id FROM tombstones WHERE del_origin = ? AND del_seq <= ? LIMIT ?)
                        """,
                    arguments: [origin.hex, deletesStable, limit])
                report.tombstones += db.changesCount
            }
            guard stableSeq > 0 else { continue }
            guard shared, let maxEntry, !forked.contains(origin.bytes) else { continue }
            let pruned = try Int64.fetchOne(db, sql: "SELECT seq FROM sync_pruned WHERE origin = ?", arguments: [o]) ?? 0
            let upTo = min(stableSeq, maxEntry, pruned + Int64(limit))
            guard upTo > pruned,
                let hash = try Data.fetchOne(
                    db, sql: "SELECT hash FROM sync_entries WHERE origin = ? AND seq = ?", arguments: [o, upTo])
            else { continue }
            try db.execute(sql: "DELETE FROM sync_entries WHERE origin = ? AND seq <= ?", arguments: [o, upTo])
            report.entries += db.changesCount
            try db.execute(
                sql: "INSERT INTO sync_pruned(origin, seq, hash) VALUES (?, ?, ?) ON CONFLICT(origin) DO UPDATE SET seq = excluded.seq, hash = excluded.hash",
                arguments: [o, upTo, hash])
            // Heads of pruned runs go too, except the origin's latest (what a device announces and rollbacks are
            // measured against).
            try db.execute(
                sql: "DELETE FROM sync_heads WHERE origin = ?1 AND seq <= ?2 AND seq < (SELECT max(seq) FROM sync_heads WHERE origin = ?1)",
                arguments: [o, upTo])
            report.heads += db.changesCount
        }
        return report
    }
}

/// Compaction's owner, and the calls other modules make through the database (forwarded to `Compactor`).
extension BlazeDatabase {
    /// The database's compactor.
    public var compactor: Compactor { Compactor(self) }

    /// Per origin, the last entry pruned here (`Compactor.prunedHeads`).
    public func prunedHeads() throws -> [NodeID: PrunedHead] { try compactor.prunedHeads() }

    /// The report of the last compaction that removed anything, nil before the first (`Compactor.lastCompaction`).
    public func lastCompaction() throws -> CompactionReport? { try compactor.lastCompaction() }

    /// Compacts up to `stable` (tombstones up to `tombstonesStable`) in steps of `stepRows` rows (`Compactor.compact`).
    @discardableResult
    public func compact(
        stable: VersionVector, tombstonesStable: VersionVector? = nil, stepRows: Int = 1000, defragment: Bool = false
    ) throws -> CompactionReport {
        let started = ContinuousClock.now
        let report = try compactor.compact(
            stable: stable, tombstonesStable: tombstonesStable, stepRows: stepRows, defragment: defragment)
        metrics?.recordCompaction(report, started: started)
        return report
    }
}
