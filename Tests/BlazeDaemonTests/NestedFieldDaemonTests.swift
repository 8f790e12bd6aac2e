import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

/// Nested fields edited by path on two daemons that sync (Protocol/SYNC.md §2, "Nested fields").
@Suite(.serialized) struct NestedFieldDaemonTests {
    @Test func twoDaemonsPatchingNestedPathsConcurrentlyKeepBothEdits() throws {
        let a = try syncDaemon(), b = try syncDaemon()
        defer {
            a.stop()
            b.stop()
        }
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        _ = try cb.call("peer.add", ["db": "team", "address": .string(try a.syncAddress())])
        let doc: JSONValue = ["address": ["city": "Bergen", "zip": "5003"], "stats": ["views": 0], "note": ["text": "-"]]
        _ = try ca.call("doc.put", ["db": "team", "collection": "people", "id": "p", "doc": doc])
        #expect(try eventually { try replicaState(cb, "team").docs == 1 })
        // B goes offline; both edit the same document.
        _ = try cb.call("sync.pause", ["db": "team"])
        let target: [String: JSONValue] = ["db": "team", "collection": "people", "id": "p"]
        func patch(_ c: BlazeConnection, _ edits: [String: JSONValue]) throws {
            _ = try c.call("doc.patch", target.merging(edits) { $1 })
        }
        try patch(ca, ["set": ["address.city": "Oslo", "note.text": "from a"]])
        try patch(cb, ["set": ["address.zip": "0150", "note.text": "from b"]])
        for _ in 0..<10 {
            try patch(ca, ["incr": ["stats.views": 1]])
            try patch(cb, ["incr": ["stats.views": 2, "stats.shares": 1]])
        }
        _ = try cb.call("sync.resume", ["db": "team"])
        let converged = try eventually {
            let (sa, sb) = (try replicaState(ca, "team"), try replicaState(cb, "team"))
            let conflicts = try cb.call("conflict.list", ["db": "team"])["conflicts"]?.arrayValue?.count
            return sa.hash == sb.hash && conflicts == 1
        }
        #expect(converged)
        for c in [ca, cb] {
            let got = try c.call("doc.get", target)["doc"]
            #expect(got?["address"] == ["city": "Oslo", "zip": "0150"], "edits of different nested fields both survive")
            #expect(got?["stats"] == ["views": 30, "shares": 10], "nested counters add up")
            // The same nested field on both: the later write (by clock) wins everywhere, the other is listed.
            let conflicts = try c.call("conflict.list", ["db": "team", "collection": "people"])["conflicts"]?.arrayValue ?? []
            #expect(conflicts.count == 1 && conflicts.first?["field"] == "note.text")
            let winner = try #require(conflicts.first?["winner"]), loser = try #require(conflicts.first?["losers"]?.arrayValue?.first)
            #expect(got?["note"]?["text"] == winner["value"] && conflicts.first?["value"] == winner["value"])
            #expect(Set([winner["value"], loser["value"]]) == ["from a", "from b"])
            #expect(winner["hlc"]!.intValue! >= loser["hlc"]!.intValue!)
        }
        // Resolving at the path clears the conflict everywhere.
        _ = try ca.call("conflict.resolve", ["db": "team", "collection": "people", "id": "p", "field": "note.text", "value": "merged"])
        #expect(try eventually {
            try cb.call("conflict.list", ["db": "team"])["conflicts"]?.arrayValue?.isEmpty == true
                && cb.call("doc.get", target)["doc"]?["note"] == ["text": "merged"]
        })
    }

    @Test func patchPathsAreCheckedOverTheSocket() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        _ = try c.call("doc.insert", ["db": "default", "collection": "t", "doc": ["_id": "x", "n": 1, "o": ["k": "v"]]])
        let base: [String: JSONValue] = ["db": "default", "collection": "t", "id": "x"]
        func params(_ extra: [String: JSONValue]) -> [String: JSONValue] { base.merging(extra) { $1 } }
        _ = try c.call("doc.patch", params(["set": ["o.k": "w", "o.deep.er": 1], "incr": ["o.n": 2]]))
        #expect(try c.call("doc.get", params([:]))["doc"] == ["_id": "x", "n": 1, "o": ["k": "w", "n": 2, "deep": ["er": 1]]])
        expectRPCError(c, "doc.patch", params(["set": ["n.x": 1]]), code: -32602, kind: "invalid_path")
        expectRPCError(c, "doc.patch", params(["set": ["o..k": 1]]), code: -32602, kind: "invalid_path")
        expectRPCError(c, "doc.patch", params(["unset": ["_id.k"]]), code: -32602, kind: "reserved_field")
        expectRPCError(c, "doc.patch", params(["set": ["o": 1], "unset": ["o.k"]]), code: -32602, kind: "invalid_patch")
        expectRPCError(c, "doc.patch", params(["incr": ["o.n": "2"]]), code: -32602)
        expectRPCError(c, "doc.insert", ["db": "default", "collection": "t", "doc": ["a.b": 1]], code: -32602, kind: "invalid_field")
        expectRPCError(c, "tx.commit", ["db": "default", "ops": [["op": "patch", "collection": "t", "id": "x", "set": ["n.x": 1]]]],
            code: -32602, kind: "invalid_path")
        #expect(try c.call("doc.get", params([:]))["doc"]?["n"] == 1)
    }

    /// `incr` of a field that holds a string, null, an object or a set is refused and changes nothing (it used to turn
    /// a string into a counter, and to take an increment of an object that nobody could see).
    @Test func incrementingWhatIsNotANumberIsRefused() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        let doc: JSONValue = ["_id": "x", "s": "str", "z": .null, "o": ["k": "v", "n": 1], "n": 1.5]
        _ = try c.call("doc.insert", ["db": "default", "collection": "t", "doc": doc])
        _ = try c.call("doc.patch", ["db": "default", "collection": "t", "id": "x", "add": ["tags": ["a"]]])
        let before = try c.call("doc.get", ["db": "default", "collection": "t", "id": "x"])["doc"]
        for field in ["s", "z", "o", "tags", "o.k"] {
            expectRPCError(
                c, "doc.patch", ["db": "default", "collection": "t", "id": "x", "incr": [field: 1]], code: -32602, kind: "not_a_number")
            expectRPCError(
                c, "tx.commit", ["db": "default", "ops": [["op": "patch", "collection": "t", "id": "x", "incr": [field: 1]]]],
                code: -32602, kind: "not_a_number")
        }
        #expect(try c.call("doc.get", ["db": "default", "collection": "t", "id": "x"])["doc"] == before)
        // Numbers, nested numbers and missing fields take increments.
        _ = try c.call("doc.patch", ["db": "default", "collection": "t", "id": "x", "incr": ["n": 1, "o.n": 2, "fresh": 3, "o.new": 4]])
        let after = try c.call("doc.get", ["db": "default", "collection": "t", "id": "x"])["doc"]
        #expect(after?["n"] == 2.5 && after?["o"]?["n"] == 3 && after?["fresh"] == 3 && after?["o"]?["new"] == 4 && after?["s"] == "str")
    }
}
