import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

/// `query.update` and `query.delete` over the socket and across devices.
@Suite(.serialized) struct BulkWriteDaemonTests {
    @Test func tenThousandDocumentsUpdatedAndDeletedAsOneChangeEachOnTheOtherDevice() throws {
        let a = try syncDaemon(), b = try syncDaemon()
        defer {
            a.stop()
            b.stop()
        }
        let ca = try a.connect(timeout: 300), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        _ = try cb.call("peer.add", ["db": "team", "address": .string(try a.syncAddress())])
        let n = 10_000
        let ops: [JSONValue] = (0..<n).map { i in
            ["op": "insert", "collection": "items", "doc": ["_id": .string(String(format: "i%05d", i)), "n": .int(Int64(i))]]
        }
        _ = try ca.call("tx.commit", ["db": "team", "ops": .array(ops)])
        #expect(try eventually(timeout: .seconds(120)) { try replicaState(cb, "team").docs == Int64(n) })
        let watcher = try b.connect(timeout: 300)
        let (sub, _) = try subscribe(watcher, ["db": "team", "collection": "items"])
        let updated = try ca.call(
            "query.update", ["db": "team", "collection": "items", "where": [:], "set": ["done": true], "incr": ["meta.v": 1]])
        #expect(updated == ["count": .int(Int64(n))])
        let updates = try readEvents(watcher, sub, count: n)
        #expect(updates.count == n && Set(updates.map { $0["seq"] }).count == 1, "one change: every event has its seq")
        #expect(updates.allSatisfy { $0["type"] == "update" && $0["doc"]?["done"] == true && $0["doc"]?["meta"] == ["v": 1] })
        #expect(Set(updates.compactMap { $0["id"]?.stringValue }).count == n)
        let deleted = try ca.call(
            "query.delete", ["db": "team", "collection": "items", "where": ["n": ["$lt": 5000]], "returnIds": true])
        #expect(deleted["count"] == 5000 && deleted["ids"]?.arrayValue?.first == "i00000" && deleted["ids"]?.arrayValue?.count == 5000)
        let deletes = try readEvents(watcher, sub, count: 5000)
        #expect(Set(deletes.map { $0["seq"] }).count == 1 && deletes.allSatisfy { $0["type"] == "delete" })
        #expect(deletes.first?["seq"] != updates.first?["seq"])
        #expect(try eventually { try replicaState(cb, "team").hash == replicaState(ca, "team").hash })
        #expect(try cb.call("query.count", ["db": "team", "collection": "items"])["count"] == 5000)
    }

    @Test func blazectlUpdatesAndDeletesByFilter() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let ctl = buildDirectory + "/blazectl"
        let c = try d.connect()
        for (id, done) in [("t1", false), ("t2", false), ("t3", true)] {
            _ = try c.call("doc.put", ["db": "default", "collection": "todos", "id": .string(id), "doc": ["done": .bool(done)]])
        }
        let update = try run(ctl, ["update", "default", "todos", #"{"done":false}"#, "--set", #"{"done":true,"meta.by":"ctl"}"#, "--ids", "--socket", d.socket])
        #expect(update.status == 0 && update.out == "updated 2\nt1\nt2\n", "\(update)")
        #expect(try c.call("doc.get", ["db": "default", "collection": "todos", "id": "t2"])["doc"] == ["_id": "t2", "done": true, "meta": ["by": "ctl"]])
        let delete = try run(ctl, ["delete-where", "default", "todos", "{}", "--limit", "2", "--socket", d.socket])
        #expect(delete.status == 0 && delete.out == "deleted 2\n", "\(delete)")
        let bad = try run(ctl, ["update", "default", "todos", "{}", "--set", #"{"done.x":1}"#, "--socket", d.socket])
        #expect(bad.status != 0 && bad.err.contains("invalid_path"), "\(bad)")
        #expect(try c.call("query.count", ["db": "default", "collection": "todos"])["count"] == 1)
    }

    @Test func bulkWritesRejectBadInput() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        _ = try c.call("tx.commit", ["db": "default", "ops": [
            ["op": "insert", "collection": "t", "doc": ["_id": "a", "n": 1]], ["op": "insert", "collection": "t", "doc": ["_id": "b", "n": 2]],
        ]])
        let base: [String: JSONValue] = ["db": "default", "collection": "t", "where": ["n": ["$gte": 1]]]
        func params(_ extra: [String: JSONValue], without: String? = nil) -> [String: JSONValue] {
            var p = base.merging(extra) { $1 }
            if let without { p[without] = nil }
            return p
        }
        for method in ["query.update", "query.delete"] {
            let edit: [String: JSONValue] = method == "query.update" ? ["set": ["x": 1]] : [:]
            expectRPCError(c, method, params(edit, without: "where"), code: -32602, kind: "invalid_params")
            expectRPCError(c, method, params(edit, without: "collection"), code: -32602, kind: "invalid_params")
            expectRPCError(c, method, params(edit.merging(["where": 5]) { $1 }), code: -32602)
            expectRPCError(c, method, params(edit.merging(["where": ["n": ["$bogus": 1]]]) { $1 }), code: -32602, kind: "invalid_filter")
            expectRPCError(c, method, params(edit.merging(["limit": 0]) { $1 }), code: -32012, kind: "limit_out_of_range")
            expectRPCError(c, method, params(edit.merging(["limit": 10_001]) { $1 }), code: -32012, kind: "limit_out_of_range")
            expectRPCError(c, method, params(edit.merging(["limit": "2"]) { $1 }), code: -32602)
            expectRPCError(c, method, params(edit.merging(["returnIds": "yes"]) { $1 }), code: -32602)
            expectRPCError(c, method, params(edit.merging(["bogus": 1]) { $1 }), code: -32602)
            expectRPCError(c, method, params(edit.merging(["db": "nope"]) { $1 }), code: -32010, kind: "database_not_found")
            expectRPCError(c, method, params(edit.merging(["collection": "a b"]) { $1 }), code: -32602, kind: "invalid_name")
            // An unknown collection matches nothing.
            #expect(try c.call(method, params(edit.merging(["collection": "later"]) { $1 })) == ["count": 0])
        }
        expectRPCError(c, "query.delete", params(["set": ["x": 1]]), code: -32602)
        expectRPCError(c, "query.update", params([:]), code: -32602, kind: "invalid_patch")
        expectRPCError(c, "query.update", params(["set": ["_id": "z"]]), code: -32602, kind: "reserved_field")
        expectRPCError(c, "query.update", params(["set": ["n.x": 1]]), code: -32602, kind: "invalid_path")
        expectRPCError(c, "query.update", params(["incr": ["n": "1"]]), code: -32602)
        #expect(try c.call("query.count", ["db": "default", "collection": "t", "where": ["x": 1]])["count"] == 0)
        #expect(try c.call("query.update", params(["set": ["x": 1], "limit": 1, "returnIds": true])) == ["count": 1, "ids": ["a"]])
        #expect(try c.call("query.delete", params(["returnIds": false])) == ["count": 2])
    }
}
