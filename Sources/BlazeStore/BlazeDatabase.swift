import BlazeCRDT
import BlazeProtocol
import Crypto
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

/// One database: a SQLite file in WAL mode served through a GRDB `DatabasePool` (one writer, concurrent readers).
public final class BlazeDatabase: Sendable {
    /// The database name.
    public let name: String
    /// The SQLite file path.
    public let path: String
    /// Limits applied to writes and queries.
    public let limits: StoreLimits
    /// This replica's node id (the author of its local changes).
    public let node: NodeID
    let pool: DatabasePool
    let clock: Mutex<HybridClock>
    let knownCollections = KnownCollections()
    /// The live change feed: committed changes, in commit order, for subscribers.
    public let feed: ChangeFeed
    /// Runs WAL checkpoints off the writer's commit path.
    let checkpointer: Checkpointer
    /// How stored states write stamp origins: the database's home node (kept in `meta`) as `0`.
    let coding: StampCoding

    init(name: String, path: String, limits: StoreLimits, node: NodeID) throws {
        self.name = name
        self.path = path
        self.limits = limits
        self.node = node
        var config = Configuration()
        config.label = "blazedb.\(name)"
        config.busyMode = .timeout(10)
        pool = try DatabasePool(path: path, configuration: config)
        // Acknowledged writes are durable: fsync the WAL on every commit (DESIGN §4). Set on the single writer
        // connection after the pool exists, because GRDB switches WAL databases to NORMAL while setting up.
        try pool.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA synchronous = FULL; PRAGMA analysis_limit = \(Self.analysisLimit)")
        }
        try Schema.migrator.migrate(pool)
        // The home origin is the node that first opened the database, kept with it: a copy of the file elsewhere
        // reads its states the same.
        let stored = try pool.read { db in try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'stamp_home'") }
        let home = try stored ?? pool.write { db -> String? in
            try db.execute(sql: "INSERT OR IGNORE INTO meta(key, value) VALUES ('stamp_home', ?)", arguments: [node.hex])
            return try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'stamp_home'")
        }
        guard let home = home.flatMap(NodeID.init(hex:)) else {
            throw StoreError(.internalFailure, kind: "corrupt_database", "database \(Names.quoted(name)) has no valid stamp_home")
        }
        coding = StampCoding(home: home)
        let checkpointer = try Checkpointer(
            path: path, threshold: limits.walCheckpointPages, hardLimit: limits.walMaxPages,
            finishLimit: limits.walFinishPages)
        self.checkpointer = checkpointer
        pool.writeWithoutTransaction { checkpointer.install(on: $0) }
        let last = try pool.read { db in try Int64.fetchOne(db, sql: "SELECT max(hlc) FROM changes WHERE hlc >= 0") ?? 0 }
        clock = Mutex(HybridClock(last: HLC(raw: UInt64(bitPattern: last))))
        let (feedLast, feedFloor) = try pool.read { db in
            let floor = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'feed_floor'").flatMap { Int64($0) } ?? 0
            return (max(floor, try Int64.fetchOne(db, sql: "SELECT max(seq) FROM feed") ?? 0), floor)
        }
        feed = ChangeFeed(last: feedLast, floor: feedFloor)
        try pool.write { db in
            if try Int.fetchOne(db, sql: "SELECT count(*) FROM indexes") ?? 0 > 0 { try Self.analyze(db) }
        }
        try adoptUnreplicatedData()
    }

    /// Wall-clock milliseconds.
    static func nowMilliseconds() -> UInt64 { UInt64(max(0, Date().timeIntervalSince1970 * 1000)) }

    /// Data written before replication existed (schema v1) becomes one local change, so it replicates too.
    func adoptUnreplicatedData() throws {
        try write { tx in
            let db = tx.db
            // Only data from before replication has no state; it exists only while no change was ever recorded.
            guard try Int.fetchOne(db, sql: "SELECT count(*) FROM changes") == 0 else { return }
            let docs = try Row.fetchAll(
                db, sql: "SELECT collection, id, body FROM docs WHERE state IS NULL ORDER BY collection, id")
            let indexes = try Row.fetchAll(db, sql: "SELECT name, collection, fields FROM indexes ORDER BY name")
            try tx.adopt(docs: docs, indexes: indexes)
        }
    }

