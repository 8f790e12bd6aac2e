import BlazeProtocol
import GRDB
import GRDBSQLite

/// The blobs a database refers to, for sweeping its chunk store (ARCHITECTURE.md, "Blobs", "Collecting chunks").
extension BlazeDatabase {
    /// The places a blob reference (`{"$blob": {"id": …}}`) can be held: documents, their replicated state (conflict
    /// losers too) and that of deleted ones until compaction drops it, the changes held as history, changes waiting
    /// for their dependencies, and the feed's events (`doc.history`, `doc.get` at a time).
    static let blobReferencePlaces = [
        ("docs", "body"), ("docs", "state"), ("tombstones", "state"), ("changes", "body"), ("parked", "body"), ("feed", "events"),
    ]

    /// Collects in two steps what a sweep of the chunk store needs: `plan` gets every blob id the database may refer
    /// to as of a read snapshot, without holding the writer (the long part: every place a reference can be held is
    /// read, and `plan` reads manifests and lists chunks); `finish` then gets, while holding the writer, the ids that
    /// rows written since may refer to.
    ///
    /// The ids are each run of exactly 64 lowercase hex digits in a row that mentions `$blob`, wherever a reference
    /// can be held (`blobReferencePlaces`), and the blobs pinned here: more than the references, never fewer. Every
    /// row the writer writes after the snapshot is noted (`ReferenceWatch`, started before the snapshot is taken), so
    /// what `finish` gets covers each row inserted or updated since in the watched tables, the others read whole;
    /// a rewrite of the file since (`VACUUM`, which may renumber rows) or more rows than the watch keeps make it every
    /// reference, read then. No commit adds a reference before `finish` returns, so a sweep that removes only what
    /// neither step was given cannot race a document that starts referring to it.
    public func withReferencedBlobs<Plan, T>(
        plan: (Set<ChunkID>) throws -> Plan, finish: (Plan, _ added: Set<ChunkID>) throws -> T
    ) throws -> T {
        // One sweep of a database at a time: a second one's `start` would find the first's hook.
        sweeping.lock()
        defer { sweeping.unlock() }
        let watch = ReferenceWatch()
        let rewrites = connections.rewrites.load(ordering: .sequentiallyConsistent)
        let started = connections.writeWithoutTransaction { db in db.sqliteConnection.map { watch.start(on: $0) } ?? false }
        guard started else {
            // Something else watches the writer's rows: hold the writer throughout instead.
            return try connections.writeWithoutTransaction { db in try finish(try plan(try Self.referencedBlobs(db)), []) }
        }
        var watching = true
        defer {
            if watching { connections.writeWithoutTransaction { db in db.sqliteConnection.map { watch.stop(on: $0) } } }
        }
        let planned = try plan(try connections.read { db in try Self.referencedBlobs(db) })
        return try connections.writeWithoutTransaction { db in
            db.sqliteConnection.map { watch.stop(on: $0) }
            watching = false
            let whole = watch.overflowed || connections.rewrites.load(ordering: .sequentiallyConsistent) != rewrites
            return try finish(planned, whole ? try Self.referencedBlobs(db) : try Self.referencedBlobs(db, rows: watch.written))
        }
    }

    /// The blob ids `db` may refer to (see `withReferencedBlobs`); with `rows`, only those of the rows it names in
    /// the watched tables (`ReferenceWatch.tables`), the other places read whole.
    static func referencedBlobs(_ db: Database, rows: [String: Set<Int64>]? = nil) throws -> Set<ChunkID> {
        var out = Set<ChunkID>()
        for (table, column) in blobReferencePlaces {
            let mentions = "instr(\(column), '$blob') > 0"
            guard let rows, ReferenceWatch.tables.contains(table) else {
                let all = try String.fetchCursor(db, sql: "SELECT \(column) FROM \(table) WHERE \(mentions)")
                while let text = try all.next() { collectHexIDs(in: text, into: &out) }
                continue
            }
            let select = try db.cachedStatement(sql: "SELECT \(column) FROM \(table) WHERE rowid = ? AND \(mentions)")
            for rowid in rows[table] ?? [] {
                if let text = try String.fetchOne(select, arguments: [rowid]) { collectHexIDs(in: text, into: &out) }
            }
        }
        // Pinned blobs are kept whatever refers to them (`blob.pin`).
        for hex in try String.fetchAll(db, sql: "SELECT id FROM blob_pins") { if let id = ChunkID(hex: hex) { out.insert(id) } }
        return out
    }

    /// Adds to `out` each run of exactly 64 lowercase hex digits in `text`.
    static func collectHexIDs(in text: String, into out: inout Set<ChunkID>) {
        var utf8 = Array(text.utf8)
        utf8.append(0)
        var start = -1
        for (i, c) in utf8.enumerated() {
            let hex = (c >= 0x30 && c <= 0x39) || (c >= 0x61 && c <= 0x66)
            if hex {
                if start < 0 { start = i }
            } else {
                if start >= 0, i - start == 64, let id = ChunkID(hex: String(decoding: utf8[start..<i], as: UTF8.self)) { out.insert(id) }
                start = -1
            }
        }
    }
}

/// Notes the rows the writer inserts or updates in the tables that hold blob references and have stable rowids
/// (`tables`), while a sweep reads the rest of the database without holding the writer
/// (`BlazeDatabase.withReferencedBlobs`). Only the writer's queue starts, stops and reads it.
///
/// It is SQLite's update hook on the writer's connection, not a GRDB observer: GRDB tells its observers only of the
/// statements it runs itself, and the write paths run theirs directly (`RawStatement`). Nothing else here sets that
/// hook (GRDB sets it only for observers of row changes, which this code has none of), and `start` refuses to
/// replace one. Rows of transactions rolled back are noted too: reading a row again costs a lookup, never a
/// reference. `tombstones` and `blob_pins` are not watched (SQLite reports no row of a table without rowid): the
/// sweep reads them whole.
final class ReferenceWatch {
    /// The watched tables.
    static let tables: Set<String> = ["docs", "changes", "parked", "feed"]
    /// Past this many rows noted, the sweep reads every reference again rather than the rows.
    static let maxRows = 1 << 20

    /// The rows written, by table.
    private(set) var written: [String: Set<Int64>] = [:]
    private var count = 0
    /// True once more than `maxRows` distinct rows were written (those past it are not noted).
    private(set) var overflowed = false

    /// Starts noting the rows written on `connection`; false (and nothing started) when it already has an update hook.
    func start(on connection: OpaquePointer) -> Bool {
        let previous = sqlite3_update_hook(connection, { context, _, _, table, rowid in
            guard let context, let table else { return }
            Unmanaged<ReferenceWatch>.fromOpaque(context).takeUnretainedValue().note(table: table, rowid: rowid)
        }, Unmanaged.passUnretained(self).toOpaque())
        guard previous == nil else {
            sqlite3_update_hook(connection, nil, nil)
            return false
        }
        return true
    }

    /// Stops noting (the caller keeps the watch alive until then: the hook holds no reference to it).
    func stop(on connection: OpaquePointer) {
        sqlite3_update_hook(connection, nil, nil)
    }

    private func note(table: UnsafePointer<CChar>, rowid: Int64) {
        guard !overflowed else { return }
        let name = String(cString: table)
        guard Self.tables.contains(name) else { return }
        guard written[name, default: []].insert(rowid).inserted else { return }
        count += 1
        if count > Self.maxRows {
            overflowed = true
            written = [:]
        }
    }
}
