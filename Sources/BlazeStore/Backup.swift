import BlazeCRDT
import BlazeProtocol
import BlazeVector
import Foundation
import GRDB

#if canImport(Glibc)
import Glibc
#endif

/// What `backup(to:)` wrote.
public struct BackupReport: Sendable {
    /// The backup file.
    public var path: String
    /// Its size in bytes.
    public var bytes: Int64
    /// Live documents in the snapshot.
    public var documents: Int
    /// `stateHash()` of the snapshot: a restore of this file has exactly this hash.
    public var stateHash: String
}

extension BlazeDatabase {
    /// Writes a consistent snapshot of the database to `path` through SQLite's online backup while writers go on.
    ///
    /// The copy runs inside one read transaction, so it is the database as of one commit (WAL readers never block
    /// the writer). It is written to `path.partial`, made a self-contained rollback-journal file, synced, and then
    /// linked to `path`, which must not exist: a reader of `path` never sees half a backup.
    public func backup(to path: String) throws -> BackupReport {
        try Self.checkTarget(path)
        let partial = path + ".partial"
        guard !FileManager.default.fileExists(atPath: partial) else {
            throw StoreError(
                .alreadyExists, kind: "file_exists",
                "\(partial) exists: another backup to \(path) is running, or an interrupted one left it (remove it)")
        }
        var report = BackupReport(path: path, bytes: 0, documents: 0, stateHash: "")
        do {
            try connections.read { db in
                let target = try DatabaseQueue(path: partial)
                try target.writeWithoutTransaction { targetDB in
                    try db.backup(to: targetDB)
                    try targetDB.execute(sql: "PRAGMA journal_mode = DELETE")
                }
                try target.close()
                report.stateHash = try Self.stateHash(db)
                report.documents = try Int.fetchOne(db, sql: "SELECT count(*) FROM docs") ?? 0
            }
            try Self.syncFile(partial)
            guard link(partial, path) == 0 else {
                let reason = errno == EEXIST ? "it exists" : String(cString: strerror(errno))
                throw StoreError(.alreadyExists, kind: "file_exists", "cannot create \(path): \(reason)")
            }
            unlink(partial)
            try Self.syncFile((path as NSString).deletingLastPathComponent)
        } catch {
            for suffix in ["", "-journal", "-wal", "-shm"] { unlink(partial + suffix) }
            throw error
        }
        report.bytes = Int64((try? FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)??.int64Value ?? 0)
        return report
    }

    /// `path` must be absolute, not exist, and be in an existing directory.
    static func checkTarget(_ path: String) throws {
        guard path.hasPrefix("/") else {
            throw StoreError.invalid("invalid_path", "the backup path must be absolute, got \(path)")
        }
        guard !FileManager.default.fileExists(atPath: path) else {
            throw StoreError(.alreadyExists, kind: "file_exists", "\(path) exists; a backup never overwrites a file")
        }
        var isDirectory: ObjCBool = false
        let dir = (path as NSString).deletingLastPathComponent
        guard FileManager.default.fileExists(atPath: dir, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw StoreError(.notFound, kind: "directory_not_found", "directory \(dir) does not exist")
        }
        guard access(dir, W_OK) == 0 else {
            throw StoreError.invalid("not_writable", "the daemon cannot write to \(dir): \(String(cString: strerror(errno)))")
        }
    }

    /// fsync of a file or directory.
    static func syncFile(_ path: String) throws {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            throw StoreError(.internalFailure, kind: "io_error", "cannot open \(path): \(String(cString: strerror(errno)))")
        }
        defer { Glibc.close(fd) }
        guard fsync(fd) == 0 else {
            throw StoreError(.internalFailure, kind: "io_error", "fsync \(path): \(String(cString: strerror(errno)))")
        }
    }

    /// True when the database holds changes authored elsewhere. An unshared database holds such changes only when it
    /// was restored from a backup of a shared one: they cannot be sealed again (only their author signs its log).
    public func holdsChangesOfOtherDevices() throws -> Bool {
        try read { db in
            try Bool.fetchOne(db, sql: "SELECT EXISTS(SELECT 1 FROM versions WHERE origin != ?)", arguments: [node.hex]) ?? false
        }
    }
}

