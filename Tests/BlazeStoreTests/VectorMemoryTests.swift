import BlazeCRDT
import BlazeProtocol
import BlazeTestSupport
import BlazeVector
import Foundation
import GRDB
import Testing

@testable import BlazeStore

/// `max-vector-memory` (`StoreLimits.maxVectorMemoryBytes`): an index that does not fit is searched exactly from its
/// stored rows, one at a time, with the same answers.
@Suite struct VectorMemoryTests {
    @Test func anIndexPastTheVectorMemoryLimitIsSearchedFromItsRows() throws {
        var limits = StoreLimits()
        limits.maxVectorMemoryBytes = 6_000
        let t = try TempStore(limits: limits)
        let db = try t.store.create("d")
        _ = try db.write { try $0.createIndex(collection: "c", fields: ["e"], name: "e", vector: IndexVector(dimensions: 8, metric: "cosine")) }
        var rng = SeededRandom(seed: testSeed("vector-memory"))
        func random() -> [Float] { (0..<8).map { _ in Float.random(in: -1...1, using: &rng) } }
        var rows: [(id: String, v: [Float])] = []
        func add(_ n: Int) throws {
            let new = (0..<n).map { i in (id: "d\(rows.count + i)", v: random()) }
            _ = try db.commit(new.map { .put(collection: "c", id: $0.id, doc: ["e": VectorValue.stored($0.v), "odd": .bool(Int($0.id.dropFirst())! % 2 == 1)]) })
            rows += new
        }
        func check(_ filter: Filter = .all, sourceLocation: SourceLocation = #_sourceLocation) throws {
            let q = random()
            let r = try db.nearest(NearestQuery(collection: "c", field: try FieldPath("e"), vector: q, k: 5, filter: filter))
            let candidates = filter == .all ? rows : rows.filter { Int($0.id.dropFirst())! % 2 == 1 }
            #expect(r.index == "e" && !r.approximate, sourceLocation: sourceLocation)
            #expect(r.hits.compactMap { $0.doc["_id"]?.stringValue } == VectorStoreTests.reference(candidates, q, k: 5, .cosine),
                sourceLocation: sourceLocation)
        }
        // Small enough: held in memory (20 rows of 8 float32, with norms and ids: 880 bytes).
        try add(20)
        try check()
        #expect(db.vectorIndexes.isHeld("e"))
        // An index dropped after it was searched is let go at the next search, and no longer counts.
        // ("a2" comes first by name, so it is the one searched.)
        _ = try db.write { try $0.createIndex(collection: "c", fields: ["e"], name: "a2", vector: IndexVector(dimensions: 8, metric: "l2")) }
        _ = try db.nearest(NearestQuery(collection: "c", field: try FieldPath("e"), vector: random(), k: 1))
        #expect(db.vectorIndexes.isHeld("a2") && db.vectorIndexes.heldBytes() == 2 * 20 * (8 * 4 + 12))
        _ = try db.write { try $0.dropIndex(name: "a2") }
        try check()
        #expect(!db.vectorIndexes.isHeld("a2") && db.vectorIndexes.heldBytes() == 20 * (8 * 4 + 12))
        // Grown past the limit: answered, then let go; from then on searched from its rows, with or without a filter.
        try add(200)
        try check()
        #expect(!db.vectorIndexes.isHeld("e"))
        try check()
        try check(try Filter.parse(["odd": true]))
        #expect(!db.vectorIndexes.isHeld("e") && db.vectorIndexes.heldBytes() == 0)
        // Without an index, the documents are read one at a time too.
        _ = try db.write { try $0.dropIndex(name: "e") }
        let q = random()
        let scanned = try db.nearest(NearestQuery(collection: "c", field: try FieldPath("e"), vector: q, k: 5))
        #expect(scanned.index == nil && scanned.hits.compactMap { $0.doc["_id"]?.stringValue } == VectorStoreTests.reference(rows, q, k: 5, .cosine))
    }
}
