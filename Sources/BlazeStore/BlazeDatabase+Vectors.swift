import BlazeCRDT
import BlazeProtocol
import BlazeVector
import Foundation
import GRDB
import Synchronization

/// A `query.nearest` request, its names validated by the caller's types (`FieldPath`, `Filter`).
public struct NearestQuery: Sendable {
    /// Collection searched.
    public var collection: String
    /// The field holding the vectors.
    public var field: FieldPath
    /// The query vector.
    public var vector: [Float]
    /// How many documents to return (1 to the query limit).
    public var k: Int
    /// Only documents matching it are candidates.
    public var filter: Filter
    /// Projection of the returned documents; nil returns them whole.
    public var fields: [FieldPath]?
    /// The metric; nil: the index's, or cosine without an index.
    public var metric: VectorMetric?
    /// Compute every candidate's distance even where the index has a graph.
    public var exact = false
    /// The graph search's candidate list (at least `k`; default 64): larger finds more of the true nearest, slower.
    public var ef: Int?

    /// A query.
    public init(
        collection: String, field: FieldPath, vector: [Float], k: Int, filter: Filter = .all, fields: [FieldPath]? = nil,
        metric: VectorMetric? = nil
    ) {
        (self.collection, self.field, self.vector, self.k, self.filter, self.fields, self.metric) =
            (collection, field, vector, k, filter, fields, metric)
    }
}

/// What `nearest` found: the documents nearest first, with how they were found.
public struct NearestResult: Sendable {
    /// The documents (projected if asked) and their distances, nearest first.
    public var hits: [(doc: JSONValue, distance: Float)]
    /// The metric the distances are in.
    public var metric: VectorMetric
    /// The vector index searched; nil when the documents were scanned.
    public var index: String?
    /// Whether the index's graph answered (approximate) rather than every candidate's distance (exact).
    public var approximate = false
}

/// Nearest-neighbour search over a field of vectors (issue #52): exact, over the field's vector index held in memory
/// (`VectorIndexes`), or over the documents themselves when the field has none.
extension BlazeDatabase {
    /// The `k` documents of the collection whose vectors at `field` are nearest to `vector` among those matching the
    /// filter (pre-filtered: the filter's documents are found first, so a selective filter still gets `k`).
    public func nearest(_ query: NearestQuery) throws -> NearestResult {
        try Names.validateCollection(query.collection)
        guard query.k >= 1, query.k <= limits.maxQueryLimit else {
            throw StoreError(.limitExceeded, kind: "limit_out_of_range", "k must be between 1 and \(limits.maxQueryLimit), got \(query.k)")
        }
        let definition = try read { db in try Self.vectorIndex(on: query.field, of: query.collection, db) }
        if let definition {
            guard query.vector.count == definition.dimensions else {
                throw StoreError.invalid(
                    "invalid_vector",
                    "the query vector has \(query.vector.count) components; index \(Names.quoted(definition.name)) holds "
                        + "vectors of \(definition.dimensions)")
            }
        }
        let indexMetric = definition.flatMap { VectorMetric(rawValue: $0.metric) } ?? .cosine
        let metric = query.metric ?? indexMetric
        if let ef = query.ef, ef < 1 || ef > limits.maxQueryLimit {
            throw StoreError(.limitExceeded, kind: "limit_out_of_range", "ef must be between 1 and \(limits.maxQueryLimit), got \(ef)")
        }
        let fromMemory: NearestResult? = try vectorIndexes.serialized {
            try read { db -> NearestResult? in
                // Indexes dropped since they were searched are let go (their memory counts against the limit).
                vectorIndexes.keepOnly(Set(try String.fetchAll(db, sql: "SELECT name FROM indexes WHERE vector IS NOT NULL")))
                let room = limits.maxVectorMemoryBytes - min(limits.maxVectorMemoryBytes, vectorIndexes.heldBytes())
                guard let definition, try fitsInMemory(definition.name, dimensions: definition.dimensions, db),
                    let (matrix, graph) = try vectorIndexes.caughtUp(
                        definition.name, dimensions: definition.dimensions, metric: indexMetric, fileLimit: room, db)
                else { return nil }
                let admitted = try Self.admitted(query, db)
                var hits: [VectorHit]
                var approximate = false
                // The graph answers when there is one, the caller did not ask for exact, the metric is the one it
                // was built for, and a filter admits at least a fifth of the rows (fewer: their own distances are
                // cheaper than a graph search that must pass over the others).
                let share = admitted.map { Double($0.count) / Double(max(1, matrix.count)) } ?? 1
                if let graph, !query.exact, metric == indexMetric, share >= 0.2 {
                    let ef = min(limits.maxQueryLimit, Int(Double(max(query.ef ?? 64, query.k)) / share))
                    let set = admitted.map(Set.init)
                    hits = graph.nearest(to: query.vector, k: query.k, ef: ef, in: matrix, admits: set.map { s in { s.contains($0) } })
                    approximate = true
                } else {
                    hits = admitted.map { matrix.nearest(to: query.vector, k: query.k, metric: metric, among: $0) }
                        ?? matrix.nearest(to: query.vector, k: query.k, metric: metric)
                }
                // Grown past the memory limit since it was loaded: searched from its rows from the next search on.
                if vectorIndexes.heldBytes() > limits.maxVectorMemoryBytes { vectorIndexes.forget(definition.name) }
                return try Self.result(hits, query, metric: metric, index: definition.name, approximate: approximate, db)
            }
        }
        if let fromMemory { return fromMemory }
        // Read from disk outside the held indexes' lock: other searches of the database go on meanwhile.
        return try read { db in
            if let definition, try VectorIndexSQL.build(of: definition.name, in: db) != nil {
                let hits = try Self.streamRows(definition.name, query, metric: metric, admitted: try Self.admitted(query, db), db)
                return try Self.result(hits, query, metric: metric, index: definition.name, approximate: false, db)
            }
            // No index built on the field (none, or one kept past the limits): the documents are read.
            return try Self.result(try Self.scan(query, metric: metric, db), query, metric: metric, index: nil, approximate: false, db)
        }
    }

