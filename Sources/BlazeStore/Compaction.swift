import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDB

/// What a compaction removed (Protocol/SYNC.md §11).
public struct CompactionReport: Sendable, Equatable {
    /// Op-log rows (`changes`) dropped.
    public var changes = 0
    /// Tombstones dropped.
    public var tombstones = 0
    /// Sealed entries dropped.
    public var entries = 0
    /// Signed heads dropped.
    public var heads = 0
    /// Live documents whose strictly stable history was folded into one stamp (`DocumentState.folded`).
    public var folded = 0
    /// Pages returned to the file system by incremental vacuum.
    public var pagesFreed = 0
    /// Write transactions it took.
    public var steps = 0
    /// When it finished (Unix milliseconds).
    public var finishedAtMs: Int64 = 0
    /// How long it took (milliseconds).
    public var durationMs: Int64 = 0

    /// An empty report.
    public init() {}

    /// Rows removed in all.
    public var rows: Int { changes + tombstones + entries + heads }

    mutating func add(_ other: CompactionReport) {
        changes += other.changes
        tombstones += other.tombstones
        entries += other.entries
        heads += other.heads
        folded += other.folded
        pagesFreed += other.pagesFreed
        steps += other.steps
    }

    /// The report as stored in `meta` and shown by `db.info`.
    public var jsonValue: JSONValue {
        .object([
            "changes": .int(Int64(changes)), "tombstones": .int(Int64(tombstones)), "entries": .int(Int64(entries)),
            "heads": .int(Int64(heads)), "folded": .int(Int64(folded)), "pagesFreed": .int(Int64(pagesFreed)), "steps": .int(Int64(steps)),
            "finishedAtMs": .int(finishedAtMs), "durationMs": .int(durationMs),
        ])
    }

    /// Reads a stored report; nil when malformed.
    public init?(json: JSONValue) {
        guard case .object(let o) = json else { return nil }
        func int(_ k: String) -> Int64? { if case .int(let v)? = o[k] { return v } else { return nil } }
        guard let c = int("changes"), let t = int("tombstones"), let e = int("entries"), let h = int("heads"),
            let p = int("pagesFreed"), let s = int("steps"), let f = int("finishedAtMs"), let d = int("durationMs")
        else { return nil }
        (changes, tombstones, entries, heads, pagesFreed, steps) = (Int(c), Int(t), Int(e), Int(h), Int(p), Int(s))
        (finishedAtMs, durationMs) = (f, d)
        folded = int("folded").map(Int.init) ?? 0  // absent in reports stored before it was counted
    }
}

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
extension BlazeDatabase {
    /// Per origin, the last entry pruned here.
    public func prunedHeads() throws -> [NodeID: PrunedHead] {
        try read { db in try Self.prunedHeads(db) }
    }

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
        try read { db in
            try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'last_compaction'")
                .flatMap { try? JSONParser().parse($0) }.flatMap(CompactionReport.init(json:))
        }
    }

    /// Compacts in steps of at most `stepRows` rows of each kind per write transaction (so a writer waits at most
    /// one step), then returns freed pages to the file system. `stable` is clamped to what this replica applied.
    /// With `defragment`, a file of which more than a quarter (and over 1 MiB) is unused space inside pages —
    /// rows deleted here and there leave pages half empty, which no page-level vacuum returns — is rewritten
    /// (`VACUUM`): writers wait for that.
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
        try trimFeed()
        // The changes recorded after this read may have feed rows it did not see: none of them is pruned.
        let (feedNeeds, seen) = try read { db in
            let seen = try self.makeStorage(db).versionVector()
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
            let step = try pool.write { db in
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
            let (folds, next) = try read { db in try self.foldCandidates(db, stable: strict, after: cursor, scan: stepRows * 4) }
            if !folds.isEmpty {
                total.folded += try pool.write { db in
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
            try pool.write { db in
                try db.execute(
                    sql: "INSERT INTO meta(key, value) VALUES ('last_compaction', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    arguments: [text])
            }
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
            let decoded = try SQLStorage.decode(state: state, body: row[2], coding)
            if let folded = decoded.folded(stable: stable) {
                let text = folded.compactText(coding)
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
        db.afterNextTransaction(onCommit: { [self] _ in droppedCausalLength.withLock { $0 = max($0, cl) } })
    }

    /// One bounded step inside the caller's write transaction.
    func compactionStep(
        _ db: Database, stable: VersionVector, tombstonesStable: VersionVector, seen: VersionVector, feedNeeds: [String: Int64],
        limit: Int
    ) throws -> CompactionReport {
        var report = CompactionReport()
        report.steps = 1
        let applied = try makeStorage(db).versionVector()
        let shared = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'space_id'") != nil
        let forked = Set(try Data.fetchAll(db, sql: "SELECT origin FROM sync_forks").map { Array($0) })
        // The clock must stay ahead of every change ever made here, pruned ones included.
        let keepClock = clock.withLock { $0.last.raw }
        try db.execute(
            sql: "INSERT INTO meta(key, value) VALUES ('hlc_floor', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            arguments: [String(keepClock)])
        for (origin, held) in applied.entries.sorted(by: { $0.key < $1.key }) {
            let o = Data(origin.bytes)
            let stableSeq = Int64(min(stable[origin], held))
            let maxEntry = shared ? try Int64.fetchOne(db, sql: "SELECT max(seq) FROM sync_entries WHERE origin = ?", arguments: [o]) : nil
            // Op-log bodies: stable ones, and (shared) those whose entry is held, which is the same change.
            var changesUpTo = min(max(stableSeq, min(maxEntry ?? 0, Int64(held))), Int64(seen[origin]))
            if shared && origin == node {
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
