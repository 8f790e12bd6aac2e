import BlazeCRDT
import BlazeProtocol
import BlazeTestSupport
import BlazeVector
import Foundation
import GRDB
import Testing

@testable import BlazeStore

/// Vector fields in the store: written in either form and stored as base64 float32, indexed by triggers in the write's
/// transaction, searched exactly (with and without an index, with a filter), and rebuilt from the documents whatever
/// path changed them: local writes, remote changes, a snapshot, a restore.
@Suite struct VectorStoreTests {
    /// `n` random vectors of `d` components, from `seed`.
    static func vectors(_ n: Int, _ d: Int, seed: UInt64) -> [[Float]] {
        var rng = SeededRandom(seed: seed)
        return (0..<n).map { _ in (0..<d).map { _ in Float.random(in: -1...1, using: &rng) } }
    }

    /// The ids of the `k` nearest of `docs` to `q` by brute force (ties by row order, as the index breaks them by row id).
    static func reference(_ docs: [(id: String, v: [Float])], _ q: [Float], k: Int, _ metric: VectorMetric) -> [String] {
        let scored: [(i: Int, id: String, d: Float)] = docs.enumerated().map { item in
            (item.offset, item.element.id, VectorMatrix.distance(item.element.v, q, metric))
        }
        let sorted = scored.sorted { x, y in x.d != y.d ? x.d < y.d : x.i < y.i }
        return sorted.prefix(k).map(\.id)
    }

    func ids(_ r: NearestResult) -> [String] { r.hits.compactMap { $0.doc["_id"]?.stringValue } }

    @Test func vectorsAreStoredAsBase64AndAnIndexAnswersAsBruteForce() throws {
        let t = try TempStore()
        let db = try t.store.create("v")
        _ = try db.write { try $0.createIndex(collection: "p", fields: ["emb"], name: "byEmb", vector: IndexVector(dimensions: 8, metric: "l2")) }
        let vs = Self.vectors(300, 8, seed: 1)
        var docs: [(id: String, v: [Float])] = []
        for (i, v) in vs.enumerated() {
            let id = "d\(i)"
            // Half given as numbers, half as base64: stored the same.
            let given: JSONValue = i % 2 == 0 ? .array(v.map { .double(Double($0)) }) : .string(VectorValue.encode(v))
            _ = try db.apply(.put(collection: "p", id: id, doc: ["emb": ["$vector": given], "n": .int(Int64(i))]))
            docs.append((id, v))
        }
        let stored = try db.get(collection: "p", id: "d0")
        #expect(stored["emb"] == VectorValue.stored(vs[0]))
        let q = Self.vectors(1, 8, seed: 2)[0]
        for metric in VectorMetric.allCases {
            let r = try db.nearest(NearestQuery(collection: "p", field: try FieldPath("emb"), vector: q, k: 10, metric: metric))
            #expect(r.index == "byEmb" && r.metric == metric)
            #expect(ids(r) == Self.reference(docs, q, k: 10, metric), "\(metric)")
        }
        // Updated, deleted, given no vector: the index follows at the next search.
        _ = try db.apply(.patch(collection: "p", id: "d1", set: ["emb": ["$vector": .array(q.map { .double(Double($0)) })]]))
        _ = try db.apply(.delete(collection: "p", id: "d2"))
        _ = try db.apply(.patch(collection: "p", id: "d3", unset: ["emb"]))
        docs[1].v = q
        docs.removeAll { $0.id == "d2" || $0.id == "d3" }
        let r = try db.nearest(NearestQuery(collection: "p", field: try FieldPath("emb"), vector: q, k: 10))
        #expect(r.metric == .l2 && ids(r) == Self.reference(docs, q, k: 10, .l2) && ids(r).first == "d1")
        #expect(r.hits.first?.distance == 0)
        // A filter is applied first: a selective one still gets k results (here: n < 40, even).
        let filter = try Filter.parse(["n": ["$lt": 40]] as JSONValue)
        let filtered = try db.nearest(NearestQuery(collection: "p", field: try FieldPath("emb"), vector: q, k: 10, filter: filter))
        let admitted = docs.filter { Int($0.id.dropFirst())! < 40 }
        #expect(ids(filtered) == Self.reference(admitted, q, k: 10, .l2))
        // Without an index, the documents are scanned: the same answer.
        _ = try db.write { try $0.dropIndex(name: "byEmb") }
        let scanned = try db.nearest(NearestQuery(collection: "p", field: try FieldPath("emb"), vector: q, k: 10, metric: .l2))
        #expect(scanned.index == nil && ids(scanned) == ids(r))
        #expect(try db.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM vector_rows") } == 0)
    }

