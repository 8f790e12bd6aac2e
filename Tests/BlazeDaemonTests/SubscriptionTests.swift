import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

/// Reads notifications of one subscription until `count` events arrived; records an issue if it ends instead.
/// Other subscriptions' notifications stay queued on the connection, in order.
func readEvents(_ c: BlazeConnection, _ sub: String, count: Int, sourceLocation: SourceLocation = #_sourceLocation)
    throws -> [JSONValue]
{
    var events: [JSONValue] = []
    var others: [JSONValue] = []
    defer { c.notifications = others + c.notifications }
    while events.count < count {
        let n = try c.nextNotification()
        #expect(n["method"] == "subscription", sourceLocation: sourceLocation)
        guard n["params"]?["subscription"] == .string(sub) else {
            others.append(n)
            continue
        }
        if let err = n["params"]?["error"] {
            Issue.record("subscription ended: \(err.jsonText)", sourceLocation: sourceLocation)
            break
        }
        events += n["params"]?["events"]?.arrayValue ?? []
    }
    return events
}

/// "seq type collection/id" of each event.
func lines(_ events: [JSONValue]) -> [String] {
    events.map { e in
        "\(e["seq"]?.intValue ?? -1) \(e["type"]?.stringValue ?? "?") \(e["collection"]?.stringValue ?? "?")/\(e["id"]?.stringValue ?? "?")"
    }
}

func subscribe(_ c: BlazeConnection, _ params: [String: JSONValue]) throws -> (id: String, seq: Int64) {
    let r = try c.call("subscribe", params)
    return (r["subscription"]?.stringValue ?? "", r["seq"]?.intValue ?? -1)
}

/// Polls `daemon.info` until `subscriptions` reaches `n` (bounded by a deadline).
func waitForSubscriptionCount(_ c: BlazeConnection, _ n: Int64, sourceLocation: SourceLocation = #_sourceLocation) throws {
    if try eventually(timeout: .seconds(20), { try c.call("daemon.info")["subscriptions"] == .int(n) }) { return }
    Issue.record("daemon.info never reported \(n) subscriptions", sourceLocation: sourceLocation)
}

@Suite struct Subscriptions {
    @Test func everyWritePathIsReportedInCommitOrderWithDocumentAndOrigin() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        let w = try d.connect()
        let node = try c.call("daemon.info")["nodeId"]
        let (sub, start) = try subscribe(c, ["db": "default"])
        let (onlyT, _) = try subscribe(c, ["db": "default", "collection": "t"])
        #expect(sub.hasPrefix("sub-") && start == 0)
        let scope: [String: JSONValue] = ["db": "default", "collection": "t"]
        func call(_ method: String, _ extra: [String: JSONValue]) throws {
            _ = try w.call(method, scope.merging(extra) { $1 })
        }
        try call("doc.insert", ["doc": ["_id": "a", "n": 1]])
        try call("doc.put", ["id": "a", "doc": ["n": 2]])
        try call("doc.patch", ["id": "a", "set": ["x": "y"], "unset": ["n"]])
        try call("doc.patch", ["id": "a", "incr": ["k": 2]])
        try call("doc.patch", ["id": "a", "add": ["s": ["p", "q"]]])
        try call("doc.patch", ["id": "a", "remove": ["s": ["p"]]])
        _ = try w.call("tx.commit", ["db": "default", "ops": [
            ["op": "insert", "collection": "t", "doc": ["_id": "b"]],
            ["op": "put", "collection": "u", "doc": ["_id": "c", "v": 1]],
            ["op": "patch", "collection": "t", "id": "a", "set": ["x": "z"]],
        ]])
        try call("doc.delete", ["id": "a"])
        try call("doc.insert", ["doc": ["_id": "a", "again": true]])

        let events = try readEvents(c, sub, count: 11)
        #expect(lines(events) == [
            "1 insert t/a", "2 update t/a", "3 update t/a", "4 update t/a", "5 update t/a", "6 update t/a",
            "7 insert t/b", "7 insert u/c", "7 update t/a", "8 delete t/a", "9 insert t/a",
        ])
        let docs = events.map { $0["doc"] }
        #expect(docs[0] == ["_id": "a", "n": 1])
        #expect(docs[2] == ["_id": "a", "x": "y"])
        #expect(docs[3] == ["_id": "a", "x": "y", "k": 2])
        #expect(docs[5] == ["_id": "a", "x": "y", "k": 2, "s": ["q"]])
        #expect(docs[9] == nil)
        #expect(docs[10] == ["_id": "a", "again": true])
        #expect(events.allSatisfy { $0["origin"] == node })
        // The collection-scoped subscription on the same connection saw the same changes minus collection u.
        #expect(lines(try readEvents(c, onlyT, count: 10)) == lines(events).filter { !$0.contains(" u/") })
        d.stop()
    }

    @Test func sinceResumesAcrossAReconnectWithExactlyTheMissedEvents() throws {
        let d = try DaemonProcess()
        let all = try d.connect()
        let (full, _) = try subscribe(all, ["db": "default", "collection": "t"])
        let w = try d.connect()
        func write(_ i: Int) throws {
            _ = try w.call("doc.put", ["db": "default", "collection": "t", "id": .string("d\(i % 13)"), "doc": ["i": .int(Int64(i))]])
        }
        var b = try d.connect()
        let (first, _) = try subscribe(b, ["db": "default", "collection": "t"])
        for i in 0..<40 { try write(i) }
        let seen = try readEvents(b, first, count: 25)
        b.close()
        let lastSeen = seen.last?["seq"]?.intValue ?? 0
        #expect(lastSeen == 25)
        for i in 40..<100 { try write(i) }

        // Resume while another writer keeps going: the replay must hand over to live delivery with no gap.
        let writer = Thread {
            do {
                let w2 = try d.connect()
                for i in 100..<400 {
                    _ = try w2.call("doc.put", ["db": "default", "collection": "t", "id": .string("d\(i % 13)"), "doc": ["i": .int(Int64(i))]])
                }
            } catch { Issue.record("writer: \(error)") }
        }
        writer.start()
        b = try d.connect()
        let (resumed, start) = try subscribe(b, ["db": "default", "collection": "t", "since": .int(lastSeen)])
        #expect(start == lastSeen)
        let missed = try readEvents(b, resumed, count: 400 - 25)
        let reference = try readEvents(all, full, count: 400)
        #expect(seen == Array(reference.prefix(25)))
        #expect(missed == Array(reference.dropFirst(25)))
        #expect(reference.map { $0["seq"]?.intValue ?? 0 } == Array(1...400))

        // since 0 replays the whole retained feed.
        let c = try d.connect()
        let (replay, _) = try subscribe(c, ["db": "default", "since": 0])
        #expect(try readEvents(c, replay, count: 400) == reference)
        d.stop()
    }

    @Test func subscribeInABatchIsAnsweredBeforeItsFirstEvent() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        try c.send(Array(#"""
            [{"jsonrpc":"2.0","id":1,"method":"subscribe","params":{"db":"default"}},{"jsonrpc":"2.0","id":2,"method":"doc.insert","params":{"db":"default","collection":"t","doc":{"_id":"x"}}}]

            """#.utf8))
        let first = try c.readMessage()
        #expect(first.arrayValue?.count == 2)
        let sub = first.arrayValue?.first?["result"]?["subscription"]?.stringValue ?? ""
        #expect(lines(try readEvents(c, sub, count: 1)) == ["1 insert t/x"])
        // A malformed line on a subscribed connection gets its error and the subscription keeps going.
        try c.send(Array("{nope\n".utf8))
        #expect(try c.readMessage()["error"]?["code"] == .int(-32700))
        _ = try d.connect().call("doc.delete", ["db": "default", "collection": "t", "id": "x"])
        #expect(lines(try readEvents(c, sub, count: 1)) == ["2 delete t/x"])
        d.stop()
    }

    @Test func manySubscribersOnOneAndOnManyConnections() throws {
        let d = try DaemonProcess()
        var connections: [(BlazeConnection, [String])] = []
        let crowded = try d.connect()
        connections.append((crowded, try (0..<50).map { _ in try subscribe(crowded, ["db": "default", "collection": "t"]).id }))
        for _ in 0..<10 {
            let c = try d.connect()
            connections.append((c, try (0..<5).map { _ in try subscribe(c, ["db": "default", "collection": "t"]).id }))
        }
        #expect(try crowded.call("daemon.info")["subscriptions"] == .int(100))
        let w = try d.connect()
        for i in 0..<100 {
            _ = try w.call("tx.commit", ["db": "default", "ops": .array((0..<3).map { j in
                ["op": "put", "collection": "t", "doc": ["_id": .string("d\(i)-\(j)")]]
            })])
        }
        let expected = (1...100).flatMap { i in (0..<3).map { j in "\(i) insert t/d\(i - 1)-\(j)" } }
        for (c, subs) in connections {
            for sub in subs { #expect(lines(try readEvents(c, sub, count: 300)) == expected) }
        }
        d.stop()
    }

    @Test func unsubscribeStopsEventsAndSubscriptionsEndWithTheirConnection() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        let w = try d.connect()
        let (a, _) = try subscribe(c, ["db": "default", "collection": "a"])
        let (b, _) = try subscribe(c, ["db": "default"])
        #expect(try c.call("unsubscribe", ["subscription": .string(a)]) == ["subscription": .string(a), "unsubscribed": true])
        expectRPCError(c, "unsubscribe", ["subscription": .string(a)], code: -32010, kind: "subscription_not_found")
        _ = try w.call("doc.insert", ["db": "default", "collection": "a", "doc": ["_id": "1"]])
        _ = try w.call("doc.insert", ["db": "default", "collection": "b", "doc": ["_id": "2"]])
        // Both changes reach b; nothing more arrives for a (b's events come after anything a could have had).
        var seen: [String] = []
        while seen.count < 2 {
            let n = try c.nextNotification()
            #expect(n["params"]?["subscription"] == .string(b))
            seen += lines(n["params"]?["events"]?.arrayValue ?? [])
        }
        #expect(seen == ["1 insert a/1", "2 insert b/2"])
        // Another connection cannot end them; closing the connection does.
        expectRPCError(w, "unsubscribe", ["subscription": .string(b)], code: -32010, kind: "subscription_not_found")
        #expect(try w.call("daemon.info")["subscriptions"] == .int(1))
        c.close()
        try waitForSubscriptionCount(w, 0)
        d.stop()
    }

    @Test func theIdleTimeoutSparesConnectionsThatHoldSubscriptions() throws {
        let d = try DaemonProcess(arguments: ["--idle-timeout", "1"])
        let watcher = try d.connect()
        let (sub, _) = try subscribe(watcher, ["db": "default"])
        // A silent connection without subscriptions, opened after the watcher, is closed by the timeout...
        let plain = try d.connect()
        _ = try plain.call("daemon.info")
        #expect(try plain.readLine() == nil)
        // ...while the watcher, silent for longer, still gets its events.
        _ = try d.connect().call("doc.insert", ["db": "default", "collection": "t", "doc": ["_id": "x"]])
        #expect(lines(try readEvents(watcher, sub, count: 1)) == ["1 insert t/x"])
        d.stop()
    }

    @Test func droppingTheDatabaseEndsItsSubscriptionsWithAFinalError() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        _ = try c.call("db.create", ["db": "x"])
        let (sub, _) = try subscribe(c, ["db": "x"])
        _ = try d.connect().call("db.drop", ["db": "x"])
        let n = try c.nextNotification()
        #expect(n["params"]?["subscription"] == .string(sub))
        #expect(n["params"]?["error"]?["code"] == .int(-32010))
        #expect(n["params"]?["error"]?["data"]?["kind"] == "database_dropped")
        expectRPCError(c, "unsubscribe", ["subscription": .string(sub)], code: -32010, kind: "subscription_not_found")
        d.stop()
    }

    @Test func badInputsGetClearErrors() throws {
        let d = try DaemonProcess(arguments: ["--max-subscriptions", "2", "--feed-retention", "5"])
        let c = try d.connect()
        let bad: [([String: JSONValue], Int, String)] = [
            ([:], -32602, "invalid_params"),
            (["db": 5], -32602, "invalid_params"),
            (["db": "nope"], -32010, "database_not_found"),
            (["db": "default", "collection": "bad name!"], -32602, "invalid_name"),
            (["db": "default", "collection": 3], -32602, "invalid_params"),
            (["db": "default", "where": ["a": ["$bogus": 1]]], -32602, "invalid_filter"),
            (["db": "default", "where": "a"], -32602, "invalid_params"),
            (["db": "default", "since": -1], -32602, "invalid_params"),
            (["db": "default", "since": "3"], -32602, "invalid_params"),
            (["db": "default", "since": 1.5], -32602, "invalid_params"),
            (["db": "default", "since": 99], -32602, "since_in_future"),
            (["db": "default", "extra": true], -32602, "invalid_params"),
        ]
        for (params, code, kind) in bad { expectRPCError(c, "subscribe", params, code: code, kind: kind) }
        expectRPCError(c, "unsubscribe", [:], code: -32602, kind: "invalid_params")
        expectRPCError(c, "unsubscribe", ["subscription": 1], code: -32602, kind: "invalid_params")
        expectRPCError(c, "unsubscribe", ["subscription": "sub-999999"], code: -32010, kind: "subscription_not_found")

        for i in 0..<300 { _ = try c.call("doc.put", ["db": "default", "collection": "t", "id": .string("d\(i)"), "doc": [:]]) }
        expectRPCError(c, "subscribe", ["db": "default", "since": 0], code: -32012, kind: "feed_expired")
        _ = try subscribe(c, ["db": "default", "since": 300])
        _ = try subscribe(c, ["db": "default"])
        expectRPCError(c, "subscribe", ["db": "default"], code: -32012, kind: "too_many_subscriptions")
        d.stop()
    }
}
