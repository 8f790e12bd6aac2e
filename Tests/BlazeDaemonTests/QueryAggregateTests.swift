import BlazeClient
import BlazeProtocol
import Foundation
import Testing

/// `query.aggregate` over the socket.
@Suite struct QueryAggregateTests {
    @Test func aggregatesOverTheSocketAndRejectsBadInput() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        let docs: [JSONValue] = [
            ["city": "Oslo", "amount": 10, "paid": true], ["city": "Oslo", "amount": 20, "paid": true],
            ["city": "Bergen", "amount": 5, "paid": false], ["amount": 1, "paid": true],
        ]
        _ = try c.call("tx.commit", ["db": "default", "ops": .array(docs.map { ["op": "insert", "collection": "orders", "doc": $0] })])
        let base: [String: JSONValue] = ["db": "default", "collection": "orders"]
        func params(_ extra: [String: JSONValue]) -> [String: JSONValue] { base.merging(extra) { $1 } }
        let r = try c.call("query.aggregate", params([
            "where": ["paid": true], "group": ["city"],
            "aggregates": ["n": ["$count": [:]], "total": ["$sum": "amount"], "top": ["$max": "amount"], "mean": ["$avg": "amount"]],
        ]))
        #expect(r == [
            "groups": [
                ["key": ["city": .null], "values": ["n": 1, "total": 1, "top": 1, "mean": .double(1)]],
                ["key": ["city": "Oslo"], "values": ["n": 2, "total": 30, "top": 20, "mean": .double(15)]],
            ],
            "truncated": false,
        ])
        let everything = try c.call("query.aggregate", params(["aggregates": ["n": ["$count": true]]]))
        #expect(everything == ["groups": [["key": [:], "values": ["n": 4]]], "truncated": false])
        let limited = try c.call("query.aggregate", params(["group": ["city"], "aggregates": ["n": ["$count": [:]]], "limit": 1]))
        #expect(limited["truncated"] == true && limited["groups"]?.arrayValue?.count == 1)
        #expect(try c.call("query.aggregate", ["db": "default", "collection": "later", "group": ["x"], "aggregates": ["n": ["$count": [:]]]])
            == ["groups": [], "truncated": false])
        let count: JSONValue = ["n": ["$count": [:]]]
        expectRPCError(c, "query.aggregate", base, code: -32602, kind: "invalid_params")
        expectRPCError(c, "query.aggregate", params(["aggregates": [:]]), code: -32602, kind: "invalid_aggregate")
        expectRPCError(c, "query.aggregate", params(["aggregates": ["n": 5]]), code: -32602)
        expectRPCError(c, "query.aggregate", params(["aggregates": ["n": ["$median": "amount"]]]), code: -32602, kind: "invalid_aggregate")
        expectRPCError(c, "query.aggregate", params(["aggregates": ["n": ["$sum": 3]]]), code: -32602, kind: "invalid_aggregate")
        expectRPCError(c, "query.aggregate", params(["aggregates": ["n": ["$sum": "a..b"]]]), code: -32602, kind: "invalid_path")
        expectRPCError(c, "query.aggregate", params(["aggregates": count, "group": "city"]), code: -32602)
        expectRPCError(c, "query.aggregate", params(["aggregates": count, "group": ["city", "city"]]), code: -32602, kind: "invalid_aggregate")
        expectRPCError(c, "query.aggregate", params(["aggregates": count, "where": ["a": ["$bad": 1]]]), code: -32602, kind: "invalid_filter")
        expectRPCError(c, "query.aggregate", params(["aggregates": count, "limit": 0]), code: -32012, kind: "limit_out_of_range")
        expectRPCError(c, "query.aggregate", params(["aggregates": count, "limit": "1"]), code: -32602)
        expectRPCError(c, "query.aggregate", params(["aggregates": count, "db": "nope"]), code: -32010, kind: "database_not_found")
        expectRPCError(c, "query.aggregate", params(["aggregates": count, "collection": "a b"]), code: -32602, kind: "invalid_name")
        let many = JSONValue.object(Dictionary(uniqueKeysWithValues: (0...32).map { ("a\($0)", count["n"]!) }))
        expectRPCError(c, "query.aggregate", params(["aggregates": many]), code: -32602, kind: "invalid_aggregate")
    }
}
