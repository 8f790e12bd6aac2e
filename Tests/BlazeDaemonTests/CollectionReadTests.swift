import BlazeClient
import BlazeProtocol
import Foundation
import Testing

/// Reads of a collection that does not exist yet answer as for an empty one (Protocol/RPC.md, "Methods").
@Suite struct CollectionReadTests {
    @Test func readsOfACollectionThatDoesNotExistYetAreEmpty() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        let db: [String: JSONValue] = ["db": "default", "collection": "later"]
        func call(_ method: String, _ extra: [String: JSONValue] = [:]) throws -> JSONValue {
            try c.call(method, db.merging(extra) { $1 })
        }
        #expect(try call("query.find", ["where": ["n": ["$gt": 1]], "sort": "-n"]) == ["docs": [], "cursor": .null])
        #expect(try call("query.count")["count"] == 0)
        #expect(try call("doc.getMany", ["ids": ["a", "b"]])["docs"] == [.null, .null])
        #expect(try call("index.list")["indexes"] == [])
        #expect(try call("query.explain", ["where": ["n": 1]])["indexes"] == [])
        expectRPCError(c, "doc.get", db.merging(["id": "a"]) { $1 }, code: -32010, kind: "document_not_found")
        // Reading creates nothing.
        #expect(try c.call("collection.list", ["db": "default"])["collections"] == [])
        // Names are still checked, and an unknown database is still an error.
        expectRPCError(c, "query.find", ["db": "default", "collection": "no pe"], code: -32602, kind: "invalid_name")
        expectRPCError(c, "query.count", ["db": "default", "collection": ""], code: -32602, kind: "invalid_name")
        expectRPCError(c, "doc.getMany", ["db": "default", "collection": "a/b", "ids": ["x"]], code: -32602, kind: "invalid_name")
        expectRPCError(c, "query.find", ["db": "nope", "collection": "later"], code: -32010, kind: "database_not_found")
        // Once written, the same reads see the documents.
        _ = try call("doc.insert", ["doc": ["_id": "a", "n": 2]])
        #expect(try call("query.find", ["where": ["n": ["$gt": 1]]])["docs"] == [["_id": "a", "n": 2]])
        #expect(try call("doc.getMany", ["ids": ["a", "b"]])["docs"] == [["_id": "a", "n": 2], .null])
    }
}

/// `collection.drop` over the socket and blazectl.
@Suite struct CollectionDropDaemonTests {
    @Test func dropOverTheSocketReachesSubscribersAndRejectsBadInput() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        let watcher = try d.connect()
        _ = try c.call("tx.commit", ["db": "default", "ops": [
            ["op": "insert", "collection": "tmp", "doc": ["_id": "a"]], ["op": "insert", "collection": "tmp", "doc": ["_id": "b"]],
            ["op": "insert", "collection": "keep", "doc": ["_id": "k"]],
        ]])
        _ = try c.call("index.create", ["db": "default", "collection": "tmp", "fields": ["n"]])
        let (sub, _) = try subscribe(watcher, ["db": "default", "collection": "tmp"])
        let dropped = try c.call("collection.drop", ["db": "default", "collection": "tmp"])
        #expect(dropped == ["collection": "tmp", "deleted": 2, "indexes": 1, "changes": 1])
        let events = try readEvents(watcher, sub, count: 2)
        #expect(events.map { $0["type"] } == ["delete", "delete"] && Set(events.map { $0["seq"] }).count == 1)
        #expect(try c.call("collection.list", ["db": "default"])["collections"] == [["name": "keep", "count": 1]])
        #expect(try c.call("query.count", ["db": "default", "collection": "tmp"])["count"] == 0)
        expectRPCError(c, "collection.drop", ["db": "default", "collection": "tmp"], code: -32010, kind: "collection_not_found")
        expectRPCError(c, "collection.drop", ["db": "default", "collection": "a b"], code: -32602, kind: "invalid_name")
        expectRPCError(c, "collection.drop", ["db": "default"], code: -32602, kind: "invalid_params")
        expectRPCError(c, "collection.drop", ["db": "default", "collection": 5], code: -32602)
        expectRPCError(c, "collection.drop", ["db": "nope", "collection": "keep"], code: -32010, kind: "database_not_found")
        let ctl = buildDirectory + "/blazectl"
        let out = try run(ctl, ["collection", "drop", "default", "keep", "--socket", d.socket])
        #expect(out.status == 0 && out.out == "dropped keep: 1 documents, 0 indexes\n", "\(out)")
        #expect(try c.call("collection.list", ["db": "default"])["collections"] == [])
    }
}