    @Test func badVectorsAreRefusedAtTheBoundary() throws {
        let t = try TempStore()
        let db = try t.store.create("v")
        let bad: [(JSONValue, String)] = [
            (["$vector": []], "1 to 4096"),
            (["$vector": .array([1, "x"])], "component 1"),
            (["$vector": .array([1, .double(1e39)])], "float32"),
            (["$vector": "AAAA"], "base64"),  // 3 bytes: not whole float32s
            (["$vector": "AACAfw=="], "base64"),  // +Inf
            (["$vector": .array([1, 2]), "other": 1], "no other members"),
            (["$vector": 5], "array of numbers or a base64 string"),
            (["$vector": .array(Array(repeating: 1, count: 4097))], "1 to 4096"),
            // Finite components whose squared length overflows float32: every distance would be NaN or infinite.
            (["$vector": .array([.double(3e38), .double(3e38)])], "overflows"),
        ]
        for (value, message) in bad {
            #expect {
                _ = try db.apply(.put(collection: "p", id: "x", doc: ["a": ["b": value]]))
            } throws: { error in
                guard let e = error as? StoreError else { return false }
                return e.kind == "invalid_vector" && e.message.contains(message) && e.message.hasPrefix("a.b: ")
            }
        }
        // A vector is written whole: not a field named $vector, not a patch path through one.
        _ = try db.apply(.put(collection: "p", id: "v", doc: ["a": ["$vector": [1, 2, 3, 4]]]))
        for op: WriteOp in [
            .put(collection: "p", id: "x", doc: ["$vector": [1, 2]]),
            .patch(collection: "p", id: "v", set: ["a.$vector": [1, 2, 3, 5]]),
            .patch(collection: "p", id: "v", unset: ["a.$vector"]),
        ] {
            #expect { _ = try db.apply(op) } throws: { ($0 as? StoreError)?.kind == "invalid_vector" }
        }
        _ = try db.apply(.delete(collection: "p", id: "v"))
        #expect(throws: StoreError.self) {
            _ = try db.write { try $0.createIndex(collection: "p", fields: ["a", "b"], name: nil, vector: IndexVector(dimensions: 4, metric: "l2")) }
        }
        #expect(throws: StoreError.self) {
            _ = try db.write { try $0.createIndex(collection: "p", fields: ["a"], name: nil, vector: IndexVector(dimensions: 4, metric: "hamming")) }
        }
        #expect(throws: StoreError.self) {
            _ = try db.write { try $0.createIndex(collection: "p", fields: ["a"], name: nil, vector: IndexVector(dimensions: 5000, metric: "l2")) }
        }
        _ = try db.write { try $0.createIndex(collection: "p", fields: ["a"], name: "a", vector: IndexVector(dimensions: 4, metric: "l2")) }
        #expect {
            _ = try db.nearest(NearestQuery(collection: "p", field: try FieldPath("a"), vector: [1, 2, 3], k: 1))
        } throws: { ($0 as? StoreError)?.kind == "invalid_vector" }
        for k in [0, 10_001] {
            #expect {
                _ = try db.nearest(NearestQuery(collection: "p", field: try FieldPath("a"), vector: [1, 2, 3, 4], k: k))
            } throws: { ($0 as? StoreError)?.kind == "limit_out_of_range" }
        }
        // A document whose vector has other dimensions is stored and not indexed; a malformed one from elsewhere too.
        _ = try db.apply(.put(collection: "p", id: "short", doc: ["a": ["$vector": [1, 2]]]))
        _ = try db.apply(.put(collection: "p", id: "ok", doc: ["a": ["$vector": [1, 2, 3, 4]]]))
        let r = try db.nearest(NearestQuery(collection: "p", field: try FieldPath("a"), vector: [1, 2, 3, 4], k: 5))
        #expect(ids(r) == ["ok"])
    }

    @Test func remoteChangesSnapshotsAndRestoresKeepTheIndex() throws {
        let r = try StoreReplicas(2)
        let (a, b) = (r.dbs[0], r.dbs[1])
        _ = try a.write { try $0.createIndex(collection: "p", fields: ["e"], name: "e", vector: IndexVector(dimensions: 4, metric: "cosine")) }
        let vs = Self.vectors(50, 4, seed: 3)
        for (i, v) in vs.enumerated() {
            _ = try a.apply(.put(collection: "p", id: "d\(i)", doc: ["e": ["$vector": .array(v.map { .double(Double($0)) })]]))
        }
        try r.send(0, 1)
        let q = vs[7]
        let onA = try a.nearest(NearestQuery(collection: "p", field: try FieldPath("e"), vector: q, k: 5))
        let onB = try b.nearest(NearestQuery(collection: "p", field: try FieldPath("e"), vector: q, k: 5))
        #expect(onB.index == "e" && ids(onB) == ids(onA) && ids(onA).first == "d7")
        // Concurrent writes of one vector: both replicas converge on one value, with the other listed as a conflict.
        _ = try a.apply(.patch(collection: "p", id: "d7", set: ["e": ["$vector": [1, 0, 0, 0]]]))
        _ = try b.apply(.patch(collection: "p", id: "d7", set: ["e": ["$vector": [0, 1, 0, 0]]]))
        try r.syncAll()
        let winner = try a.get(collection: "p", id: "d7")["e"]
        #expect(try b.get(collection: "p", id: "d7")["e"] == winner)
        let conflicted = try a.conflicts(collection: "p").contains { $0.id == "d7" }
        #expect(conflicted)
        let wq = VectorValue.storedComponents(winner!)!
        #expect(ids(try a.nearest(NearestQuery(collection: "p", field: try FieldPath("e"), vector: wq, k: 1))) == ["d7"])
        #expect(ids(try b.nearest(NearestQuery(collection: "p", field: try FieldPath("e"), vector: wq, k: 1))) == ["d7"])

        // A definition of a shape this build does not read (a newer build's metric, or no object at all) is held, not
        // refused, and not built; one with members this build does not know is built from those it does.
        let stranger = randomNode()
        let odd = Change(
            origin: stranger, seq: 1, hlc: HLC(milliseconds: UInt64(Date().timeIntervalSince1970 * 1000)), deps: try b.versionVector(),
            ops: [
                .index(name: "hamming", collection: "p", fields: ["e"], vector: IndexVector(json: ["d": 4, "m": "hamming"])),
                .index(name: "weird", collection: "p", fields: ["e"], vector: IndexVector(json: "weird")),
                .index(name: "newer", collection: "p", fields: ["e"], vector: IndexVector(json: ["d": 4, "m": "l2", "q": true])),
            ])
        _ = try b.receive([odd])
        #expect(try b.indexes(collection: "p").map(\.name) == ["e", "newer"])

        // A replica joining from a snapshot builds the index from the snapshot's documents and definition.
        var parts: [[UInt8]] = []
        let heads = try a.exportSnapshot(partBytes: 4096) { parts.append($0) }
        let joiner = try TempStore()
        let c = try joiner.store.create("r")
        var next = parts.makeIterator()
        _ = try c.installSnapshot(heads: heads, parts: { next.next() }, openEntry: { _ in throw StoreError.invalid("x", "no entries") })
        let onC = try c.nearest(NearestQuery(collection: "p", field: try FieldPath("e"), vector: wq, k: 3))
        let onA3 = try a.nearest(NearestQuery(collection: "p", field: try FieldPath("e"), vector: wq, k: 3))
        #expect(onC.index == "e" && ids(onC) == ids(onA3))

        // A restored backup builds the index again from the documents, whatever rows the file held.
        let backup = r.stores[0].dir + "/v.backup"
        _ = try a.backup(to: backup)
        let restored = try r.stores[0].store.restore(from: backup, as: "copy")
        let onCopy = try restored.nearest(NearestQuery(collection: "p", field: try FieldPath("e"), vector: q, k: 5))
        let onOriginal = try a.nearest(NearestQuery(collection: "p", field: try FieldPath("e"), vector: q, k: 5))
        #expect(onCopy.index == "e" && ids(onCopy) == ids(onOriginal))
    }
}

