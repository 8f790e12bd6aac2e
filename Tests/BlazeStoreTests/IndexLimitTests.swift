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

    static func built(_ db: BlazeDatabase) throws -> [String] { try db.indexes().filter(\.built).map(\.name) }
    static func kept(_ db: BlazeDatabase) throws -> [String] { try db.indexes().filter { !$0.built }.map(\.name) }

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
        #expect(try Self.kept(b) == ["n4", "v1", "v2"])
        // Queries on fields without a built index still answer; a vector search, in the kept index's metric (l2, not
        // the default cosine) and dimensions.
        #expect(try b.find(FindQuery(collection: "c", filter: try Filter.parse(["n4": 4]))).docs.count == 1)
        let near = try b.nearest(NearestQuery(collection: "c", field: try FieldPath("e"), vector: [1, 2], k: 1))
        #expect(near.hits.count == 1 && near.index == nil && near.metric == .l2)
        expectStoreError("invalid_vector") { _ = try b.nearest(NearestQuery(collection: "c", field: try FieldPath("e"), vector: [1, 2, 3], k: 1)) }
        // A kept definition exists: its name cannot be created again, and it can be dropped.
        expectStoreError("index_exists") { try Self.create(b, "n4") }
        // A drops two: B builds kept ones in name order, the vector ones within their own limit.
        _ = try a.write { try $0.dropIndex(name: "n1") }
        _ = try a.write { try $0.dropIndex(name: "n2") }
        try send()
        #expect(try Self.built(b) == ["n3", "n4", "v1"])
        // A kept definition dropped on B goes everywhere (A had built it), and builds nothing in its place.
        try Self.create(a, "n5")
        try send()
        #expect(try Self.kept(b) == ["n5", "v2"])
        _ = try b.write { try $0.dropIndex(name: "n5") }
        _ = try a.receive(try b.changes(since: try a.versionVector()))
        #expect(try Self.built(a) == ["n3", "n4", "v1", "v2"] && Self.kept(b) == ["v2"])
        // Removing the limits' pressure entirely: every definition A holds is built on a device with room.
        let tc = try TempStore()
        let c = try tc.store.create("d")
        _ = try c.receive(try a.changes(since: VersionVector()))
        #expect(try Self.built(c) == ["n3", "n4", "v1", "v2"])
    }

    @Test func droppingACollectionDropsItsKeptDefinitionsToo() throws {
        let (ta, tb) = (try TempStore(), try TempStore(limits: Self.small))
        let (a, b) = (try ta.store.create("d"), try tb.store.create("d"))
        _ = try a.apply(.put(collection: "c", id: "x", doc: ["n1": 1]))
        for name in ["n1", "n2", "n3", "n4", "n5"] { try Self.create(a, name) }
        _ = try b.receive(try a.changes(since: VersionVector()))
        #expect(try Self.built(b) == ["n1", "n2", "n3"] && Self.kept(b) == ["n4", "n5"])
        _ = try b.dropCollection("c")
        #expect(try b.indexes().isEmpty)
        _ = try a.receive(try b.changes(since: try a.versionVector()))
        #expect(try a.indexes().isEmpty)
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

    @Test func malformedKeptDefinitionsNeitherCrashASearchNorStopADrop() throws {
        let t = try TempStore(limits: Self.small)
        let db = try t.store.create("d")
        _ = try db.apply(.put(collection: "c", id: "x", doc: ["e": VectorValue.stored([1, 2])]))
        try Self.create(db, "a")
        // From another device: a vector definition whose dimensions are text, one whose metric is a number, and one of
        // 1,000 fields (past the fields an index may have): kept, never built.
        let stranger = randomNode()
        let odd = Change(
            origin: stranger, seq: 1, hlc: HLC(milliseconds: UInt64(Date().timeIntervalSince1970 * 1000)), deps: try db.versionVector(),
            ops: [
                .index(name: "d1", collection: "c", fields: ["e"], vector: IndexVector(json: ["d": "2", "m": "l2"])),
                .index(name: "d2", collection: "c", fields: ["e"], vector: IndexVector(json: ["d": 2, "m": 1])),
                .index(name: "wide", collection: "c", fields: (0..<1000).map { "f\($0)" }),
            ])
        _ = try db.receive([odd])
        #expect(try Self.built(db) == ["a"])
        let near = try db.nearest(NearestQuery(collection: "c", field: try FieldPath("e"), vector: [1, 2], k: 1))
        #expect(near.hits.count == 1 && near.index == nil && near.metric == .cosine)
        // Dropping the built one tries the kept ones, builds none of them, and goes through.
        _ = try db.write { try $0.dropIndex(name: "a") }
        #expect(try Self.built(db).isEmpty)
    }
}