    /// Rows sampled per index by `ANALYZE`; bounds its cost to milliseconds whatever the table size.
    static let analysisLimit = 1000

    /// Changes since the last `ANALYZE`, and the threshold at which statistics count as stale.
    private let statistics = Mutex<(changes: Int, threshold: Int)>((0, 1000))

    /// Refreshes the planner statistics. Without them SQLite takes `collection = ?` for a selective term and
    /// prefers the (collection, id) key over a matching user index, scanning the whole collection.
    static func analyze(_ db: Database) throws {
        try db.execute(sql: "ANALYZE docs")
    }

    /// Counts `changes` and re-analyzes inside the current write once the data may have doubled since last time.
    func noteChanges(_ changes: Int, _ db: Database) throws {
        let due = statistics.withLock { s -> Bool in
            s.changes += changes
            return s.changes >= s.threshold
        }
        guard due else { return }
        try Self.analyze(db)
        let rows = try Int.fetchOne(db, sql: "SELECT count(*) FROM docs") ?? 0
        statistics.withLock { $0 = (0, max(1000, rows)) }
    }

    /// Runs `body` in one write transaction; everything it applies commits together, as one replicated change.
    ///
    /// Blocks the calling thread until the commit (the daemon calls it from its I/O thread pool, never from an event
    /// loop).
    public func write<T>(_ body: (WriteTransaction) throws -> T) throws -> T {
        try pool.write { db in try self.transaction(db, body) }
    }

    private func transaction<T>(_ db: Database, _ body: (WriteTransaction) throws -> T) throws -> T {
        let storage = makeStorage(db)
        storage.enforceLimits = true
        let vv = try storage.versionVector()
        let hlc = clock.withLock { $0.tick(now: Self.nowMilliseconds()) }
        let draft = Change(origin: node, seq: vv[node] + 1, hlc: hlc, deps: vv, ops: [])
        let tx = WriteTransaction(storage: storage, limits: limits, draft: draft)
        let result = try body(tx)
        if let (change, text) = tx.finish() { try storage.recordApplied(change, text: text, last: true) }
        try storage.flush()
        try noteChanges(tx.changes, db)
        try finishFeed(storage, db)
        return result
    }

    func makeStorage(_ db: Database) -> SQLStorage {
        SQLStorage(
            db: db, limits: limits, knownCollections: knownCollections, feedSequence: feed.lastSequence, coding: coding)
    }

    /// Prunes the durable feed to its retention and publishes this transaction's entries once it commits.
    private func finishFeed(_ storage: SQLStorage, _ db: Database) throws {
        let entries = storage.entries
        guard !entries.isEmpty else { return }
        var floor = feed.floor
        let keep = Int64(limits.feedRetention)
        // Prune in steps, not on every commit: one range delete per `pruneStep` changes.
        if storage.feedSequence - floor > keep + Self.pruneStep {
            floor = storage.feedSequence - keep
            try db.cachedStatement(sql: "DELETE FROM feed WHERE seq <= ?").execute(arguments: [floor])
            try db.cachedStatement(
                sql: "INSERT INTO meta(key, value) VALUES ('feed_floor', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value"
            ).execute(arguments: [String(floor)])
        }
        let feed = self.feed
        let newFloor = floor
        db.afterNextTransaction(onCommit: { _ in feed.publish(entries, floor: newFloor) })
    }

    /// Feed rows beyond the retention that may accumulate before a prune.
    static let pruneStep: Int64 = 256

    /// Applies changes from other replicas in any order, with duplicates; returns what happened to them.
    ///
    /// Changes whose dependencies are missing are parked until those arrive. A malformed change rejects the batch.
    public func receive(_ changes: [Change]) throws -> ReceiveReport {
        for change in changes { try validate(change) }
        return try pool.write { db in try self.receive(changes, in: db) }
    }

    /// `receive` inside the caller's write transaction (the changes are validated).
    func receive(_ changes: [Change], in db: Database) throws -> ReceiveReport {
        let storage = makeStorage(db)
        var clock = self.clock.withLock { $0 }
        let now = Self.nowMilliseconds()
        let report = try Replica.receive(changes, into: storage, clock: &clock, now: now)
        try storage.flush()
        self.clock.withLock { _ = $0.observe(clock.last, now: now) }
        try noteChanges(report.applied, db)
        try finishFeed(storage, db)
        return report
    }

