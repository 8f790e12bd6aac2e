import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import GRDB
import Synchronization
import Testing

@testable import BlazeDaemon

#if canImport(Glibc)
import Glibc
#endif

@Suite struct RequestOrdering {
    /// Requests that run inline (reads) and on the I/O pool (writes) are answered in the order they were sent.
    @Test func pipelinedRequestsAreAnsweredInOrder() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        var batch: [UInt8] = []
        for i in 0..<200 {
            let method = i % 3 == 0 ? "doc.put" : (i % 3 == 1 ? "doc.get" : "db.list")
            let params: [String: JSONValue] =
                method == "doc.put"
                ? ["db": "default", "collection": "p", "id": .string("k\(i)"), "doc": ["i": .int(Int64(i))]]
                : method == "doc.get" ? ["db": "default", "collection": "p", "id": .string("k\(i - 1)")] : [:]
            batch += RPCRequest(id: .int(Int64(i)), method: method, params: params).jsonValue.jsonBytes + [0x0A]
        }
        try c.send(batch)
        for i in 0..<200 {
            let reply = try c.readMessage()
            #expect(reply["id"] == .int(Int64(i)), "reply \(i) out of order: \(reply.jsonText)")
            if i % 3 == 1 {
                #expect(reply["result"]?["doc"]?["i"] == .int(Int64(i - 1)), "a read sees the write sent before it")
            }
        }
        d.stop()
    }

    /// Queries start on the event loop within a budget; one that scans too much moves to the I/O pool and is still
    /// answered in order, with every result, among reads and writes pipelined around it.
    @Test func aQueryTooLongForTheEventLoopIsAnsweredInOrderFromThePool() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        for chunk in 0..<2 {
            let ops: [JSONValue] = (0..<5000).map { i in
                ["op": "insert", "collection": "big", "doc": ["_id": .string("d\(chunk)-\(i)"), "n": .int(Int64(chunk * 5000 + i))]]
            }
            _ = try c.call("tx.commit", ["db": "default", "ops": .array(ops)])
        }
        var lines: [UInt8] = []
        let requests: [(String, [String: JSONValue])] = [
            ("query.find", ["db": "default", "collection": "big", "where": ["n": 9999]]),
            ("doc.put", ["db": "default", "collection": "big", "id": "late", "doc": ["n": 9999]]),
            ("query.count", ["db": "default", "collection": "big", "where": ["n": 9999]]),
            ("query.find", ["db": "default", "collection": "big", "where": ["n": ["$gte": 9998]], "sort": "-n", "limit": 2]),
            ("doc.get", ["db": "default", "collection": "big", "id": "d0-3"]),
        ]
        for (i, (method, params)) in requests.enumerated() {
            lines += RPCRequest(id: .int(Int64(i)), method: method, params: params).jsonValue.jsonBytes + [0x0A]
        }
        try c.send(lines)
        let replies = try (0..<requests.count).map { _ in try c.readMessage() }
        #expect(replies.map { $0["id"] } == (0..<requests.count).map { .int(Int64($0)) })
        #expect(replies[0]["result"]?["docs"] == [["_id": "d1-4999", "n": 9999]])
        #expect(replies[2]["result"] == ["count": 2], "the count sees the write acknowledged before it")
        #expect(replies[3]["result"]?["docs"]?.arrayValue?.map { $0["n"] } == [.int(9999), .int(9999)])
        #expect(replies[4]["result"]?["doc"] == ["_id": "d0-3", "n": 3])
        d.stop()
    }

    /// A client that half-closes after sending still gets every answer, then end of stream.
    @Test func halfClosedClientGetsEveryAnswer() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        var batch: [UInt8] = []
        for i in 0..<20 {
            let method = i % 2 == 0 ? "doc.insert" : "query.count"
            let params: [String: JSONValue] =
                method == "doc.insert"
                ? ["db": "default", "collection": "h", "doc": ["_id": .string("h\(i)")]]
                : ["db": "default", "collection": "h"]
            batch += RPCRequest(id: .int(Int64(i)), method: method, params: params).jsonValue.jsonBytes + [0x0A]
        }
        try c.send(batch)
        c.shutdownWrite()
        for i in 0..<20 {
            let reply = try c.readMessage()
            #expect(reply["id"] == .int(Int64(i)))
            if i % 2 == 1 { #expect(reply["result"]?["count"] == .int(Int64((i + 1) / 2))) }
        }
        #expect(try c.readLine() == nil)
        d.stop()
    }
}
