import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import BlazeVector
import Foundation
import Testing

/// Vectors through the socket: index.create with a vector, documents holding `{"$vector": …}`, `query.nearest` against
/// a brute-force reference, the `vectors` form of reads, bad inputs; and two daemons syncing 10,000 768-d vectors.
@Suite struct VectorDaemonTests {
    static func vectors(_ n: Int, _ d: Int, seed: UInt64) -> [[Float]] {
        var rng = SeededRandom(seed: seed)
        return (0..<n).map { _ in (0..<d).map { _ in Float.random(in: -1...1, using: &rng) } }
    }

    /// Ids of the `k` nearest of `rows` (in insertion order for ties) to `q` under `metric`.
    static func reference(_ rows: [(id: String, v: [Float])], _ q: [Float], k: Int, _ metric: VectorMetric) -> [String] {
        let scored: [(i: Int, id: String, d: Float)] = rows.enumerated().map { ($0.offset, $0.element.id, VectorMatrix.distance($0.element.v, q, metric)) }
        return scored.sorted { x, y in x.d != y.d ? x.d < y.d : x.i < y.i }.prefix(k).map(\.id)
    }

    static func ids(_ r: JSONValue) -> [String] {
        (r["results"]?.arrayValue ?? []).compactMap { $0["doc"]?["_id"]?.stringValue }
    }

    /// Writes `rows` to `collection` of `db` on `c`, 500 per transaction, each as `{"v": {"$vector": base64}, "n": i}`.
    static func write(_ rows: [(id: String, v: [Float])], to c: BlazeConnection, db: String, collection: String) throws {
        for start in stride(from: 0, to: rows.count, by: 500) {
            let ops: [JSONValue] = rows[start..<min(rows.count, start + 500)].enumerated().map { i, row in
                [
                    "op": "put", "collection": .string(collection), "id": .string(row.id),
                    "doc": ["v": ["$vector": .string(VectorValue.encode(row.v))], "n": .int(Int64(start + i))],
                ]
            }
            _ = try c.call("tx.commit", ["db": .string(db), "ops": .array(ops)])
        }
    }

    @Test func nearestAnswersAsBruteForceAndBadInputsAreRefused() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        let created = try c.call("index.create", ["db": "default", "collection": "p", "fields": ["v"], "vector": ["dimensions": 16, "metric": "cosine"]])
        #expect(created == ["name": "p.v", "collection": "p", "fields": ["v"], "vector": ["dimensions": 16, "metric": "cosine"]])
        #expect(try c.call("index.list", ["db": "default"])["indexes"]?.arrayValue?.first == created)
        let rows = Self.vectors(500, 16, seed: 11).enumerated().map { (id: "d\($0.offset)", v: $0.element) }
        try Self.write(rows, to: c, db: "default", collection: "p")
        let q = Self.vectors(1, 16, seed: 12)[0]
        let qJSON = JSONValue.array(q.map { .double(Double($0)) })
        let r = try c.call("query.nearest", ["db": "default", "collection": "p", "field": "v", "vector": qJSON, "k": 10])
        #expect(Self.ids(r) == Self.reference(rows, q, k: 10, .cosine))
        #expect(r["metric"] == "cosine" && r["index"] == "p.v")
        // The same query as base64, with another metric, a filter and a projection.
        let l2 = try c.call(
            "query.nearest",
            ["db": "default", "collection": "p", "field": "v", "vector": .string(VectorValue.encode(q)), "k": 5, "metric": "l2",
             "where": ["n": ["$gte": 250]], "fields": ["n"]])
        #expect(Self.ids(l2) == Self.reference(Array(rows[250...]), q, k: 5, .l2))
        #expect(l2["results"]?.arrayValue?.first?["doc"]?.objectValue?.keys.sorted() == ["_id", "n"])
        let first = try #require(l2["results"]?.arrayValue?.first)
        let v = rows.first { $0.id == first["doc"]?["_id"]?.stringValue }!.v
        #expect(abs((first["distance"].flatMap { if case .double(let x) = $0 { x } else { nil } } ?? -1) - Double(VectorMatrix.distance(v, q, .l2))) < 1e-4)

