import BlazeCRDT
import BlazeProtocol
import BlazeVector
import Foundation
import GRDB

/// The stored, local side of vector indexes: `vector_rows` holds, per index, the float32 bytes of each document's
/// vector (NULL: not a vector of the index's dimensions, or no longer there: a document that held one lost it or went;
/// a document that never held one has no row), kept by triggers on `docs` in the transaction of every write — local,
/// remote, snapshot install, restore — so it is never behind the documents. Rows only grow in `seq`: a reader holding
/// an index in memory (`VectorIndexes`) catches up by reading the rows after the last it saw. Each build also writes
/// a marker row (document −1) holding 16 random bytes, renewed each time the index is written to its file
/// (`VectorIndexFile`), which names the build and the file's save.
///
/// Never synced, and never taken from a backup: built again from the definitions whenever a definition is saved, and
/// on restore.
enum VectorIndexSQL {
    /// `blaze_vector(text, dimensions)`: the float32 bytes of a stored vector's base64 text when it has exactly that
    /// many finite components, else NULL. Registered on the writer, whose triggers call it.
    static let function = DatabaseFunction("blaze_vector", argumentCount: 2, pure: true) { values -> Data? in
        guard let text = String.fromDatabaseValue(values[0]), let dimensions = Int.fromDatabaseValue(values[1]),
            let floats = VectorValue.decode(text), floats.count == dimensions
        else { return nil }
        return floats.withUnsafeBytes { Data($0) }
    }

    /// The SQL literal of the JSON path of a vector field's base64 text (`'$."emb"."$vector"'`).
    static func vectorPath(_ path: FieldPath) -> String {
        String(QueryCompiler.pathLiteral(path).dropLast()) + ".\"$vector\"'"
    }

    /// The names of index `name`'s triggers (insert, update, delete).
    static func triggers(_ name: String) -> [String] {
        ["vx_i_", "vx_u_", "vx_d_"].map { "\"\($0)\(name)\"" }
    }

    /// Builds vector index `name` over `path` of `collection` (names validated by the caller): its triggers, and a
    /// row for every document the collection holds now.
    static func build(_ name: String, collection: String, path: FieldPath, dimensions: Int, in db: Database) throws {
        try drop(name, in: db)
        let p = vectorPath(path)
        let vector = "blaze_vector(json_extract(new.body, \(p)), \(dimensions))"
        let names = triggers(name)
        try db.execute(
            sql: """
                CREATE TRIGGER \(names[0]) AFTER INSERT ON docs
                WHEN new.collection = '\(collection)' AND json_extract(new.body, \(p)) IS NOT NULL BEGIN
                    DELETE FROM vector_rows WHERE idx = '\(name)' AND doc = new.rowid;
                    INSERT INTO vector_rows(idx, doc, v) VALUES ('\(name)', new.rowid, \(vector));
                END;
                CREATE TRIGGER \(names[1]) AFTER UPDATE OF body ON docs
                WHEN new.collection = '\(collection)' AND json_extract(old.body, \(p)) IS NOT json_extract(new.body, \(p)) BEGIN
                    DELETE FROM vector_rows WHERE idx = '\(name)' AND doc = new.rowid;
                    INSERT INTO vector_rows(idx, doc, v) VALUES ('\(name)', new.rowid, \(vector));
                END;
                CREATE TRIGGER \(names[2]) AFTER DELETE ON docs
                WHEN old.collection = '\(collection)' AND json_extract(old.body, \(p)) IS NOT NULL BEGIN
                    DELETE FROM vector_rows WHERE idx = '\(name)' AND doc = old.rowid;
                    INSERT INTO vector_rows(idx, doc, v) VALUES ('\(name)', old.rowid, NULL);
                END;
                """)
        // The build's marker (document -1, never a row id): its seq tells a reader holding the index in memory
        // that the rows were built again.
        // It holds 16 random bytes, which name this build in the index's file (`VectorIndexFile`): a seq alone may
        // come again after a restore resets the sequence.
        try db.execute(sql: "INSERT INTO vector_rows(idx, doc, v) VALUES (?, -1, randomblob(16))", arguments: [name])
        try db.execute(
            sql: """
                INSERT INTO vector_rows(idx, doc, v)
                SELECT ?, rowid, blaze_vector(json_extract(body, \(p)), ?) FROM docs
                WHERE collection = ? AND json_extract(body, \(p)) IS NOT NULL
                """,
            arguments: [name, dimensions, collection])
    }

    /// The seq of index `name`'s build marker (changes each time its rows are built again), nil when it is not built.
    static func build(of name: String, in db: Database) throws -> Int64? {
        try Int64.fetchOne(
            db.cachedStatement(sql: "SELECT seq FROM vector_rows WHERE idx = ? AND doc = -1"), arguments: [name])
    }

    /// The 16 bytes of index `name`'s build marker of seq `build`; nil when it has none (built before markers held
    /// them) or the index was built again.
    static func nonce(of name: String, build: Int64, in db: Database) throws -> [UInt8]? {
        let bytes = try Data.fetchOne(
            db.cachedStatement(sql: "SELECT v FROM vector_rows WHERE idx = ? AND doc = -1 AND seq = ?"), arguments: [name, build])
        return bytes.flatMap { $0.count == 16 ? Array($0) : nil }
    }

    /// Gives index `name`'s marker of build `build` 16 new random bytes and returns them, for a file about to be
    /// written: a copy of the database older than that write (a file-system snapshot, a file copied back by hand)
    /// then holds other bytes and never takes the file. Nil when the index was built again or dropped.
    static func renewNonce(of name: String, build: Int64, in db: Database) throws -> [UInt8]? {
        try db.execute(
            sql: "UPDATE vector_rows SET v = randomblob(16) WHERE idx = ? AND doc = -1 AND seq = ?", arguments: [name, build])
        return try nonce(of: name, build: build, in: db)
    }

    /// Removes index `name`'s triggers and rows.
    static func drop(_ name: String, in db: Database) throws {
        for trigger in triggers(name) { try db.execute(sql: "DROP TRIGGER IF EXISTS \(trigger)") }
        try db.execute(sql: "DELETE FROM vector_rows WHERE idx = ?", arguments: [name])
    }

    /// Removes every vector index's triggers and rows (before a snapshot replaces the documents; its definitions
    /// build them again).
    static func dropAll(in db: Database) throws {
        let names = try String.fetchAll(
            db, sql: "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'docs' AND name LIKE 'vx\\_%' ESCAPE '\\'")
        for name in names { try db.execute(sql: "DROP TRIGGER \(name.quotedDatabaseIdentifier)") }
        try db.execute(sql: "DELETE FROM vector_rows")
    }

    /// Builds every vector index from its definition in `indexes` (after a restore dropped what the file held).
    static func rebuildAll(in db: Database) throws {
        try dropAll(in: db)
        for row in try Row.fetchAll(db, sql: "SELECT name, collection, fields, vector FROM indexes WHERE vector IS NOT NULL") {
            let name: String = row[0], collection: String = row[1], fields: String = row[2], vector: String = row[3]
            let spec = IndexVector(json: try JSONParser(maxDepth: 4).parse(vector))
            guard spec.dimensions > 0,
                case .array(let list) = try JSONParser(maxDepth: 4).parse(fields), list.count == 1,
                let field = list[0].stringValue
            else { continue }
            try build(name, collection: collection, path: try FieldPath(field), dimensions: spec.dimensions, in: db)
        }
    }
}