extension Store {
    /// Creates the database `name` from a backup file made by `BlazeDatabase.backup(to:)`.
    ///
    /// The file is checked first (SQLite integrity, BlazeDB tables, a schema this version knows, and every schema
    /// object against the one BlazeDB's migrations create: a trigger, a view, an unknown or altered table is refused)
    /// and copied, never moved or modified. In the copy, unknown indexes are dropped, user indexes rebuilt from their
    /// definitions, and every stored document state, change and index definition validated like data from another
    /// device (`RestoreCheck`); anything out of bounds refuses the restore (`backup_invalid`). The copy is detached from sync: its space binding, peers, sealed entries and heads are
    /// removed, so it is a local database that can be shared anew (`db.share`) and never forks the log of the
    /// space it came from.
    public func restore(from backupPath: String, as name: String) throws -> BlazeDatabase {
        try Names.validateDatabase(name)
        guard backupPath.hasPrefix("/") else {
            throw StoreError.invalid("invalid_path", "the backup path must be absolute, got \(backupPath)")
        }
        guard FileManager.default.fileExists(atPath: backupPath) else {
            throw StoreError(.notFound, kind: "file_not_found", "backup file \(backupPath) does not exist")
        }
        var config = Configuration()
        config.readonly = true
        let source: DatabaseQueue
        do {
            source = try DatabaseQueue(path: backupPath, configuration: config)
        } catch {
            throw StoreError.invalid("not_a_backup", "\(backupPath) is not a SQLite database: \(error)")
        }
        defer { try? source.close() }
        try source.read { db in
            let problems: [String]
            do {
                problems = try String.fetchAll(db, sql: "PRAGMA integrity_check")
            } catch {
                throw StoreError.invalid("not_a_backup", "\(backupPath) is not a SQLite database: \(error)")
            }
            guard problems == ["ok"] else {
                throw StoreError.invalid(
                    "backup_corrupt", "\(backupPath) fails SQLite's integrity check: \(problems.prefix(3).joined(separator: "; "))")
            }
            for table in ["meta", "docs", "changes"] where try !db.tableExists(table) {
                throw StoreError.invalid("not_a_backup", "\(backupPath) is not a BlazeDB database (it has no \(table) table)")
            }
            guard try !Schema.migrator.hasBeenSuperseded(db) else {
                throw StoreError.invalid("backup_too_new", "\(backupPath) was written by a newer BlazeDB; upgrade blazed to restore it")
            }
        }
        let (extraIndexes, extraTriggers) = try source.read { db in try RestoreCheck.schemaObjects(db, path: backupPath) }
        let path = self.path(name)
        let partial = path + ".partial"
        try reserve(name)
        defer { release(name) }
        do {
            unlink(partial)
            var targetConfig = Configuration()
            targetConfig.prepareDatabase { db in db.add(function: VectorIndexSQL.function) }
            let target = try DatabaseQueue(path: partial, configuration: targetConfig)
            try source.backup(to: target)
            try target.write { db in
                // Vector indexes' triggers go before anything writes (the file's are not trusted: they are built
                // again from the definitions below).
                for name in extraTriggers { try db.execute(sql: "DROP TRIGGER \(name.quotedDatabaseIdentifier)") }
                // Indexes are derived data: any the schema check did not recognize is dropped and the user
                // indexes are rebuilt from their definitions below.
                for name in extraIndexes { try db.execute(sql: "DROP INDEX \(name.quotedDatabaseIdentifier)") }
                try db.execute(sql: "DELETE FROM meta WHERE key = 'space_id'")
                // A restored copy is detached from its space: it keeps none of its sync state, its membership log (so
                // a new share starts a new log) or the invites it issued (so a copy of the file redeems none).
                for table in [
                    "sync_entries", "sync_heads", "sync_peers", "sync_forks", "sync_folders", "sync_folder_heads", "sync_pruned",
                    "sync_acks", "sync_formats", "sync_membership", "sync_invites",
                ] where try db.tableExists(table) {
                    try db.execute(sql: "DELETE FROM \(table)")
                }
            }
            // Our own migrations bring an older backup up to date (the schema check has refused triggers, so
            // nothing runs but them), then every row is validated like data from another device.
            try Schema.migrator.migrate(target)
            try target.write { db in
                try RestoreCheck.rows(db, path: backupPath, limits: limits)
                try RestoreCheck.rebuildUserIndexes(db, limits: limits)
                // The feed's events are the original database's history for its subscribers, and nothing validates
                // them: the new database starts its feed empty, after the last sequence the original used.
                let last = try Int64.fetchOne(db, sql: "SELECT max(seq) FROM feed") ?? 0
                let floor = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'feed_floor'").flatMap { Int64($0) }
                try db.execute(sql: "DELETE FROM feed")
                try db.execute(
                    sql: "INSERT INTO meta(key, value) VALUES ('feed_floor', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    arguments: [String(max(last, max(0, floor ?? 0)))])
            }
            try target.close()
            try BlazeDatabase.syncFile(partial)
            guard link(partial, path) == 0 else {
                throw StoreError(.alreadyExists, kind: "database_exists", "database \(Names.quoted(name)) already exists")
            }
            unlink(partial)
        } catch {
            for suffix in ["", "-journal", "-wal", "-shm"] { unlink(partial + suffix) }
            throw error
        }
        return try database(name)
    }
}

/// The checks a backup file passes before its copy becomes a database: the file is as hostile as a peer.
enum RestoreCheck {
    /// Tables SQLite itself creates (ANALYZE statistics, AUTOINCREMENT counters): data, never code.
    static let sqliteTables: Set<String> = ["sqlite_stat1", "sqlite_stat4", "sqlite_sequence"]

