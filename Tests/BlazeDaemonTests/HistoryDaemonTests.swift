import BlazeClient
import BlazeProtocol
import Foundation
import Testing

/// `doc.history` and `doc.get` with `at`/`atTime` over the socket and through blazectl.
@Suite struct HistoryDaemonTests {
    @Test func historyAndTimeTravelOverTheSocket() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        let target: [String: JSONValue] = ["db": "default", "collection": "notes", "id": "n1"]
        func with(_ extra: [String: JSONValue]) -> [String: JSONValue] { target.merging(extra) { $1 } }
        _ = try c.call("doc.insert", ["db": "default", "collection": "notes", "doc": ["_id": "n1", "text": "a", "meta": ["v": 1]]])
        _ = try c.call("doc.patch", with(["set": ["text": "b", "meta.v": 2]]))
        _ = try c.call("doc.patch", with(["set": ["text": "b"]]))
        _ = try c.call("doc.delete", target)
        let h = try c.call("doc.history", target)
        let entries = try #require(h["entries"]?.arrayValue)
        #expect(entries.map { $0["type"] } == ["insert", "update", "unchanged", "delete"])
        #expect(entries.map { $0["changed"] } == [["meta", "text"], ["meta.v", "text"], [], ["meta", "text"]])
        let node = try c.call("daemon.info")["nodeId"]
        #expect(entries.allSatisfy { $0["origin"] == node && $0["time"]?.intValue != nil && $0["appliedAt"]?.intValue != nil })
        #expect(entries.map { $0["change"] } == [1, 2, 3, 4])
        #expect(h["cursor"] == .null && h["floor"] == 0)
        let seqs = entries.compactMap { $0["seq"]?.intValue }
        #expect(try c.call("doc.get", with(["at": .int(seqs[0])]))["doc"] == ["_id": "n1", "text": "a", "meta": ["v": 1]])
        #expect(try c.call("doc.get", with(["at": .int(seqs[1]), "fields": ["meta.v"]]))["doc"] == ["_id": "n1", "meta": ["v": 2]])
        expectRPCError(c, "doc.get", with(["at": .int(seqs[3])]), code: -32010, kind: "document_not_found")
        expectRPCError(c, "doc.get", with(["at": 0]), code: -32010, kind: "document_not_found")
        expectRPCError(c, "doc.get", target, code: -32010, kind: "document_not_found")
        // At the first change's time the document is as the last change applied by then left it: several changes may
        // share that millisecond (on a fast disk all four can).
        let appliedFirst = try #require(entries[0]["appliedAt"]?.intValue)
        let lastByThen = try #require(entries.lastIndex { ($0["appliedAt"]?.intValue ?? .max) <= appliedFirst })
        if entries[lastByThen]["type"] == "delete" {
            expectRPCError(c, "doc.get", with(["atTime": .int(appliedFirst)]), code: -32010, kind: "document_not_found")
        } else {
            let text: JSONValue = lastByThen == 0 ? "a" : "b"
            #expect(try c.call("doc.get", with(["atTime": .int(appliedFirst)]))["doc"]?["text"] == text)
        }
        expectRPCError(c, "doc.get", with(["atTime": 0]), code: -32010, kind: "document_not_found")
        // Pages.
        let first = try c.call("doc.history", with(["limit": 3]))
        #expect(first["entries"]?.arrayValue?.count == 3)
        let cursor = try #require(first["cursor"]?.stringValue)
        #expect(try c.call("doc.history", with(["cursor": .string(cursor)]))["entries"]?.arrayValue?.map { $0["type"] } == ["delete"])
        // Bad input.
        expectRPCError(c, "doc.get", with(["at": 99]), code: -32602, kind: "at_in_future")
        expectRPCError(c, "doc.get", with(["at": -1]), code: -32602)
        expectRPCError(c, "doc.get", with(["at": "1"]), code: -32602)
        expectRPCError(c, "doc.get", with(["at": 1, "atTime": 1]), code: -32602)
        expectRPCError(c, "doc.history", with(["limit": 0]), code: -32012, kind: "limit_out_of_range")
        expectRPCError(c, "doc.history", with(["limit": 1001]), code: -32012, kind: "limit_out_of_range")
        expectRPCError(c, "doc.history", with(["cursor": "x"]), code: -32602, kind: "invalid_cursor")
        expectRPCError(c, "doc.history", with(["cursor": 5]), code: -32602)
        expectRPCError(c, "doc.history", ["db": "default", "collection": "notes"], code: -32602, kind: "invalid_params")
        expectRPCError(c, "doc.history", with(["db": "nope"]), code: -32010, kind: "database_not_found")
        expectRPCError(c, "doc.history", with(["collection": "a b"]), code: -32602, kind: "invalid_name")
        #expect(try c.call("doc.history", with(["id": "never"]))["entries"] == [])
        // blazectl.
        let ctl = buildDirectory + "/blazectl"
        let listed = try run(ctl, ["doc", "history", "default", "notes", "n1", "--socket", d.socket])
        let lines = listed.out.split(separator: "\n")
        #expect(listed.status == 0 && lines.count == 4 && lines[1].hasSuffix(" meta.v,text") && lines[2].contains(" unchanged "), "\(listed)")
        let old = try run(ctl, ["doc", "get", "default", "notes", "n1", "--at", String(seqs[0]), "--json", "--socket", d.socket])
        #expect(old.status == 0 && old.out.contains(#""text":"a""#), "\(old)")
        let bad = try run(ctl, ["doc", "get", "default", "notes", "n1", "--at-time", "yesterday", "--socket", d.socket])
        #expect(bad.status != 0 && bad.err.contains("ISO 8601"))
    }
}