/// The graph an index gets from `VectorIndexes.approximateFrom` rows: built on its own thread while searches answer
/// exactly, then answering (approximate) with the true nearest most of the time; exact on request, for another metric
/// and for a selective filter; rows written after the build found.
@Suite struct VectorGraphStoreTests {
    @Test func aLargeIndexGetsAGraphThatAnswersNearlyAsExactSearch() throws {
        let t = try TempStore()
        let db = try t.store.create("v")
        _ = try db.write { try $0.createIndex(collection: "p", fields: ["e"], name: "e", vector: IndexVector(dimensions: 8, metric: "l2")) }
        var rng = SeededRandom(seed: testSeed("vector-graph"))
        let centres = (0..<100).map { _ in (0..<8).map { _ in Float.random(in: -1...1, using: &rng) } }
        func near() -> [Float] { centres[Int.random(in: 0..<100, using: &rng)].map { $0 + Float.random(in: -0.2...0.2, using: &rng) } }
        let n = VectorIndexes.approximateFrom + 500
        for start in stride(from: 0, to: n, by: 1000) {
            let ops: [WriteOp] = (start..<min(n, start + 1000)).map { i in
                .put(collection: "p", id: "d\(i)", doc: ["e": VectorValue.stored(near()), "i": .int(Int64(i))])
            }
            _ = try db.commit(ops)
        }
        let field = try FieldPath("e")
        let queries = (0..<20).map { _ in near() }
        // The first search starts the build and answers exactly.
        let first = try db.nearest(NearestQuery(collection: "p", field: field, vector: queries[0], k: 10))
        #expect(!first.approximate && first.hits.count == 10)
        #expect(eventually(timeout: .seconds(300)) { db.vectorIndexes.hasGraph("e") }, "no graph was built")
        // Written after the build: found too (the graph is extended, or the rows past it are searched exactly).
        let late = near()
        _ = try db.apply(.put(collection: "p", id: "late", doc: ["e": VectorValue.stored(late), "i": -1]))
        var found = 0
        for q in queries {
            let approximate = try db.nearest(NearestQuery(collection: "p", field: field, vector: q, k: 10))
            var exactQuery = NearestQuery(collection: "p", field: field, vector: q, k: 10)
            exactQuery.exact = true
            let exact = try db.nearest(exactQuery)
            #expect(approximate.approximate && !exact.approximate)
            let ids = { (r: NearestResult) in Set(r.hits.compactMap { $0.doc["_id"]?.stringValue }) }
            found += ids(approximate).intersection(ids(exact)).count
        }
        #expect(Double(found) / 200 >= 0.9, "recall@10 \(Double(found) / 200)")
        #expect(try db.nearest(NearestQuery(collection: "p", field: field, vector: late, k: 1)).hits.first?.doc["_id"] == "late")
        // Another metric, and a filter admitting a tenth: exact.
        #expect(try !db.nearest(NearestQuery(collection: "p", field: field, vector: late, k: 3, metric: .cosine)).approximate)
        let tenth = try db.nearest(NearestQuery(collection: "p", field: field, vector: late, k: 3, filter: try Filter.parse(["i": ["$lt": 1000]] as JSONValue)))
        #expect(!tenth.approximate && tenth.hits.allSatisfy { ($0.doc["i"]?.intValue ?? .max) < 1000 })
        // A filter admitting most: the graph, and only matching documents.
        let most = try db.nearest(NearestQuery(collection: "p", field: field, vector: late, k: 5, filter: try Filter.parse(["i": ["$gte": 1000]] as JSONValue)))
        #expect(most.approximate && most.hits.count == 5 && most.hits.allSatisfy { ($0.doc["i"]?.intValue ?? -1) >= 1000 })
        #expect(throws: StoreError.self) {
            var q = NearestQuery(collection: "p", field: field, vector: late, k: 3)
            q.ef = 0
            _ = try db.nearest(q)
        }
    }

    @Test func theGraphIsKeptInAFileAndSearchedAtOnceAfterARestart() throws {
        let t = try TempStore()
        var db = try t.store.create("v")
        _ = try db.write { try $0.createIndex(collection: "p", fields: ["e"], name: "e", vector: IndexVector(dimensions: 8, metric: "l2")) }
        var rng = SeededRandom(seed: testSeed("vector-graph-file"))
        func random() -> [Float] { (0..<8).map { _ in Float.random(in: -1...1, using: &rng) } }
        let n = VectorIndexes.approximateFrom + 200
        for start in stride(from: 0, to: n, by: 1000) {
            _ = try db.commit((start..<min(n, start + 1000)).map { i in .put(collection: "p", id: "d\(i)", doc: ["e": VectorValue.stored(random())]) })
        }
        let field = try FieldPath("e")
        let queries = (0..<10).map { _ in random() }
        _ = try db.nearest(NearestQuery(collection: "p", field: field, vector: queries[0], k: 5))
        #expect(eventually(timeout: .seconds(300)) { db.vectorIndexes.hasGraph("e") }, "no graph was built")
        let before = try queries.map { try db.nearest(NearestQuery(collection: "p", field: field, vector: $0, k: 5)) }
        #expect(before.allSatisfy { $0.approximate })
        let file = VectorIndexFile.path(database: db.path, index: "e")
        #expect(!FileManager.default.fileExists(atPath: file))
        t.store.closeAll()
        #expect(FileManager.default.fileExists(atPath: file), "closing wrote no index file")

        // A copy of the database as it was at this save (as a file-system snapshot would keep it).
        let copy = t.dir + "/copy"
        try FileManager.default.createDirectory(atPath: copy, withIntermediateDirectories: true)
        for suffix in ["", "-wal"] where FileManager.default.fileExists(atPath: db.path + suffix) {
            try FileManager.default.copyItem(atPath: db.path + suffix, toPath: copy + "/v.db" + suffix)
        }

        // Reopened: the first search answers from the graph, exactly as before the restart; a row written since is
        // found.
        var store = try Store(directory: t.dir, node: t.store.node)
        db = try store.database("v")
        let after = try queries.map { try db.nearest(NearestQuery(collection: "p", field: field, vector: $0, k: 5)) }
        #expect(after.allSatisfy { $0.approximate }, "the first searches after the restart did not use the saved graph")
        let ids = { (r: NearestResult) in r.hits.compactMap { $0.doc["_id"]?.stringValue } }
        #expect(after.map(ids) == before.map(ids))
        #expect(after.map { $0.hits.map(\.distance) } == before.map { $0.hits.map(\.distance) })
        let late = random()
        _ = try db.apply(.put(collection: "p", id: "late", doc: ["e": VectorValue.stored(late)]))
        #expect(try db.nearest(NearestQuery(collection: "p", field: field, vector: late, k: 1)).hits.first?.doc["_id"] == "late")
        store.closeAll()

        // The older copy put back: its marker predates the file written since, so the file is not taken (its rows
        // after the copy's would otherwise be skipped), and the index is searched exactly and built again.
        for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: db.path + suffix) }
        for suffix in ["", "-wal"] where FileManager.default.fileExists(atPath: copy + "/v.db" + suffix) {
            try FileManager.default.copyItem(atPath: copy + "/v.db" + suffix, toPath: db.path + suffix)
        }
        store = try Store(directory: t.dir, node: t.store.node)
        db = try store.database("v")
        // Writes on the copy take its row seqs past the ones the file covers, as sync would before a first search.
        let other = random()
        _ = try db.commit([.put(collection: "p", id: "other", doc: ["e": VectorValue.stored(other)]), .put(collection: "p", id: "o2", doc: ["e": VectorValue.stored(random())])])
        let older = try db.nearest(NearestQuery(collection: "p", field: field, vector: queries[0], k: 5))
        #expect(!older.approximate && !FileManager.default.fileExists(atPath: file), "a file saved after the copy was taken")
        #expect(try db.nearest(NearestQuery(collection: "p", field: field, vector: other, k: 1)).hits.first?.doc["_id"] == "other")
        #expect(eventually(timeout: .seconds(300)) { db.vectorIndexes.hasGraph("e") }, "no graph was built again")
        #expect(try db.nearest(NearestQuery(collection: "p", field: field, vector: queries[0], k: 5)).approximate)
        store.closeAll()

        // A damaged file is removed, and the index searched exactly from its rows.
        #expect(FileManager.default.fileExists(atPath: file))
        let handle = try #require(FileHandle(forUpdatingAtPath: file))
        try handle.seek(toOffset: UInt64(VectorIndexFile.headerSize + 1000))
        try handle.write(contentsOf: Data([0xFF, 0x00, 0xFF]))
        try handle.close()
        store = try Store(directory: t.dir, node: t.store.node)
        db = try store.database("v")
        let damaged = try db.nearest(NearestQuery(collection: "p", field: field, vector: queries[0], k: 5))
        #expect(!damaged.approximate && ids(damaged) == ids(older))
        #expect(!FileManager.default.fileExists(atPath: file), "a damaged index file was kept")
        store.closeAll()

        // Files made for another build, another index or other graph parameters are not used; a FIFO in the file's
        // place does not block the search.
        let empty = VectorMatrix(dimensions: 8)
        store = try Store(directory: t.dir, node: t.store.node)
        db = try store.database("v")
        let marker = try db.read { d in try Row.fetchOne(d, sql: "SELECT seq, v FROM vector_rows WHERE idx = 'e' AND doc = -1") }
        let (build, nonce): (Int64, [UInt8]) = (try #require(marker)[0], Array(try #require(marker)[1] as Data))
        let seen = try db.read { d in try Int64.fetchOne(d, sql: "SELECT max(seq) FROM vector_rows") } ?? 0
        var otherParameters = VectorIndexImage(matrix: empty, graph: HNSWGraph(for: empty, metric: .l2))
        otherParameters.parameters = HNSWGraph.Parameters(m: 16, efConstruction: 100_000)
        let unusable: [(VectorIndexImage, String, VectorIndexFile.Stamp)] = [
            (VectorIndexImage(matrix: empty, graph: HNSWGraph(for: empty, metric: .l2)), "e", .init(build: build, nonce: Array(repeating: 7, count: 16), seen: seen)),
            (VectorIndexImage(matrix: empty, graph: HNSWGraph(for: empty, metric: .l2)), "f", .init(build: build, nonce: nonce, seen: seen)),
            (otherParameters, "e", .init(build: build, nonce: nonce, seen: seen)),
            (VectorIndexImage(matrix: empty, graph: HNSWGraph(for: empty, metric: .l2)), "e", .init(build: build, nonce: nonce, seen: seen + 1)),
        ]
        for (image, index, stamp) in unusable {
            try VectorIndexFile.save(image, index: index, stamp: stamp, to: file)
            #expect(VectorIndexFile.load(file, index: "e", build: build, nonce: nonce, maxSeen: seen) == nil, "\(index) \(stamp)")
            #expect(!FileManager.default.fileExists(atPath: file))
        }
        #expect(mkfifo(file, 0o600) == 0)
        #expect(VectorIndexFile.load(file, index: "e", build: build, nonce: nonce, maxSeen: seen) == nil)
        #expect(!FileManager.default.fileExists(atPath: file))

        // Dropping the database removes its index files, and no file of a database whose name starts like them.
        let neighbour = try store.create("v.db.vx-1")
        _ = try neighbour.apply(.put(collection: "p", id: "n", doc: ["x": 1]))
        try VectorIndexFile.save(
            VectorIndexImage(matrix: empty, graph: HNSWGraph(for: empty, metric: .l2)), index: "e",
            stamp: .init(build: 1, nonce: Array(repeating: 7, count: 16), seen: 1), to: file)
        try store.drop("v")
        #expect(!FileManager.default.fileExists(atPath: file))
        let listed = try store.list()
        #expect(FileManager.default.fileExists(atPath: neighbour.path) && listed == ["v.db.vx-1"])
        store.closeAll()
        #expect(VectorIndexFile.belongs("v.db.vx-" + String(repeating: "0a", count: 16), to: "v.db"))
        #expect(VectorIndexFile.belongs("v.db.vx-" + String(repeating: "0a", count: 16) + ".tmp", to: "v.db"))
        #expect(!VectorIndexFile.belongs("v.db.vx-1.db", to: "v.db") && !VectorIndexFile.belongs("v.db.vx-1.db-wal", to: "v.db"))
        #expect(Store.isFormatCopy("v.db.format-15.bak", of: "v.db") && Store.isFormatCopy("v.db.format-15-1764300000.bak", of: "v.db"))
        #expect(!Store.isFormatCopy("v.db.format-1.db.format-2.bak", of: "v.db"))
    }
}
