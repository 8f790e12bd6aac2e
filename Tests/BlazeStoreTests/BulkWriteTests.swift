import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDB
import Testing

@testable import BlazeStore

/// Writes by filter (`query.update`, `query.delete`): atomic, one change, limits that hold.
@Suite struct BulkWrites {
    func seeded(_ t: TempStore, count: Int = 50) throws -> BlazeDatabase {
        let db = try t.store.create("db")
        _ = try db.commit((0..<count).map { i in
            .insert(collection: "c", doc: ["_id": .string(String(format: "d%03d", i)), "n": .int(Int64(i)), "o": ["k": "v"]])
        })
        return db
    }

    @Test func updateAndDeleteByFilterAreOneChangeEach() throws {
        let t = try TempStore()
        let db = try seeded(t)
        let before = try db.versionVector()
        let filter = try Filter.parse(["n": ["$gte": 40]])
        let ids = try db.write(matching: filter, in: "c", limit: nil, edit: .patch(set: ["hot": true, "o.k": "w"], incr: ["o.hits": 1]))
        #expect(ids == (40..<50).map { String(format: "d%03d", $0) })
        #expect(try db.versionVector()[db.node] == before[db.node] + 1, "one change")
        #expect(try db.count(collection: "c", filter: try Filter.parse(["hot": true])) == 10)
        #expect(try db.get(collection: "c", id: "d045") == ["_id": "d045", "n": 45, "hot": true, "o": ["k": "w", "hits": 1]])
        #expect(try db.get(collection: "c", id: "d039")["hot"] == nil)
        // A limit takes the first matches in _id order.
        let limited = try db.write(matching: .all, in: "c", limit: 3, edit: .patch(incr: ["n": 1000]))
        #expect(limited == ["d000", "d001", "d002"])
        #expect(try db.get(collection: "c", id: "d002")["n"] == 1002)
        let deleted = try db.write(matching: try Filter.parse(["hot": true]), in: "c", limit: nil, edit: .delete)
        #expect(deleted.count == 10)
        #expect(try db.count(collection: "c", filter: .all) == 40)
        #expect(try db.versionVector()[db.node] == before[db.node] + 3)
        // Nothing matches: nothing written, no change, and no collection created by an unknown one.
        #expect(try db.write(matching: try Filter.parse(["n": -1]), in: "c", limit: nil, edit: .delete).isEmpty)
        #expect(try db.write(matching: .all, in: "other", limit: nil, edit: .patch(set: ["a": 1])).isEmpty)
        #expect(try db.versionVector()[db.node] == before[db.node] + 3)
        #expect(try db.collections().map(\.name) == ["c"])
        // A replica applies each bulk write as one change, atomically.
        let other = try TempStore()
        let replica = try other.store.create("db")
        let report = try replica.receive(try db.changes(since: VersionVector()))
        #expect(report.applied == 4)
        #expect(try replica.stateHash() == db.stateHash())
    }

    @Test func aBulkWriteIsAllOrNothing() throws {
        let t = try TempStore(limits: { var l = StoreLimits(); l.maxTransactionOps = 20; return l }())
        let db = try t.store.create("db")
        _ = try db.commit((0..<20).map { i in .insert(collection: "c", doc: ["_id": .string("d\(i)"), "n": .int(Int64(i))]) })
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "e", "n": 100, "o": 5]))
        let hash = try db.stateHash()
        // More matches than a transaction may hold: refused, nothing written; with a limit it goes through.
        expectStoreError("too_many_matches") { _ = try db.write(matching: .all, in: "c", limit: nil, edit: .delete) }
        expectStoreError("limit_out_of_range") { _ = try db.write(matching: .all, in: "c", limit: 21, edit: .delete) }
        expectStoreError("limit_out_of_range") { _ = try db.write(matching: .all, in: "c", limit: 0, edit: .delete) }
        // One document the patch cannot apply to (`o` is a number there) fails the whole call, naming it.
        do {
            _ = try db.write(matching: try Filter.parse(["n": ["$gte": 10]]), in: "c", limit: nil, edit: .patch(set: ["o.x": 1]))
            Issue.record("a patch through a number was accepted")
        } catch let e as StoreError {
            #expect(e.kind == "invalid_path" && e.details["id"] == "e" && e.details["op"] == 10)
        }
        // Bad patches and names are refused even when nothing matches.
        expectStoreError("invalid_patch") { _ = try db.write(matching: .all, in: "none", limit: nil, edit: .patch()) }
        expectStoreError("reserved_field") { _ = try db.write(matching: .all, in: "none", limit: nil, edit: .patch(set: ["_id": "x"])) }
        expectStoreError("invalid_name") { _ = try db.write(matching: .all, in: "a b", limit: nil, edit: .delete) }
        #expect(try db.stateHash() == hash)
        #expect(try db.write(matching: .all, in: "c", limit: 20, edit: .delete).count == 20)
        #expect(try db.count(collection: "c", filter: .all) == 1)
    }
}

