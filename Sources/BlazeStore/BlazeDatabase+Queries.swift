import BlazeCRDT
import BlazeProtocol
import BlazeVector
import Foundation
import GRDB
import Synchronization

/// A collection as listed by `collection.list`.
public struct CollectionInfo: Sendable, Equatable {
    /// The collection name.
    public var name: String
    /// Number of documents it holds.
    public var count: Int
}

/// A user index definition.
public struct IndexInfo: Sendable, Equatable {
    /// Index name, unique in its database.
    public var name: String
    /// The collection it covers.
    public var collection: String
    /// Indexed field paths, in order.
    public var fields: [String]
    /// A vector index's dimensions and metric; nil for an index of values.
    public var vector: IndexVector?
    /// False for a definition kept but not built, past the database's limits on indexes.
    public var built = true

    /// An index's definition.
    public init(name: String, collection: String, fields: [String], vector: IndexVector? = nil, built: Bool = true) {
        (self.name, self.collection, self.fields, self.vector, self.built) = (name, collection, fields, vector, built)
    }
}

/// A page of query results.
public struct FindResult: Sendable {
    /// Matching documents, projected if requested.
    public var docs: [JSONValue]
    /// Token for the next page, nil when this page is the last.
    public var cursor: String?
}

/// The plan SQLite chose for a query.
public struct ExplainResult: Sendable {
    /// The compiled SQL (values are bound, not shown).
    public var sql: String
    /// SQLite's `EXPLAIN QUERY PLAN` detail lines.
    public var plan: [String]
    /// Names of user indexes the plan uses.
    public var indexes: [String]
}

/// Summary facts about a database.
public struct DatabaseSummary: Sendable {
    /// Database name.
    public var name: String
    /// Path of its SQLite file.
    public var path: String
    /// Number of collections.
    public var collections: Int
    /// Number of documents in all collections.
    public var documents: Int
    /// Size on disk of the database file and its WAL, in bytes.
    public var sizeBytes: Int64
}

/// Reads: documents by id, queries, listings, the summary.
extension BlazeDatabase {
    static func decodeBody(_ text: String) throws -> [String: JSONValue] {
        guard case .object(let o) = try JSONParser(maxDepth: 10_000).parse(text) else {
            throw StoreError(.internalFailure, kind: "corrupt_document", "stored document is not an object")
        }
        return o
    }

    /// Fetches one document; throws `document_not_found` for an unknown id (in a collection that exists or not: on a
    /// replica, a collection appears when sync brings it, and reads do not make apps tell "not yet" apart).
    public func get(collection: String, id: String, fields: [FieldPath]? = nil) throws -> JSONValue {
        try Names.validateCollection(collection)
        try Names.validateID(id)
        return try read { db in
            let stmt = try db.cachedStatement(sql: "SELECT body FROM docs WHERE collection = ? AND id = ?")
            guard let text = try String.fetchOne(stmt, arguments: [collection, id]) else {
                throw StoreError(
                    .notFound, kind: "document_not_found",
                    "no document \(Names.quoted(id)) in collection \(collection)")
            }
            let doc = try Self.decodeBody(text)
            return .object(fields.map { Projection.apply($0, to: doc) } ?? doc)
        }
    }

    /// The stored canonical JSON text of one document (what `get` without `fields` returns, as written); throws
    /// `document_not_found` for an unknown id, as `get`.
    ///
    /// One statement on a fast read connection (`ReadConnections`), in its kept snapshot when nothing committed since.
    public func getText(collection: String, id: String) throws -> [UInt8] {
        try Names.validateCollection(collection)
        try Names.validateID(id)
        let found = try connections.read(budget: .unbounded) { c -> [UInt8]? in
            guard let text = try c.first(Self.documentSQL, [collection.databaseValue, id.databaseValue], { $0.textBytes(0) }),
                let text
            else { return nil }
            return try Self.spliceable(text)
        }
        if let found { return found }
        throw StoreError(.notFound, kind: "document_not_found", "no document \(Names.quoted(id)) in collection \(collection)")
    }

    static let documentSQL = "SELECT body FROM docs WHERE collection = ? AND id = ?"

    /// Fetches many documents by id, in the order given; missing ones are `null` (all of them in a collection that
    /// does not exist).
    public func getMany(collection: String, ids: [String], fields: [FieldPath]? = nil) throws -> [JSONValue] {
        guard ids.count <= limits.maxGetMany else {
            throw StoreError(
                .limitExceeded, kind: "too_many_ids", "at most \(limits.maxGetMany) ids per call, got \(ids.count)")
        }
        try Names.validateCollection(collection)
        for id in ids { try Names.validateID(id) }
        return try read { db in
            let stmt = try db.cachedStatement(sql: "SELECT body FROM docs WHERE collection = ? AND id = ?")
            return try ids.map { id in
                guard let text = try String.fetchOne(stmt, arguments: [collection, id]) else { return .null }
                let doc = try Self.decodeBody(text)
                return .object(fields.map { Projection.apply($0, to: doc) } ?? doc)
            }
        }
    }