    /// Checks what a remote change may contain before any of it is applied: the bounds of a real history
    /// (`ChangeBounds`), names (they end up in SQL and file paths) and, when its text is larger than a document may
    /// be (`size` bytes, if known), each operation's size.
    func validate(_ change: Change, size: Int? = nil) throws {
        try Self.validate(change, size: size, limits: limits)
    }

    /// `validate(_:size:)` under `limits`.
    static func validate(_ change: Change, size: Int?, limits: StoreLimits) throws {
        do throws(StoreError) {
            do {
                try ChangeBounds.check(change)
            } catch {
                throw StoreError.invalid("invalid_change", error.description)
            }
            let checkSizes = size.map { $0 > limits.maxDocumentBytes } ?? true
            for op in change.ops {
                if checkSizes {
                    var text: [UInt8] = []
                    Change.writeOp(op, to: &text)
                    guard text.count <= limits.maxDocumentBytes + 4096 else {
                        throw StoreError.invalid(
                            "invalid_change", "an operation of \(text.count) bytes is larger than a document may be")
                    }
                }
                switch op {
                case .doc(let d):
                    // Field edits apply to a live incarnation (odd causal length), deletes make an even one.
                    guard d.cl > 0, d.cl % 2 == 1 else {
                        throw StoreError.invalid("invalid_change", "a doc op needs an odd causal length, got \(d.cl)")
                    }
                    try Names.validateCollection(d.key.collection)
                    try Names.validateID(d.key.id)
                    let names = Array(d.set.keys) + d.unset + Array(d.incr.keys) + Array(d.add.keys) + Array(d.remove.keys)
                    for f in names { try Names.validateFieldName(f) }
                case .delete(let key, let cl):
                    guard cl > 0, cl % 2 == 0 else {
                        throw StoreError.invalid("invalid_change", "a delete needs an even causal length, got \(cl)")
                    }
                    try Names.validateCollection(key.collection)
                    try Names.validateID(key.id)
                case .index(let name, let collection, _):
                    try Names.validateIndex(name)
                    try Names.validateCollection(collection)
                }
            }
        } catch {
            throw StoreError(
                .invalidArgument, kind: "invalid_change",
                "change \(change.seq) from \(change.origin) is invalid: \(error.message)")
        }
    }

    /// This replica's version vector: the highest sequence applied per origin.
    public func versionVector() throws -> VersionVector {
        try read { db in try self.makeStorage(db).versionVector() }
    }

    /// Every change this replica has that a replica at `other` lacks, per origin in sequence order.
    public func changes(since other: VersionVector) throws -> [Change] {
        try read { db in
            var out: [Change] = []
            let origins = try String.fetchAll(db, sql: "SELECT origin FROM versions ORDER BY origin")
            for originHex in origins {
                guard let origin = NodeID(hex: originHex) else { continue }
                let bodies = try String.fetchAll(
                    db, sql: "SELECT body FROM changes WHERE origin = ? AND seq > ? ORDER BY seq",
                    arguments: [originHex, Int64(other[origin])])
                for b in bodies { out.append(try Change(json: try JSONParser(maxDepth: 10_000).parse(b))) }
            }
            return out
        }
    }

    /// SHA-256 (hex) over every live document in (collection, id) order: equal on two replicas exactly when they
    /// hold the same documents. Reads the whole database.
    public func stateHash() throws -> String {
        try read { db in try Self.stateHash(db) }
    }

    /// `stateHash()` as seen by the transaction of `db`.
    static func stateHash(_ db: Database) throws -> String {
        var hasher = SHA256()
        let rows = try Row.fetchCursor(db, sql: "SELECT collection, id, body FROM docs ORDER BY collection, id")
        while let row = try rows.next() {
            for (i, column) in [0, 1, 2].enumerated() {
                let text: String = row[column]
                hasher.update(data: Data(text.utf8))
                hasher.update(data: [i == 2 ? 0x0A : 0x00])
            }
        }
        return hasher.finalize().map { String(format: "%02x", $0) }.joined()
    }