    /// The documents of `hits` (projected as the query asks; those deleted meanwhile left out), nearest first.
    private static func result(
        _ hits: [VectorHit], _ query: NearestQuery, metric: VectorMetric, index: String?, approximate: Bool, _ db: Database
    ) throws -> NearestResult {
        let fetch = try db.cachedStatement(sql: "SELECT body FROM docs WHERE rowid = ?")
        var out: [(doc: JSONValue, distance: Float)] = []
        for hit in hits {
            guard let text = try String.fetchOne(fetch, arguments: [hit.id]) else { continue }
            let doc = try decodeBody(text)
            out.append((.object(query.fields.map { Projection.apply($0, to: doc) } ?? doc), hit.distance))
        }
        return NearestResult(hits: out, metric: metric, index: index, approximate: approximate)
    }

    /// The row ids of the documents matching the query's filter; nil when it has none (every document is admitted).
    private static func admitted(_ query: NearestQuery, _ db: Database) throws -> [Int64]? {
        guard query.filter != .all else { return nil }
        var args: [DatabaseValue] = []
        let sql = "SELECT rowid FROM docs WHERE collection = '\(query.collection)' AND \(QueryCompiler.compile(query.filter, &args))"
        return try Int64.fetchAll(db, sql: sql, arguments: StatementArguments(args))
    }

    /// The nearest documents found by reading every document's vector at the field (no index), one at a time.
    private static func scan(_ query: NearestQuery, metric: VectorMetric, _ db: Database) throws -> [VectorHit] {
        var args: [DatabaseValue] = []
        var sql = "SELECT rowid, json_extract(body, \(VectorIndexSQL.vectorPath(query.field))) AS v FROM docs "
            + "WHERE collection = '\(query.collection)' AND v IS NOT NULL"
        if query.filter != .all { sql += " AND \(QueryCompiler.compile(query.filter, &args))" }
        var search = StreamingNearest(query: query.vector, k: query.k, metric: metric)
        let rows = try Row.fetchCursor(db, sql: sql, arguments: StatementArguments(args))
        while let row = try rows.next() {
            guard let text = row[1] as String?, let floats = VectorValue.decode(text) else { continue }
            floats.withUnsafeBufferPointer { search.offer(row[0], $0) }
        }
        return search.hits
    }

    /// The nearest documents found by reading index `name`'s stored rows one at a time (an index too large for the
    /// memory limit), among `admitted` when given.
    private static func streamRows(
        _ name: String, _ query: NearestQuery, metric: VectorMetric, admitted: [Int64]?, _ db: Database
    ) throws -> [VectorHit] {
        var search = StreamingNearest(query: query.vector, k: query.k, metric: metric)
        let admits = admitted.map(Set.init)
        var row = [Float](repeating: 0, count: query.vector.count)
        let rows = try Row.fetchCursor(
            db.cachedStatement(sql: "SELECT doc, v FROM vector_rows WHERE idx = ? AND doc >= 0 AND v IS NOT NULL"), arguments: [name])
        while let r = try rows.next() {
            let doc: Int64 = r[0]
            if let admits, !admits.contains(doc) { continue }
            guard let bytes = r[1] as Data?, bytes.count == row.count * 4 else { continue }
            row.withUnsafeMutableBytes { _ = bytes.copyBytes(to: $0) }
            row.withUnsafeBufferPointer { search.offer(doc, $0) }
        }
        return search.hits
    }