    /// Compares every schema object of `db` with those BlazeDB's migrations create at the same migration level.
    /// Returns the names of indexes that are not BlazeDB's own (dropped from the copy; user indexes are rebuilt);
    /// throws `backup_tampered` for anything else that differs.
    static func schemaObjects(_ db: Database, path: String) throws -> (indexes: [String], triggers: [String]) {
        let applied = try Schema.migrator.appliedIdentifiers(db)
        let reference = try DatabaseQueue()
        var migrator = Schema.migrator
        migrator.eraseDatabaseOnSchemaChange = false
        if let last = Schema.migrator.migrations.last(where: { applied.contains($0) }) {
            try migrator.migrate(reference, upTo: last)
        } else {
            try migrator.migrate(reference, upTo: Schema.migrator.migrations[0])
        }
        struct Object: Hashable {
            let type: String, name: String, table: String, sql: String?
        }
        let query = "SELECT type, name, tbl_name, sql FROM sqlite_master"
        let expected = try reference.read { db in
            try Row.fetchAll(db, sql: query).map { Object(type: $0[0], name: $0[1], table: $0[2], sql: $0[3]) }
        }
        let known = Set(expected)
        let knownTables = Set(expected.filter { $0.type == "table" }.map(\.name))
        var extraIndexes: [String] = []
        var extraTriggers: [String] = []
        for row in try Row.fetchAll(db, sql: query) {
            let object = Object(type: row[0], name: row[1], table: row[2], sql: row[3])
            if known.contains(object) || (object.type == "table" && sqliteTables.contains(object.name)) { continue }
            if object.type == "index", knownTables.contains(object.table), object.sql != nil {
                extraIndexes.append(object.name)
                continue
            }
            // A vector index's triggers (VectorIndexSQL): dropped before anything writes, built again.
            if object.type == "trigger", object.table == "docs", object.name.hasPrefix("vx_") {
                extraTriggers.append(object.name)
                continue
            }
            let what = object.type == "table" && knownTables.contains(object.name) ? "an altered table" : "a \(object.type)"
            throw StoreError.invalid(
                "backup_tampered",
                "\(path) holds \(what) \(Names.quoted(object.name)) that BlazeDB never creates; it was not written by "
                    + "BlazeDB (or was altered since): refusing to restore it")
        }
        return (extraIndexes, extraTriggers)
    }

