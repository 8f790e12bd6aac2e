import BlazeProtocol
import Foundation
import GRDB

/// One operation of a write transaction, as accepted by `tx.commit` and the single-document write methods.
public enum WriteOp: Sendable, Equatable {
    /// Insert a new document; fails if the id exists. The id is generated when `_id` is absent.
    case insert(collection: String, doc: [String: JSONValue])
    /// Create or fully replace the document with this id.
    case put(collection: String, id: String, doc: [String: JSONValue])
    /// Set and unset top-level fields of an existing document.
    case patch(collection: String, id: String, set: [String: JSONValue], unset: [String])
    /// Delete an existing document.
    case delete(collection: String, id: String)
}

/// What a write operation did.
public struct WriteResult: Sendable, Equatable {
    /// The document id written.
    public var id: String
    /// For `put`: whether the document was created (true) or replaced (false).
    public var created: Bool?
}

/// The one place local mutations happen, inside one SQLite transaction.
///
/// Every mutation goes through `apply(_:)`; the replication layer hooks here to record the same change in its op
/// log within the same transaction. Not Sendable: it lives only inside a GRDB write closure.
public final class WriteTransaction {
    let db: Database
    let limits: StoreLimits
    let now: Int64
    let knownCollections: KnownCollections
    /// Number of document mutations applied (feeds the planner-statistics refresh).
    private(set) var changes = 0

    init(db: Database, limits: StoreLimits, knownCollections: KnownCollections) {
        self.db = db
        self.limits = limits
        self.knownCollections = knownCollections
        self.now = Int64(Date().timeIntervalSince1970 * 1000)
    }

    /// Applies one operation; throws `StoreError` for invalid input or missing/duplicate documents.
    public func apply(_ op: WriteOp) throws -> WriteResult {
        changes += 1
        switch op {
        case .insert(let collection, var doc):
            try Names.validateCollection(collection)
            let id: String
            if let given = doc["_id"] {
                guard case .string(let s) = given else {
                    throw StoreError.invalid("invalid_id", "_id must be a string, got \(given.typeName)")
                }
                id = s
            } else {
                id = DocumentID.generate()
            }
            try Names.validateID(id)
            doc["_id"] = .string(id)
            let body = try encode(doc)
            try ensureCollection(collection)
            let stmt = try db.cachedStatement(
                sql: "INSERT INTO docs(collection, id, body) VALUES (?, ?, ?) ON CONFLICT(collection, id) DO NOTHING")
            try stmt.execute(arguments: [collection, id, body])
            if db.changesCount == 0 {
                throw StoreError(
                    .alreadyExists, kind: "document_exists",
                    "document \(Names.quoted(id)) already exists in \(collection); use doc.put to replace it")
            }
            return WriteResult(id: id)

        case .put(let collection, let id, var doc):
            try Names.validateCollection(collection)
            try Names.validateID(id)
            if let given = doc["_id"], given != .string(id) {
                throw StoreError.invalid("id_mismatch", "doc._id does not match the id parameter")
            }
            doc["_id"] = .string(id)
            let body = try encode(doc)
            try ensureCollection(collection)
            let insert = try db.cachedStatement(
                sql: "INSERT INTO docs(collection, id, body) VALUES (?, ?, ?) ON CONFLICT(collection, id) DO NOTHING")
            try insert.execute(arguments: [collection, id, body])
            if db.changesCount > 0 { return WriteResult(id: id, created: true) }
            let update = try db.cachedStatement(sql: "UPDATE docs SET body = ? WHERE collection = ? AND id = ?")
            try update.execute(arguments: [body, collection, id])
            return WriteResult(id: id, created: false)

        case .patch(let collection, let id, let set, let unset):
            try Names.validateCollection(collection)
            try Names.validateID(id)
            for key in set.keys { try Names.validateFieldName(key) }
            for key in unset {
                try Names.validateFieldName(key)
                if set[key] != nil {
                    throw StoreError.invalid("invalid_patch", "field \(Names.quoted(key)) is both set and unset")
                }
            }
            guard let text = try currentBody(collection, id) else { throw notFound(collection, id) }
            guard case .object(var doc) = try JSONParser(maxDepth: 10_000).parse(text) else {
                throw StoreError(.internalFailure, kind: "corrupt_document", "stored document is not an object")
            }
            for (k, v) in set { doc[k] = v }
            for k in unset { doc.removeValue(forKey: k) }
            let body = try encode(doc)
            let stmt = try db.cachedStatement(sql: "UPDATE docs SET body = ? WHERE collection = ? AND id = ?")
            try stmt.execute(arguments: [body, collection, id])
            return WriteResult(id: id)

        case .delete(let collection, let id):
            try Names.validateCollection(collection)
            try Names.validateID(id)
            let stmt = try db.cachedStatement(sql: "DELETE FROM docs WHERE collection = ? AND id = ?")
            try stmt.execute(arguments: [collection, id])
            if db.changesCount == 0 { throw notFound(collection, id) }
            return WriteResult(id: id)
        }
    }