        // Read back as stored (base64) or as numbers.
        let stored = try c.call("doc.get", ["db": "default", "collection": "p", "id": "d3"])["doc"]?["v"]
        #expect(stored == ["$vector": .string(VectorValue.encode(rows[3].v))])
        let numbers = try c.call("doc.get", ["db": "default", "collection": "p", "id": "d3", "vectors": "array"])["doc"]?["v"]?["$vector"]
        #expect(numbers?.arrayValue?.compactMap { x -> Float? in
            switch x { case .double(let d): Float(d); case .int(let i): Float(i); default: nil }
        } == rows[3].v)
        let found = try c.call("query.find", ["db": "default", "collection": "p", "where": ["n": 3], "vectors": "array"])
        #expect(found["docs"]?.arrayValue?.first?["v"]?["$vector"] == numbers)
        let many = try c.call("doc.getMany", ["db": "default", "collection": "p", "ids": ["d3", "none"], "vectors": "array"])
        #expect(many["docs"]?.arrayValue?.first?["v"]?["$vector"] == numbers && many["docs"]?.arrayValue?.last == .null)
        #expect(try c.call("doc.getMany", ["db": "default", "collection": "p", "ids": ["d3"]])["docs"]?.arrayValue?.first?["v"] == stored)
        expectRPCError(c, "doc.getMany", ["db": "default", "collection": "p", "ids": ["d3"], "vectors": "hex"], code: -32602)
        let nearNumbers = try c.call("query.nearest", ["db": "default", "collection": "p", "field": "v", "vector": qJSON, "k": 1, "vectors": "array"])
        #expect(nearNumbers["results"]?.arrayValue?.first?["doc"]?["v"]?["$vector"]?.arrayValue?.count == 16)
        // A document's value, as `doc.get` returns it in either form, searches the same.
        let forms: [JSONValue] = [stored ?? .null, ["$vector": numbers ?? .null]]
        for given in forms {
            let same = try c.call("query.nearest", ["db": "default", "collection": "p", "field": "v", "vector": given, "k": 3])
            #expect(Self.ids(same) == Self.reference(rows, rows[3].v, k: 3, .cosine) && Self.ids(same).first == "d3")
        }

        // Bad inputs.
        let base: [String: JSONValue] = ["db": "default", "collection": "p", "field": "v", "vector": qJSON, "k": 3]
        func with(_ changes: [String: JSONValue?]) -> [String: JSONValue] {
            var p = base
            for (k, v) in changes { p[k] = v }
            return p
        }
        expectRPCError(c, "query.nearest", with(["vector": .array(Array(q.prefix(15).map { .double(Double($0)) }))]), code: -32602, kind: "invalid_vector")
        expectRPCError(c, "query.nearest", with(["vector": .array([1, "x"])]), code: -32602, kind: "invalid_vector")
        expectRPCError(c, "query.nearest", with(["vector": "not base64!"]), code: -32602, kind: "invalid_vector")
        expectRPCError(c, "query.nearest", with(["vector": 5]), code: -32602)
        expectRPCError(c, "query.nearest", with(["vector": ["$vector": qJSON, "other": 1]]), code: -32602, kind: "invalid_vector")
        expectRPCError(c, "query.nearest", with(["vector": ["vector": qJSON]]), code: -32602, kind: "invalid_vector")
        expectRPCError(c, "query.nearest", with(["vector": ["$vector": ["$vector": qJSON]]]), code: -32602, kind: "invalid_vector")
        expectRPCError(c, "query.nearest", with(["vector": .array(Array(repeating: 1, count: 4097))]), code: -32602)
        expectRPCError(c, "query.nearest", with(["k": 0]), code: -32012, kind: "limit_out_of_range")
        expectRPCError(c, "query.nearest", with(["k": 10_001]), code: -32012, kind: "limit_out_of_range")
        expectRPCError(c, "query.nearest", with(["k": "ten"]), code: -32602)
        expectRPCError(c, "query.nearest", with(["k": nil]), code: -32602, kind: "invalid_params")
        expectRPCError(c, "query.nearest", with(["metric": "hamming"]), code: -32602)
        expectRPCError(c, "query.nearest", with(["vectors": "hex"]), code: -32602)
        expectRPCError(c, "query.nearest", with(["field": "a..b"]), code: -32602)
        expectRPCError(c, "query.nearest", with(["db": "nope"]), code: -32010, kind: "database_not_found")
        expectRPCError(c, "query.nearest", with(["collection": "bad name"]), code: -32602)
        expectRPCError(c, "query.nearest", with(["where": ["n": ["$near": 1]]]), code: -32602)
        expectRPCError(c, "doc.get", ["db": "default", "collection": "p", "id": "d3", "vectors": "hex"], code: -32602)
        expectRPCError(c, "doc.put", ["db": "default", "collection": "p", "id": "x", "doc": ["v": ["$vector": .array([.double(1), "a"])]]], code: -32602, kind: "invalid_vector")
        expectRPCError(c, "doc.patch", ["db": "default", "collection": "p", "id": "d1", "set": ["v": ["$vector": []]]], code: -32602, kind: "invalid_vector")
        expectRPCError(c, "index.create", ["db": "default", "collection": "p", "fields": ["w"], "vector": ["dimensions": 0, "metric": "l2"]], code: -32602)
        expectRPCError(c, "index.create", ["db": "default", "collection": "p", "fields": ["w"], "vector": ["dimensions": 4, "metric": "dot"]], code: -32602)
        expectRPCError(c, "index.create", ["db": "default", "collection": "p", "fields": ["w", "x"], "vector": ["dimensions": 4, "metric": "l2"]], code: -32602, kind: "invalid_index")
        expectRPCError(c, "index.create", ["db": "default", "collection": "p", "fields": ["w"], "vector": ["dimensions": 4]], code: -32602)
        // A collection that does not exist has no nearest documents; a field without an index is scanned.
        #expect(Self.ids(try c.call("query.nearest", with(["collection": "none"]))) == [])
        _ = try c.call("index.drop", ["db": "default", "name": "p.v"])
        let scanned = try c.call("query.nearest", base)
        #expect(scanned["index"] == .null && Self.ids(scanned) == Self.reference(rows, q, k: 3, .cosine))
        // At most 8 vector indexes and 64 indexes in all per database.
        for i in 0..<8 {
            _ = try c.call("index.create", ["db": "default", "collection": "p", "fields": .array([.string("v\(i)")]), "vector": ["dimensions": 4, "metric": "l2"]])
        }
        expectRPCError(c, "index.create", ["db": "default", "collection": "p", "fields": ["v8"], "vector": ["dimensions": 4, "metric": "l2"]], code: -32012, kind: "too_many_indexes")
        for i in 0..<56 { _ = try c.call("index.create", ["db": "default", "collection": "p", "fields": .array([.string("f\(i)")])]) }
        expectRPCError(c, "index.create", ["db": "default", "collection": "p", "fields": ["f56"]], code: -32012, kind: "too_many_indexes")
        #expect(try c.call("index.list", ["db": "default"])["indexes"]?.arrayValue?.count == 64)
    }

    @Test func withNoVectorMemoryAnIndexIsSearchedFromItsRows() throws {
        let d = try DaemonProcess(arguments: ["--max-vector-memory", "0"])
        defer { d.stop() }
        let c = try d.connect()
        _ = try c.call("index.create", ["db": "default", "collection": "p", "fields": ["v"], "vector": ["dimensions": 16, "metric": "l2"]])
        let rows = Self.vectors(300, 16, seed: 41).enumerated().map { (id: "d\($0.offset)", v: $0.element) }
        try Self.write(rows, to: c, db: "default", collection: "p")
        for q in Self.vectors(3, 16, seed: 42) {
            let r = try c.call("query.nearest", ["db": "default", "collection": "p", "field": "v", "vector": .string(VectorValue.encode(q)), "k": 7])
            #expect(r["index"] == "p.v" && r["approximate"] == false && Self.ids(r) == Self.reference(rows, q, k: 7, .l2))
        }
    }

    /// 10,000 documents with 768-d vectors written on A are searchable on B after sync, B's answers equal a brute-force
    /// reference, and a vector updated concurrently on both ends converges with a conflict listed.
    @Test func tenThousandVectorsSyncAndASimultaneousUpdateConverges() throws {
        let a = try RestartingDaemon(), b = try RestartingDaemon()
        defer {
            a.stop(kill9: false)
            b.stop(kill9: false)
        }
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "photos"])
        _ = try ca.call("index.create", ["db": "photos", "collection": "p", "fields": ["v"], "vector": ["dimensions": 768, "metric": "cosine"]])
        let rows = Self.vectors(10_000, 768, seed: 21).enumerated().map { (id: "p\($0.offset)", v: $0.element) }
        try Self.write(rows, to: ca, db: "photos", collection: "p")
        _ = try cb.call("db.join", ["token": .string(try ca.invite("photos")), "db": "photos"])
        #expect(eventually(timeout: .seconds(300)) {
            (try? cb.call("query.count", ["db": "photos", "collection": "p"]))?["count"] == 10_000
        }, "B did not receive the 10,000 documents")
        #expect(try cb.call("index.list", ["db": "photos"])["indexes"]?.arrayValue?.first?["vector"] == ["dimensions": 768, "metric": "cosine"])
        for (i, q) in Self.vectors(3, 768, seed: 22).enumerated() {
            let r = try cb.call("query.nearest", ["db": "photos", "collection": "p", "field": "v", "vector": .string(VectorValue.encode(q)), "k": 10])
            #expect(r["index"] == "p.v" && Self.ids(r) == Self.reference(rows, q, k: 10, .cosine), "query \(i)")
        }

        // Both ends write p5's vector before hearing of the other's write.
        _ = try cb.call("peer.remove", ["db": "photos", "address": .string(a.address)])
        _ = try ca.call("peer.remove", ["db": "photos", "address": .string(b.address)])
        let (va, vb) = (Self.vectors(1, 768, seed: 23)[0], Self.vectors(1, 768, seed: 24)[0])
        _ = try ca.call("doc.patch", ["db": "photos", "collection": "p", "id": "p5", "set": ["v": ["$vector": .string(VectorValue.encode(va))]]])
        _ = try cb.call("doc.patch", ["db": "photos", "collection": "p", "id": "p5", "set": ["v": ["$vector": .string(VectorValue.encode(vb))]]])
        _ = try cb.call("peer.add", ["db": "photos", "address": .string(a.address)])
        var winner: JSONValue?
        #expect(eventually(timeout: .seconds(60)) {
            let onA = try? ca.call("doc.get", ["db": "photos", "collection": "p", "id": "p5"])["doc"]?["v"]
            let onB = try? cb.call("doc.get", ["db": "photos", "collection": "p", "id": "p5"])["doc"]?["v"]
            winner = onA
            return onA != nil && onA == onB
        }, "the two vectors did not converge")
        let wv = try #require(winner.flatMap { VectorValue.storedComponents($0) })
        #expect(wv == va || wv == vb)
        for c in [ca, cb] {
            let conflicts = try c.call("conflict.list", ["db": "photos", "collection": "p"])["conflicts"]?.arrayValue ?? []
            #expect(conflicts.contains { $0["id"] == "p5" && $0["field"] == "v" })
            let r = try c.call("query.nearest", ["db": "photos", "collection": "p", "field": "v", "vector": .string(VectorValue.encode(wv)), "k": 1])
            #expect(Self.ids(r) == ["p5"])
        }
    }

    /// The graph a daemon built is written when it stops (SIGTERM) and searched at once by the next daemon; after a
    /// SIGKILL, which writes nothing, the next daemon uses the file of the last clean stop, caught up with the rows
    /// written since.
    @Test func theGraphOutlivesARestartAndAKill9FallsBackToTheLastCleanStop() throws {
        let dir = TempDir()
        var d = try DaemonProcess(dir: dir)
        var c = try d.connect()
        _ = try c.call("index.create", ["db": "default", "collection": "p", "fields": ["v"], "vector": ["dimensions": 8, "metric": "l2"]])
        let rows = Self.vectors(10_200, 8, seed: 31).enumerated().map { (id: "d\($0.offset)", v: $0.element) }
        try Self.write(rows, to: c, db: "default", collection: "p")
        let q = Self.vectors(1, 8, seed: 32)[0]
        let query: [String: JSONValue] = ["db": "default", "collection": "p", "field": "v", "vector": .string(VectorValue.encode(q)), "k": 10]
        var built: JSONValue = .null
        #expect(eventually(timeout: .seconds(300)) {
            built = (try? c.call("query.nearest", query)) ?? .null
            return built["approximate"] == true
        }, "the daemon built no graph")
        d.stop()
        let databases = d.dataDir + "/databases"
        #expect(try FileManager.default.contentsOfDirectory(atPath: databases).contains { $0.hasPrefix("default.db.vx-") })

        d = try DaemonProcess(dir: dir)
        c = try d.connect()
        let restarted = try c.call("query.nearest", query)
        #expect(restarted["approximate"] == true && restarted["results"] == built["results"], "the first search after SIGTERM did not use the graph")
        let late = Self.vectors(1, 8, seed: 33)[0]
        _ = try c.call("doc.put", ["db": "default", "collection": "p", "id": "late", "doc": ["v": ["$vector": .string(VectorValue.encode(late))]]])
        d.kill9()

        d = try DaemonProcess(dir: dir)
        c = try d.connect()
        let lateQuery: [String: JSONValue] = ["db": "default", "collection": "p", "field": "v", "vector": .string(VectorValue.encode(late)), "k": 1]
        let afterKill = try c.call("query.nearest", lateQuery)
        #expect(afterKill["approximate"] == true && Self.ids(afterKill) == ["late"])
        d.stop()
    }
}