    /// Fields whose concurrent writes lost, with the current value and the losing writes.
    public func conflicts(collection: String? = nil, id: String? = nil, limit: Int = 1000) throws -> [ConflictInfo] {
        if let collection { try Names.validateCollection(collection) }
        return try read { db in
            let rows = try Row.fetchAll(
                db,
                sql: "SELECT collection, id, state, body FROM docs WHERE conflicted = 1 "
                    + "AND (?1 IS NULL OR collection = ?1) AND (?2 IS NULL OR id = ?2) ORDER BY collection, id LIMIT ?3",
                arguments: [collection, id, limit])
            var out: [ConflictInfo] = []
            for row in rows {
                let state = try SQLStorage.decode(state: row[2], body: row[3], coding)
                for name in state.fields.keys.sorted(by: utf8Less) {
                    let f = state.fields[name]!
                    guard !f.losers.isEmpty else { continue }
                    out.append(ConflictInfo(collection: row[0], id: row[1], field: name, value: f.value, winner: f.winner, losers: f.losers))
                }
            }
            return out
        }
    }

    /// Applies one operation in its own transaction.
    public func apply(_ op: WriteOp) throws -> WriteResult {
        try write { try $0.apply(op) }
    }

    /// Applies several operations atomically; on failure the error's details carry the failing op's index.
    public func commit(_ ops: [WriteOp]) throws -> [WriteResult] {
        guard ops.count <= limits.maxTransactionOps else {
            throw StoreError(
                .limitExceeded, kind: "transaction_too_large",
                "transaction has \(ops.count) operations; the limit is \(limits.maxTransactionOps)")
        }
        return try write { tx in
            tx.storage.reserve(documents: ops.count)
            var results: [WriteResult] = []
            results.reserveCapacity(ops.count)
            for (i, op) in ops.enumerated() {
                do {
                    results.append(try tx.apply(op))
                } catch var error as StoreError {
                    error.details["op"] = .int(Int64(i))
                    error.message = "op \(i): " + error.message
                    throw error
                }
            }
            return results
        }
    }

    /// Runs `body` on a read-only snapshot (WAL readers never wait for the writer).
    public func read<T>(_ body: (Database) throws -> T) throws -> T {
        try pool.read(body)
    }

    static func requireCollection(_ db: Database, _ name: String) throws {
        try Names.validateCollection(name)
        let stmt = try db.cachedStatement(sql: "SELECT 1 FROM collections WHERE name = ?")
        guard try Int.fetchOne(stmt, arguments: [name]) != nil else {
            throw StoreError(.notFound, kind: "collection_not_found", "collection \(Names.quoted(name)) does not exist")
        }
    }

    static func decodeBody(_ text: String) throws -> [String: JSONValue] {
        guard case .object(let o) = try JSONParser(maxDepth: 10_000).parse(text) else {
            throw StoreError(.internalFailure, kind: "corrupt_document", "stored document is not an object")
        }
        return o
    }