    /// Validates every stored row a database acts on: document states, changes (op log and parked), version
    /// vector, index definitions, metadata. Throws `backup_invalid` naming the first bad row.
    static func rows(_ db: Database, path: String, limits: StoreLimits) throws {
        func invalid(_ what: String) -> StoreError {
            StoreError.invalid("backup_invalid", "\(path) holds \(what); refusing to restore it")
        }
        // SQLite's column affinity does not enforce types, and decoding a value of the wrong type traps: every column
        // the daemon reads must hold its type before any row is decoded.
        for (table, columns) in columnTypes {
            let wrong = columns.map { "typeof(\($0.column)) NOT IN (\($0.types.map { "'\($0)'" }.joined(separator: ", ")))" }
            let found = try String.fetchOne(
                db, sql: "SELECT \(columns.map(\.column).joined(separator: " || ','|| ")) FROM \(table) WHERE "
                    + wrong.joined(separator: " OR ") + " LIMIT 1")
            guard found == nil else { throw invalid("a value of the wrong type in table \(table)") }
        }
        // SQLite never gives a row id ≤ 0 itself; a vector index's build marker is document −1.
        guard try Int.fetchOne(db, sql: "SELECT count(*) FROM docs WHERE rowid <= 0") == 0 else {
            throw invalid("a document row id of 0 or less")
        }
        let homeText = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'stamp_home'")
        var coding = StampCoding.hex
        if let homeText {
            guard let home = NodeID(hex: homeText) else { throw invalid("an invalid stamp_home") }
            coding = StampCoding(home: home)
        }
        let now = BlazeDatabase.nowMilliseconds()
        let latestClock = HLC(milliseconds: now + limits.maxClockAheadMilliseconds)
        let hasChanges = try Bool.fetchOne(db, sql: "SELECT EXISTS(SELECT 1 FROM versions)") ?? false
        for (table, hasBody) in [("docs", true), ("tombstones", false)] {
            let rows = try Row.fetchCursor(
                db, sql: "SELECT collection, id, state, \(hasBody ? "body" : "NULL") FROM \(table)")
            while let row = try rows.next() {
                let collection: String = row[0], id: String = row[1]
                let where_ = "document \(Names.quoted(id)) of collection \(Names.quoted(collection))"
                guard (try? Names.validateCollection(collection)) != nil, (try? Names.validateID(id)) != nil else {
                    throw invalid("an invalid name in \(where_)")
                }
                guard let stateText: String = row[2] else {
                    // Only data from before replication has no state, and only while no change exists.
                    guard table == "docs", !hasChanges else { throw invalid("no state for \(where_)") }
                    continue
                }
                let body: String? = row[3]
                guard let state = try? SQLStorage.decode(state: stateText, body: body, coding),
                    table == "docs" ? state.isAlive : !state.isAlive, state.maxClock <= latestClock
                else { throw invalid("an invalid state for \(where_)") }
                // Reads hand a stored body out as it is (spliced into responses): it must be the canonical text of
                // the document it holds, one line, keys sorted, nothing around it.
                if let body {
                    let parsed: JSONValue
                    do {
                        parsed = try JSONParser(maxDepth: limits.maxDepth + 4).parse(body)
                    } catch {
                        throw invalid(
                            error.kind == "depth"
                                ? "a document nested deeper than this daemon's max-depth (\(limits.maxDepth)) in \(where_)"
                                : "a document body that is not JSON in \(where_)")
                    }
                    guard case .object(let doc) = parsed, JSONValue.object(doc).jsonText == body
                    else { throw invalid("a document body that is not its canonical JSON text in \(where_)") }
                }
            }
        }
        let validator = ChangeValidator(limits: limits, now: now)
        for table in ["changes", "parked"] {
            let clock = table == "changes" ? "hlc" : "NULL"
            let rows = try Row.fetchCursor(db, sql: "SELECT origin, seq, body, \(clock) FROM \(table)")
            while let row = try rows.next() {
                let origin: String = row[0], seq: Int64 = row[1], body: String = row[2], hlc: Int64? = row[3]
                guard let change = try? Change(json: try JSONParser(maxDepth: limits.maxDepth + 4).parse(body)),
                    change.origin.hex == origin, Int64(exactly: change.seq) == seq, validator.accepts(change),
                    hlc == nil || hlc == Int64(bitPattern: change.hlc.raw)
                else { throw invalid("an invalid change \(seq) of \(origin) in \(table)") }
            }
        }
        for row in try Row.fetchAll(db, sql: "SELECT name, state FROM index_states") {
            let name: String = row[0], state: String = row[1]
            guard case .object(let o)? = try? JSONParser(maxDepth: 8).parse(state), let stamp = o["s"].flatMap({ Stamp(json: $0) }),
                stamp.hlc.raw < ChangeBounds.maxClock, case .string? = o["c"]
            else { throw invalid("an invalid state of index \(Names.quoted(name))") }
        }
        for row in try Row.fetchAll(db, sql: "SELECT origin, seq FROM versions") {
            let origin: String = row[0], seq: Int64 = row[1]
            guard NodeID(hex: origin) != nil, seq > 0, UInt64(seq) < SyncBounds.maxSeq else {
                throw invalid("an invalid version vector entry for \(origin)")
            }
        }
        for row in try Row.fetchAll(db, sql: "SELECT name, collection, fields, vector FROM indexes") {
            let name: String = row[0], collection: String = row[1], fields: String = row[2], vector: String? = row[3]
            guard (try? Names.validateIndex(name)) != nil, (try? Names.validateCollection(collection)) != nil,
                case .array(let list)? = try? JSONParser(maxDepth: 4).parse(fields), !list.isEmpty,
                list.allSatisfy({ $0.stringValue.flatMap { try? FieldPath($0) } != nil }),
                vector.map({ v in
                    list.count == 1 && (try? JSONParser(maxDepth: 4).parse(v)).map(IndexVector.init(json:)).map {
                        VectorMetric(rawValue: $0.metric) != nil && $0.dimensions >= 1 && $0.dimensions <= VectorValue.maxDimensions
                    } == true
                }) ?? true
            else { throw invalid("an invalid definition of index \(Names.quoted(name))") }
        }
    }