    /// Creates a user index over `fields` of `collection`; returns its definition.
    public func createIndex(collection: String, fields: [String], name: String?) throws -> IndexInfo {
        try Names.validateCollection(collection)
        guard !fields.isEmpty, fields.count <= limits.maxIndexFields else {
            throw StoreError.invalid("invalid_index", "an index needs 1 to \(limits.maxIndexFields) fields")
        }
        let paths = try fields.map { (f: String) throws(StoreError) -> FieldPath in try FieldPath(f) }
        guard Set(paths).count == paths.count else {
            throw StoreError.invalid("invalid_index", "index fields must be distinct")
        }
        let indexName = name ?? ([collection] + fields).joined(separator: ".").prefix(128).description
        try Names.validateIndex(indexName)
        if try String.fetchOne(db, sql: "SELECT name FROM indexes WHERE name = ?", arguments: [indexName]) != nil {
            throw StoreError(.alreadyExists, kind: "index_exists", "index \(Names.quoted(indexName)) already exists")
        }
        try ensureCollection(collection)
        let info = IndexInfo(name: indexName, collection: collection, fields: paths.map(\.description))
        try db.execute(
            sql: "INSERT INTO indexes(name, collection, fields, created_at) VALUES (?, ?, ?, ?)",
            arguments: [indexName, collection, JSONValue.array(info.fields.map { .string($0) }).jsonText, now])
        try db.execute(
            sql: "CREATE INDEX \(Self.sqlIndexName(indexName)) ON docs(\(QueryCompiler.indexColumns(paths))) "
                + "WHERE collection = '\(collection)'")
        try BlazeDatabase.analyze(db)
        return info
    }

    /// Drops a user index by name.
    public func dropIndex(name: String) throws {
        try Names.validateIndex(name)
        try db.execute(sql: "DELETE FROM indexes WHERE name = ?", arguments: [name])
        guard db.changesCount > 0 else {
            throw StoreError(.notFound, kind: "index_not_found", "index \(Names.quoted(name)) does not exist")
        }
        try db.execute(sql: "DROP INDEX \(Self.sqlIndexName(name))")
        try BlazeDatabase.analyze(db)
    }

    static func sqlIndexName(_ name: String) -> String { "\"ux_\(name)\"" }

    func encode(_ doc: [String: JSONValue]) throws -> String {
        for key in doc.keys where key != "_id" { try Names.validateFieldName(key) }
        let bytes = JSONValue.object(doc).jsonBytes
        guard bytes.count <= limits.maxDocumentBytes else {
            throw StoreError(
                .limitExceeded, kind: "document_too_large",
                "document is \(bytes.count) bytes; the limit is \(limits.maxDocumentBytes)",
                details: ["limit": .int(Int64(limits.maxDocumentBytes))])
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// Registers the collection unless it is known to exist; the cache learns new names only after COMMIT.
    func ensureCollection(_ name: String) throws {
        if knownCollections.contains(name) { return }
        let stmt = try db.cachedStatement(sql: "INSERT OR IGNORE INTO collections(name, created_at) VALUES (?, ?)")
        try stmt.execute(arguments: [name, now])
        let known = knownCollections
        db.afterNextTransaction { _ in known.insert(name) }
    }

    func currentBody(_ collection: String, _ id: String) throws -> String? {
        let stmt = try db.cachedStatement(sql: "SELECT body FROM docs WHERE collection = ? AND id = ?")
        return try String.fetchOne(stmt, arguments: [collection, id])
    }

    func notFound(_ collection: String, _ id: String) -> StoreError {
        StoreError(.notFound, kind: "document_not_found", "no document \(Names.quoted(id)) in collection \(collection)")
    }
}
