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