    /// Checks the collection name and the page size of a find or explain.
    func validate(_ query: FindQuery) throws {
        try Names.validateCollection(query.collection)
        guard query.limit >= 1, query.limit <= limits.maxQueryLimit else {
            throw StoreError(
                .limitExceeded, kind: "limit_out_of_range",
                "limit must be between 1 and \(limits.maxQueryLimit), got \(query.limit)")
        }
    }

    /// Runs a find query and returns one page (within `budget` on a fast read connection, as `findResultText`).
    public func find(_ query: FindQuery, budget: ReadBudget = .unbounded) throws -> FindResult {
        let (texts, cursor) = try findTexts(query, budget: budget)
        var docs: [JSONValue] = []
        docs.reserveCapacity(texts.count)
        for text in texts {
            let doc = try Self.decodeBody(String(decoding: text, as: UTF8.self))
            docs.append(.object(query.fields.map { Projection.apply($0, to: doc) } ?? doc))
        }
        return FindResult(docs: docs, cursor: cursor)
    }

    /// A find query's page as the JSON text of `query.find`'s result, `{"cursor":…,"docs":[…]}`: without `fields`,
    /// the stored documents' texts are spliced in as they are.
    ///
    /// Within `budget` when it runs on a fast read connection (`ReadBudgetExceeded` when that runs out).
    public func findResultText(_ query: FindQuery, budget: ReadBudget = .unbounded) throws -> [UInt8] {
        guard query.fields == nil else {
            let r = try find(query, budget: budget)
            return JSONValue.object(["docs": .array(r.docs), "cursor": r.cursor.map(JSONValue.string) ?? .null]).jsonBytes
        }
        let (texts, cursor) = try findTexts(query, budget: budget)
        var out = Array("{\"cursor\":".utf8)
        out.reserveCapacity(texts.reduce(64) { $0 + $1.count + 1 })
        out += (cursor.map(JSONValue.string) ?? .null).jsonBytes
        out += Array(",\"docs\":[".utf8)
        for (i, text) in texts.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out += text
        }
        out += Array("]}".utf8)
        return out
    }

    /// The stored texts of a find query's page and the cursor of the next page.
    func findTexts(_ query: FindQuery, budget: ReadBudget = .unbounded) throws -> (texts: [[UInt8]], cursor: String?) {
        try validate(query)
        let compiled = QueryCompiler.find(query, limit: query.limit + 1)
        return try connections.read(budget: budget) { c in try Self.findPage(c, query, compiled) }
    }

    /// One page of a find query on a fast read connection.
    static func findPage(
        _ c: ReadConnection, _ query: FindQuery, _ compiled: CompiledSQL
    ) throws -> (texts: [[UInt8]], cursor: String?) {
        var texts: [[UInt8]] = []
        texts.reserveCapacity(min(query.limit, 256))
        var next: String?
        var last: (id: String, keys: [JSONValue])?
        try c.query(compiled.sql, compiled.values) { row in
            guard texts.count < query.limit else {
                // One row more than the page: there is a next page, which starts after the page's last row.
                if let last { next = QueryCursor(keys: last.keys, id: last.id, shape: query.shape).token }
                return false
            }
            texts.append(try spliceable(row.textBytes(1) ?? []))
            if texts.count == query.limit {
                let id = String(decoding: row.textBytes(0) ?? [], as: UTF8.self)
                last = (id, (0..<(2 * query.sort.count)).map { jsonValue(row.value(Int32(2 + $0))) })
            }
            return true
        }
        return (texts, next)
    }

    /// A stored body as it may be spliced into a response line: as it is, unless it holds a line break (never in the
    /// canonical text every write path stores, which restores check; should one be there anyway, it is parsed and
    /// written again rather than let split the line).
    static func spliceable(_ text: [UInt8]) throws -> [UInt8] {
        let hasBreak = text.withUnsafeBufferPointer { bytes in
            // Scanned through the buffer: the array's generic iterator cost a third of reading a page of results.
            for b in bytes where b == 0x0A || b == 0x0D { return true }
            return false
        }
        guard hasBreak else { return text }
        return JSONValue.object(try decodeBody(String(decoding: text, as: UTF8.self))).jsonBytes
    }

    /// Distinct query texts kept prepared per connection.
    static let maxCachedQueryShapes = 256

    static func jsonValue(_ v: DatabaseValue) -> JSONValue {
        switch v.storage {
        case .null: return .null
        case .int64(let i): return .int(i)
        case .double(let d): return .double(d)
        case .string(let s): return .string(s)
        case .blob(let b): return .string(String(decoding: b, as: UTF8.self))
        }
    }

    /// Counts matching documents (0 in a collection that does not exist).
    ///
    /// Within `budget` when it runs on a fast read connection (`ReadBudgetExceeded` when that runs out).
    public func count(collection: String, filter: Filter, budget: ReadBudget = .unbounded) throws -> Int {
        try Names.validateCollection(collection)
        let compiled = QueryCompiler.count(collection: collection, filter: filter)
        return try connections.read(budget: budget) { c -> Int in
            Int(try c.first(compiled.sql, compiled.values) { $0.int64(0) } ?? 0)
        }
    }

    /// Returns SQLite's plan for a find query and the user indexes it uses.
    public func explain(_ query: FindQuery) throws -> ExplainResult {
        try validate(query)
        let compiled = QueryCompiler.find(query, limit: query.limit + 1)
        return try read { db in
            // EXPLAIN reads no table, so SQLite would plan with this connection's schema as last loaded (without an
            // index created since): a read of a table first brings the schema up to date.
            _ = try Int.fetchOne(db, sql: "SELECT 1 FROM collections LIMIT 1")
            let rows = try Row.fetchAll(
                db, sql: "EXPLAIN QUERY PLAN " + compiled.sql, arguments: compiled.arguments)
            let plan: [String] = rows.map { $0["detail"] }
            var used: [String] = []
            for line in plan {
                var rest = Substring(line)
                while let r = rest.range(of: "INDEX ux_") {
                    let tail = rest[r.upperBound...]
                    let name = tail.prefix { $0 != " " && $0 != "(" }
                    if !used.contains(String(name)) { used.append(String(name)) }
                    rest = tail
                }
            }
            return ExplainResult(sql: compiled.sql, plan: plan, indexes: used)
        }
    }

    /// Lists the collections that hold documents or indexes, with their document counts (a collection whose
    /// documents were all deleted, or that was dropped, is not listed; reads of it answer as for an empty one).
    public func collections() throws -> [CollectionInfo] {
        try read { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT name, n FROM (
                        SELECT c.name AS name, (SELECT count(*) FROM docs d WHERE d.collection = c.name) AS n,
                            EXISTS (SELECT 1 FROM indexes i WHERE i.collection = c.name) AS indexed
                        FROM collections c)
                    WHERE n > 0 OR indexed ORDER BY name
                    """
            ).map { CollectionInfo(name: $0[0], count: $0[1]) }
        }
    }

    /// Lists user indexes, optionally of one collection (none for a collection that does not exist).
    public func indexes(collection: String? = nil) throws -> [IndexInfo] {
        if let collection { try Names.validateCollection(collection) }
        return try read { db in
            let rows = try Row.fetchAll(
                db, sql: "SELECT name, collection, fields, vector FROM indexes WHERE ?1 IS NULL OR collection = ?1 ORDER BY name",
                arguments: [collection])
            var out = try rows.map { row in
                let fields = try JSONParser().parse(row[2] as String).arrayValue?.compactMap(\.stringValue) ?? []
                let vector = try (row[3] as String?).map { IndexVector(json: try JSONParser(maxDepth: 4).parse($0)) }
                return IndexInfo(name: row[0], collection: row[1], fields: fields, vector: vector)
            }
            // Definitions kept past the limits; those this build cannot build (invalid, or of a shape a newer build
            // reads) are never built and not listed.
            for name in try SQLStorage.keptDefinitions(collection: collection, db) where (try? Names.validateIndex(name)) != nil {
                guard let text = try String.fetchOne(db, sql: "SELECT state FROM index_states WHERE name = ?", arguments: [name]),
                    case .object(let o)? = try? JSONParser(maxDepth: 64).parse(text), case .string(let c)? = o["c"],
                    (try? Names.validateCollection(c)) != nil, let fields = o["f"]?.arrayValue?.compactMap(\.stringValue),
                    !fields.isEmpty, fields.allSatisfy({ (try? FieldPath($0)) != nil })
                else { continue }
                let vector = o["v"].map(IndexVector.init(json:))
                if let vector, fields.count != 1 || vector.dimensions < 1 || vector.dimensions > VectorValue.maxDimensions
                    || VectorMetric(rawValue: vector.metric) == nil
                {
                    continue
                }
                out.append(IndexInfo(name: name, collection: c, fields: fields, vector: vector, built: false))
            }
            return out.sorted { $0.name.utf8.lexicographicallyPrecedes($1.name.utf8) }
        }
    }

    /// Summary facts for `db.info`.
    public func summary() throws -> DatabaseSummary {
        let (collections, documents) = try read { db in
            (
                try Int.fetchOne(
                    db,
                    sql: """
                        SELECT count(*) FROM collections c WHERE EXISTS (SELECT 1 FROM docs d WHERE d.collection = c.name)
                            OR EXISTS (SELECT 1 FROM indexes i WHERE i.collection = c.name)
                        """) ?? 0,
                try Int.fetchOne(db, sql: "SELECT count(*) FROM docs") ?? 0
            )
        }
        var size: Int64 = 0
        for suffix in ["", "-wal"] {
            let attrs = try? FileManager.default.attributesOfItem(atPath: path + suffix)
            size += (attrs?[.size] as? NSNumber)?.int64Value ?? 0
        }
        return DatabaseSummary(name: name, path: path, collections: collections, documents: documents, sizeBytes: size)
    }
}
