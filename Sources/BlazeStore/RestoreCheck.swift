import BlazeCRDT
import BlazeProtocol
import BlazeVector
import Foundation
import GRDB

#if canImport(Glibc)
import Glibc
#endif

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
            // A backup's blob chunks, checked row by row as they are restored.
            if object.type == "table", object.name == "backup_chunks", object.sql == BackupChunks.createSQL { continue }
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