    /// Fetches one document; throws not-found for an unknown collection or id.
    public func get(collection: String, id: String, fields: [FieldPath]? = nil) throws -> JSONValue {
        try Names.validateID(id)
        return try read { db in
            try Self.requireCollection(db, collection)
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

    /// Fetches many documents by id, in the order given; missing ones are `null`.
    public func getMany(collection: String, ids: [String], fields: [FieldPath]? = nil) throws -> [JSONValue] {
        guard ids.count <= limits.maxGetMany else {
            throw StoreError(
                .limitExceeded, kind: "too_many_ids", "at most \(limits.maxGetMany) ids per call, got \(ids.count)")
        }
        for id in ids { try Names.validateID(id) }
        return try read { db in
            try Self.requireCollection(db, collection)
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

    /// Runs a find query and returns one page.
    public func find(_ query: FindQuery) throws -> FindResult {
        try validate(query)
        let compiled = QueryCompiler.find(query, limit: query.limit + 1)
        return try read { db in
            try Self.requireCollection(db, query.collection)
            let rows = try Row.fetchAll(db, sql: compiled.sql, arguments: compiled.arguments)
            var docs: [JSONValue] = []
            docs.reserveCapacity(min(rows.count, query.limit))
            for row in rows.prefix(query.limit) {
                let doc = try Self.decodeBody(row[1])
                docs.append(.object(query.fields.map { Projection.apply($0, to: doc) } ?? doc))
            }
            var next: String?
            if rows.count > query.limit {
                let last = rows[query.limit - 1]
                var keys: [JSONValue] = []
                for i in 0..<(2 * query.sort.count) {
                    keys.append(Self.jsonValue(last[2 + i] as DatabaseValue))
                }
                next = QueryCursor(keys: keys, id: last[0], shape: query.shape).token
            }
            return FindResult(docs: docs, cursor: next)
        }
    }

    static func jsonValue(_ v: DatabaseValue) -> JSONValue {
        switch v.storage {
        case .null: return .null
        case .int64(let i): return .int(i)
        case .double(let d): return .double(d)
        case .string(let s): return .string(s)
        case .blob(let b): return .string(String(decoding: b, as: UTF8.self))
        }
    }

    /// Counts matching documents.
    public func count(collection: String, filter: Filter) throws -> Int {
        try Names.validateCollection(collection)
        let compiled = QueryCompiler.count(collection: collection, filter: filter)
        return try read { db in
            try Self.requireCollection(db, collection)
            return try Int.fetchOne(db, sql: compiled.sql, arguments: compiled.arguments) ?? 0
        }
    }

    /// Returns SQLite's plan for a find query and the user indexes it uses.
    public func explain(_ query: FindQuery) throws -> ExplainResult {
        try validate(query)
        let compiled = QueryCompiler.find(query, limit: query.limit + 1)
        return try read { db in
            try Self.requireCollection(db, query.collection)
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

    /// Lists collections with their document counts.
    public func collections() throws -> [CollectionInfo] {
        try read { db in
            try Row.fetchAll(
                db,
                sql: "SELECT c.name, (SELECT count(*) FROM docs d WHERE d.collection = c.name) FROM collections c ORDER BY c.name"
            ).map { CollectionInfo(name: $0[0], count: $0[1]) }
        }
    }

    /// Lists user indexes, optionally of one collection.
    public func indexes(collection: String? = nil) throws -> [IndexInfo] {
        if let collection { try Names.validateCollection(collection) }
        return try read { db in
            if let collection { try Self.requireCollection(db, collection) }
            let rows = try Row.fetchAll(
                db, sql: "SELECT name, collection, fields FROM indexes WHERE ?1 IS NULL OR collection = ?1 ORDER BY name",
                arguments: [collection])
            return try rows.map { row in
                let fields = try JSONParser().parse(row[2] as String).arrayValue?.compactMap(\.stringValue) ?? []
                return IndexInfo(name: row[0], collection: row[1], fields: fields)
            }
        }
    }

    /// Summary facts for `db.info`.
    public func summary() throws -> DatabaseSummary {
        let (collections, documents) = try read { db in
            (
                try Int.fetchOne(db, sql: "SELECT count(*) FROM collections") ?? 0,
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

    /// Closes the connection pool; further use fails.
    public func close() throws {
        feed.end(StoreError(.unavailable, kind: "shutting_down", "the daemon is shutting down"))
        try pool.close()
        try checkpointer.close()
    }
}

/// A field whose concurrent writes lost: what clients see now, the winning write, and the losers.
public struct ConflictInfo: Sendable {
    /// Collection of the document.
    public var collection: String
    /// Document id.
    public var id: String
    /// Top-level field name.
    public var field: String
    /// The field's current value (nil: absent).
    public var value: JSONValue?
    /// The winning LWW write.
    public var winner: FieldWrite?
    /// Concurrent writes that lost, oldest first.
    public var losers: [FieldWrite]
}

/// Collection names known to exist in the committed database, so writes skip re-registering them.
///
/// Collections are never removed individually (only whole databases are dropped), so the set only grows.
final class KnownCollections: Sendable {
    private let names = Mutex<Set<String>>([])

    func contains(_ name: String) -> Bool { names.withLock { $0.contains(name) } }
    func insert(_ name: String) { _ = names.withLock { $0.insert(name) } }
}