    /// The SQLite types each column the daemon reads may hold (`sync_*` and `feed` are emptied by the restore).
    static let columnTypes: [(table: String, columns: [(column: String, types: [String])])] = [
        ("meta", [("key", ["text"]), ("value", ["text"])]),
        ("collections", [("name", ["text"]), ("created_at", ["integer"])]),
        ("docs", [("collection", ["text"]), ("id", ["text"]), ("body", ["text"]), ("state", ["text", "null"]),
            ("conflicted", ["integer"])]),
        ("tombstones", [("collection", ["text"]), ("id", ["text"]), ("state", ["text"])]),
        ("changes", [("origin", ["text"]), ("seq", ["integer"]), ("hlc", ["integer"]), ("body", ["text"])]),
        ("parked", [("origin", ["text"]), ("seq", ["integer"]), ("body", ["text"])]),
        ("versions", [("origin", ["text"]), ("seq", ["integer"])]),
        ("indexes", [
            ("name", ["text"]), ("collection", ["text"]), ("fields", ["text"]), ("created_at", ["integer"]),
            ("vector", ["text", "null"]),
        ]),
        ("index_states", [("name", ["text"]), ("state", ["text"])]),
    ]
}

/// The checks of `BlazeDatabase.validate` (bounds, names, sizes) and the clock window, as a predicate over stored changes.
struct ChangeValidator {
    let limits: StoreLimits
    let now: UInt64

    func accepts(_ change: Change) -> Bool {
        (try? ChangeBounds.check(change)) != nil
            && (try? ChangeBounds.checkClock(change, now: now, maxAhead: limits.maxClockAheadMilliseconds)) != nil
            && (try? BlazeDatabase.validate(change, size: nil, limits: limits)) != nil
    }
}
