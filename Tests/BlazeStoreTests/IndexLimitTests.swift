import BlazeCRDT
import BlazeProtocol
import BlazeTestSupport
import BlazeVector
import Foundation
import GRDB
import Testing

@testable import BlazeStore

/// The limits on indexes per database (`StoreLimits.maxIndexes`, `maxVectorIndexes`): a local `index.create` past
/// them is refused; definitions past them from another device, a snapshot or a backup are kept and not built, and
/// are built once a drop makes room.
@Suite struct IndexLimitTests {
    static let small: StoreLimits = {
        var limits = StoreLimits()
        limits.maxIndexes = 3
        limits.maxVectorIndexes = 1
        return limits
    }()

    static func built(_ db: BlazeDatabase) throws -> [String] { try db.indexes().map(\.name) }

    static func create(_ db: BlazeDatabase, _ name: String, vector: Bool = false) throws {
        _ = try db.write { tx in
            try tx.createIndex(
                collection: "c", fields: [vector ? "e" : name], name: name, vector: vector ? IndexVector(dimensions: 2, metric: "l2") : nil)
        }
    }

    @Test func aLocalIndexPastTheLimitsIsRefused() throws {
        let t = try TempStore(limits: Self.small)
        let db = try t.store.create("d")
        try Self.create(db, "v1", vector: true)
        try Self.create(db, "a")
        expectStoreError("too_many_indexes") { try Self.create(db, "v2", vector: true) }
        try Self.create(db, "b")
        expectStoreError("too_many_indexes") { try Self.create(db, "c") }
        #expect(try Self.built(db) == ["a", "b", "v1"])
        _ = try db.write { try $0.dropIndex(name: "a") }
        try Self.create(db, "c")
        _ = try db.write { try $0.dropIndex(name: "v1") }
        try Self.create(db, "v2", vector: true)
        #expect(try Self.built(db) == ["b", "c", "v2"])
    }

    @Test func definitionsPastTheLimitsFromAnotherDeviceAreKeptAndBuiltWhenRoomIsMade() throws {
        let (ta, tb) = (try TempStore(), try TempStore(limits: Self.small))
        let (a, b) = (try ta.store.create("d"), try tb.store.create("d"))
        _ = try a.apply(.put(collection: "c", id: "x", doc: ["n1": 1, "n2": 2, "n3": 3, "n4": 4, "e": VectorValue.stored([1, 2])]))
        for name in ["n1", "n2", "n3", "n4"] { try Self.create(a, name) }
        try Self.create(a, "v1", vector: true)
        try Self.create(a, "v2", vector: true)
        func send() throws { _ = try b.receive(try a.changes(since: try b.versionVector())) }
        try send()
        // B builds the first three in the order they came and keeps the other three definitions.
        #expect(try Self.built(b) == ["n1", "n2", "n3"])
        #expect(try b.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM index_states") } == 6)
        // Queries on fields without a built index still answer.
        #expect(try b.find(FindQuery(collection: "c", filter: try Filter.parse(["n4": 4]))).docs.count == 1)
        #expect(try b.nearest(NearestQuery(collection: "c", field: try FieldPath("e"), vector: [1, 2], k: 1)).hits.count == 1)
        // A drops two: B builds kept ones in name order, the vector ones within their own limit.
        _ = try a.write { try $0.dropIndex(name: "n1") }
        _ = try a.write { try $0.dropIndex(name: "n2") }
        try send()
        #expect(try Self.built(b) == ["n3", "n4", "v1"])
        // Removing the limits' pressure entirely: every definition A holds is built on a device with room.
        let tc = try TempStore()
        let c = try tc.store.create("d")
        _ = try c.receive(try a.changes(since: VersionVector()))
        #expect(try Self.built(c) == ["n3", "n4", "v1", "v2"])
    }

    @Test func aRestoredBackupBuildsOnlyWhatTheLimitsAllow() throws {
        let ta = try TempStore()
        let a = try ta.store.create("d")
        _ = try a.apply(.put(collection: "c", id: "x", doc: ["e": VectorValue.stored([1, 2])]))
        for name in ["n1", "n2", "n3", "n4"] { try Self.create(a, name) }
        try Self.create(a, "v1", vector: true)
        try Self.create(a, "v2", vector: true)
        let backup = ta.dir + "/d.backup"
        _ = try a.backup(to: backup)
        let tb = try TempStore(limits: Self.small)
        let restored = try tb.store.restore(from: backup, as: "d")
        // Vector indexes past theirs first (v2), then all past three in name order.
        #expect(try Self.built(restored) == ["n1", "n2", "n3"])
        let userIndexes = try restored.read { db in
            try String.fetchAll(db, sql: "SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE 'ux\\_%' ESCAPE '\\'")
        }
        #expect(userIndexes.sorted() == ["ux_n1", "ux_n2", "ux_n3"])
        #expect(try restored.nearest(NearestQuery(collection: "c", field: try FieldPath("e"), vector: [1, 2], k: 1)).index == nil)
    }

    @Test func anIndexPastTheVectorMemoryLimitIsSearchedFromItsRows() throws {
        var limits = StoreLimits()
        limits.maxVectorMemoryBytes = 12_000
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
        // Small enough: held in memory.
        try add(20)
        try check()
        #expect(db.vectorIndexes.isHeld("e"))
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