/// `collection.drop`: replicated deletes and index drops; what another device writes concurrently.
@Suite struct CollectionDrop {
    @Test func aDropDeletesEverythingInChangesOfBoundedSizeAndReplicates() throws {
        let t = try TempStore(limits: { var l = StoreLimits(); l.maxTransactionOps = 10; return l }())
        let db = try t.store.create("db")
        for part in 0..<3 {
            _ = try db.commit((0..<9).map { i in .insert(collection: "c", doc: ["_id": .string("d\(part)-\(i)"), "n": .int(Int64(i))]) })
        }
        _ = try db.apply(.insert(collection: "keep", doc: ["_id": "k"]))
        _ = try db.write { try $0.createIndex(collection: "c", fields: ["n"], name: "byN") }
        let before = try db.versionVector()[db.node]
        let report = try db.dropCollection("c")
        #expect(report == DropReport(deleted: 27, indexes: 1, changes: 3))
        #expect(try db.versionVector()[db.node] == before + 3)
        #expect(try db.collections().map(\.name) == ["keep"])
        #expect(try db.summary().collections == 1)
        #expect(try db.count(collection: "c", filter: .all) == 0 && db.indexes().isEmpty)
        expectStoreError("collection_not_found") { _ = try db.dropCollection("c") }
        expectStoreError("collection_not_found") { _ = try db.dropCollection("never") }
        expectStoreError("invalid_name") { _ = try db.dropCollection("a b") }
        let other = try TempStore()
        let replica = try other.store.create("db")
        _ = try replica.receive(try db.changes(since: VersionVector()))
        #expect(try replica.stateHash() == db.stateHash())
        #expect(try replica.collections().map(\.name) == ["keep"] && replica.indexes().isEmpty)
        // The name can be used again.
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "again"]))
        #expect(try db.collections().map(\.name) == ["c", "keep"])
    }

    @Test func aConcurrentInsertSurvivesADropAndAConcurrentEditLosesToIt() throws {
        let ta = try TempStore(), tb = try TempStore()
        let a = try ta.store.create("db"), b = try tb.store.create("db")
        _ = try a.commit([.insert(collection: "c", doc: ["_id": "d1", "n": 1]), .insert(collection: "c", doc: ["_id": "d2"])])
        _ = try b.receive(try a.changes(since: VersionVector()))
        // Concurrently: A drops the collection; B inserts a new document and edits one A's drop deletes.
        #expect(try a.dropCollection("c").deleted == 2)
        _ = try b.apply(.insert(collection: "c", doc: ["_id": "late", "n": 5]))
        _ = try b.apply(.patch(collection: "c", id: "d1", set: ["n": 2]))
        _ = try a.receive(try b.changes(since: try a.versionVector()))
        _ = try b.receive(try a.changes(since: try b.versionVector()))
        #expect(try a.stateHash() == b.stateHash())
        for db in [a, b] {
            #expect(try db.find(FindQuery(collection: "c")).docs == [["_id": "late", "n": 5]])
            #expect(try db.collections().map(\.name) == ["c"])
        }
    }
}