    /// Whether index `name` is, or may be, held in memory: held already, or its rows at their size in memory (and
    /// the graph's links once it has `VectorIndexes.approximateFrom` rows), with a tenth more for growth, fit beside
    /// the other held indexes within `max-vector-memory`. The tenth keeps an index let go for growing past the limit
    /// from being loaded again at the next search.
    private func fitsInMemory(_ name: String, dimensions: Int, _ db: Database) throws -> Bool {
        if vectorIndexes.isHeld(name) { return true }
        let rows = try Int.fetchOne(
            db.cachedStatement(sql: "SELECT count(*) FROM vector_rows WHERE idx = ? AND doc >= 0 AND v IS NOT NULL"), arguments: [name]) ?? 0
        let links = rows >= VectorIndexes.approximateFrom ? 2 * HNSWGraph.Parameters().m * 4 + 8 : 0
        let (perRow, o1) = dimensions.multipliedReportingOverflow(by: 4)
        let (bytes, o2) = rows.multipliedReportingOverflow(by: perRow + 12 + links)
        let room = limits.maxVectorMemoryBytes - min(limits.maxVectorMemoryBytes, vectorIndexes.heldBytes())
        return !o1 && !o2 && bytes <= room / 11 * 10
    }

    /// The vector index of `field` in `collection`, if one is defined (and built).
    /// A definition kept past the limits (not built) counts too, for its dimensions and metric: a device that did
    /// not build it answers as one that did, by reading the documents.
    static func vectorIndex(on field: FieldPath, of collection: String, _ db: Database) throws -> (
        name: String, dimensions: Int, metric: String
    )? {
        let fields = JSONValue.array([.string(field.description)]).jsonText
        if let row = try Row.fetchOne(
            db, sql: "SELECT name, vector FROM indexes WHERE collection = ? AND fields = ? AND vector IS NOT NULL ORDER BY name LIMIT 1",
            arguments: [collection, fields])
        {
            let spec = IndexVector(json: try JSONParser(maxDepth: 4).parse(row[1] as String))
            return spec.dimensions > 0 ? (row[0], spec.dimensions, spec.metric) : nil
        }
        let kept = try Row.fetchAll(
            db,
            sql: """
                SELECT name, json_extract(state, '$.v.d'), json_extract(state, '$.v.m') FROM index_states
                WHERE json_extract(state, '$.c') = ? AND json_type(state, '$.v.d') = 'integer' AND json_type(state, '$.v.m') = 'text'
                AND json_array_length(state, '$.f') = 1
                AND json_extract(state, '$.f[0]') = ? AND name NOT IN (SELECT name FROM indexes) ORDER BY name
                """, arguments: [collection, field.description])
        for row in kept {
            guard let name = row[0] as String?, (try? Names.validateIndex(name)) != nil, let dimensions = row[1] as Int?,
                dimensions >= 1, dimensions <= VectorValue.maxDimensions, let metric = row[2] as String?, VectorMetric(rawValue: metric) != nil
            else { continue }
            return (name, dimensions, metric)
        }
        return nil
    }
}

/// Vector index files (`VectorIndexFile`): written when the database closes, so the next daemon starts with the graphs.
extension BlazeDatabase {
    /// Writes each held vector index whose graph changed since it was read or written, and removes the files of indexes
    /// that are no longer defined (and temporary files a stop cut short). A failure leaves that index to be built again
    /// from its rows: never an error. Returns the indexes whose file could not be written, with why.
    @discardableResult
    func saveVectorIndexes() -> [(index: String, error: any Error)] {
        var failed: [(index: String, error: any Error)] = []
        try? vectorIndexes.serialized {
            for (name, build, seen, image) in vectorIndexes.unsavedImages() {
                do {
                    // New marker bytes first, committed before the file is in place: a copy of the database older than
                    // this save never takes the file.
                    guard let nonce = try connections.write({ db in try VectorIndexSQL.renewNonce(of: name, build: build, in: db) })
                    else { continue }
                    try VectorIndexFile.save(image, index: name, stamp: .init(build: build, nonce: nonce, seen: seen),
                        to: VectorIndexFile.path(database: path, index: name))
                } catch {
                    failed.append((name, error))
                }
            }
        }
        do {
            let defined = Set(try read { db in try String.fetchAll(db, sql: "SELECT name FROM indexes WHERE vector IS NOT NULL") })
            let keep = Set(defined.map { VectorIndexFile.path(database: path, index: $0) })
            let directory = (path as NSString).deletingLastPathComponent
            let file = (path as NSString).lastPathComponent
            for name in try FileManager.default.contentsOfDirectory(atPath: directory) where VectorIndexFile.belongs(name, to: file) {
                if !keep.contains(directory + "/" + name) { unlink(directory + "/" + name) }
            }
        } catch {
            // The files are a cache: a stale one is never used (it names another build or marker), only kept.
        }
        return failed
    }
}
