import BlazeCRDT
import BlazeClient
import BlazeProtocol
import BlazeStore
import Foundation
import Testing

@Suite struct ReplicationRPC {
    @Test func patchCountersAndSetsOverTheSocket() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        _ = try c.call("doc.insert", ["db": "default", "collection": "t", "doc": ["_id": "x", "n": 1, "tags": ["b"]]])
        _ = try c.call("doc.patch", ["db": "default", "collection": "t", "id": "x", "incr": ["n": 2, "m": .double(0.5)],
            "add": ["tags": ["a", "c"]]])
        _ = try c.call("tx.commit", ["db": "default", "ops": [
            ["op": "patch", "collection": "t", "id": "x", "remove": ["tags": ["b"]], "incr": ["n": -1]],
        ]])
        #expect(try c.call("doc.get", ["db": "default", "collection": "t", "id": "x"])["doc"]
            == ["_id": "x", "n": 2, "m": .double(0.5), "tags": ["a", "c"]])
        expectRPCError(c, "doc.patch", ["db": "default", "collection": "t", "id": "x", "incr": ["n": "1"]], code: -32602,
            kind: "invalid_patch")
        expectRPCError(c, "doc.patch", ["db": "default", "collection": "t", "id": "x", "add": ["tags": "a"]], code: -32602)
        expectRPCError(c, "doc.patch", ["db": "default", "collection": "t", "id": "x", "add": 5], code: -32602)
        expectRPCError(c, "doc.patch", ["db": "default", "collection": "t", "id": "x", "set": ["n": 1], "incr": ["n": 1]],
            code: -32602, kind: "invalid_patch")
        expectRPCError(c, "doc.patch", ["db": "default", "collection": "t", "id": "x"], code: -32602, kind: "invalid_patch")
        expectRPCError(c, "doc.patch", ["db": "default", "collection": "t", "id": "nope", "incr": ["n": 1]], code: -32010,
            kind: "document_not_found")
        d.stop()
    }

    @Test func dbInfoReportsNodeStateHashAndVersionVectorAcrossRestarts() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        let node = try c.call("daemon.info")["nodeId"]?.stringValue
        #expect(node?.count == 32)
        let empty = try c.call("db.info", ["db": "default"])
        _ = try c.call("doc.insert", ["db": "default", "collection": "t", "doc": ["_id": "x"]])
        let info = try c.call("db.info", ["db": "default"])
        #expect(info["nodeId"]?.stringValue == node)
        #expect(info["stateHash"] != empty["stateHash"] && info["stateHash"]?.stringValue?.count == 64)
        #expect(info["versionVector"] == .object([node!: 1]))
        d.stop()
        let again = try DaemonProcess(dir: d.dir)
        let c2 = try again.connect()
        #expect(try c2.call("daemon.info")["nodeId"]?.stringValue == node, "the device identity persists")
        #expect(try c2.call("db.info", ["db": "default"])["stateHash"] == info["stateHash"])
        _ = try c2.call("doc.delete", ["db": "default", "collection": "t", "id": "x"])
        #expect(try c2.call("db.info", ["db": "default"])["stateHash"] == empty["stateHash"],
            "the hash depends on the documents only")
        #expect(try c2.call("db.info", ["db": "default"])["versionVector"] == .object([node!: 2]))
        again.stop()
    }

    @Test func conflictsAreListedAndResolvedOverTheSocket() async throws {
        let dir = TempDir()
        let other = NodeID(bytes: [UInt8](repeating: 0xee, count: 16))
        do {
            // Build a database with a real conflict: a local write and a concurrent remote one.
            let store = try Store(directory: dir.path + "/data", node: NodeID(bytes: [UInt8](repeating: 0x11, count: 16)))
            let db = try store.create("shared")
            _ = try db.apply(.insert(collection: "c", doc: ["_id": "d", "x": "local", "y": 1]))
            let base = try db.changes(since: VersionVector())
            let remote = Change(
                origin: other, seq: 1, hlc: HLC(milliseconds: 1), deps: VersionVector(),
                ops: [.doc(DocOp(key: DocKey(collection: "c", id: "d"), cl: 1, set: ["x": "remote"]))])
            let report = try db.receive([remote])
            #expect(report.applied == 1 && base.count == 1)
            store.closeAll()
        }
        let d = try DaemonProcess(dir: dir)
        let c = try d.connect()
        let list = try c.call("conflict.list", ["db": "shared"])["conflicts"]?.arrayValue ?? []
        #expect(list.count == 1)
        let conflict = try #require(list.first)
        #expect(conflict["collection"] == "c" && conflict["id"] == "d" && conflict["field"] == "x")
        #expect(conflict["value"] == "local" && conflict["winner"]?["value"] == "local")
        let loser = conflict["losers"]?.arrayValue?.first
        #expect(loser?["value"] == "remote" && loser?["origin"] == .string(other.hex))
        #expect(try c.call("conflict.list", ["db": "shared", "collection": "other"])["conflicts"] == [])
        expectRPCError(c, "conflict.resolve", ["db": "shared", "collection": "c", "id": "d", "field": "y"], code: -32010,
            kind: "conflict_not_found")
        expectRPCError(c, "conflict.list", ["db": "shared", "limit": 0], code: -32012)
        expectRPCError(c, "conflict.list", ["db": "nope"], code: -32010, kind: "database_not_found")
        expectRPCError(c, "conflict.resolve", ["db": "shared", "collection": "c", "id": "d"], code: -32602)
        let resolved = try c.call("conflict.resolve", ["db": "shared", "collection": "c", "id": "d", "field": "x",
            "value": .null])
        #expect(resolved == ["id": "d", "field": "x", "value": .null, "present": true])
        #expect(try c.call("conflict.list", ["db": "shared"])["conflicts"] == [])
        #expect(try c.call("doc.get", ["db": "shared", "collection": "c", "id": "d"])["doc"] == ["_id": "d", "x": .null, "y": 1])
        d.stop()
    }
}
