import BlazeClient
import BlazeProtocol
import BlazeStore
import BlazeTestSupport
import Foundation
import Synchronization
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

    /// Live queries against a model: 1,200 random writes, several filters at once; every event must be exactly the
    /// transition the model predicts, and the members it implies must equal `query.find` at the end.
    @Test func liveQueriesReportEnterAndLeaveLikeTheReference() throws {
        let seed = testSeed("live query")
        var rng = SeededRandom(seed: seed)
        let d = try DaemonProcess()
        let c = try d.connect()
        let w = try d.connect()
        let filters: [JSONValue] = [
            ["a": ["$gt": 4]], ["b": "x"], ["$or": [["c": true], ["a": ["$lt": 2]]]], ["tags": ["$contains": "red"]],
            ["c": ["$exists": false], "b": ["$in": ["y", "z"]]], [:],
        ]
        var subs: [String] = []
        for f in filters { subs.append(try subscribe(c, ["db": "default", "collection": "t", "where": f]).id) }
        let parsed = try filters.map { try Filter.parse($0) }

        func randomFields() -> [String: JSONValue] {
            var doc: [String: JSONValue] = [:]
            if Bool.random(using: &rng) { doc["a"] = .int(Int64.random(in: 0...9, using: &rng)) }
            if Bool.random(using: &rng) { doc["b"] = .string(["x", "y", "z"].randomElement(using: &rng)!) }
            if Bool.random(using: &rng) { doc["c"] = .bool(Bool.random(using: &rng)) }
            if Bool.random(using: &rng) {
                doc["tags"] = .array((0..<Int.random(in: 0...2, using: &rng)).map { _ in .string(["red", "blue"].randomElement(using: &rng)!) })
            }
            return doc
        }
        var model: [String: [String: JSONValue]] = [:]
        var expected: [[String]] = Array(repeating: [], count: filters.count)
        for step in 0..<1200 {
            let id = "d\(Int.random(in: 0..<40, using: &rng))"
            let before = model[id]
            let kind = Int.random(in: 0..<10, using: &rng)
            var params: [String: JSONValue] = ["db": "default", "collection": "t", "id": .string(id)]
            let method: String
            if before == nil || kind < 4 {
                method = "doc.put"
                let fields = randomFields()
                params["doc"] = .object(fields)
                model[id] = fields.merging(["_id": .string(id)]) { $1 }
            } else if kind < 8 {
                method = "doc.patch"
                var set = randomFields()
                if set.isEmpty { set["a"] = 3 }
                params["set"] = .object(set)
                let unset = ["a", "b", "c", "tags"].filter { set[$0] == nil && Int.random(in: 0..<3, using: &rng) == 0 }
                if !unset.isEmpty { params["unset"] = .array(unset.map(JSONValue.string)) }
                var doc = before!.merging(set) { $1 }
                for f in unset { doc.removeValue(forKey: f) }
                model[id] = doc
            } else {
                method = "doc.delete"
                model[id] = nil
            }
            _ = try w.call(method, params)
            let after = model[id]
            let seq = step + 1
            for (i, f) in parsed.enumerated() {
                let was = before.map(f.matches) ?? false
                let isNow = after.map(f.matches) ?? false
                let type: String
                switch (was, isNow) {
                case (false, true): type = before == nil ? "insert" : "enter"
                case (true, true):
                    if before == after { continue }
                    type = "update"
                case (true, false): type = after == nil ? "delete" : "leave"
                case (false, false): continue
                }
                expected[i].append("\(seq) \(type) t/\(id) \((after ?? [:]).isEmpty ? "-" : JSONValue.object(after!).jsonText)")
            }
        }
        for (i, sub) in subs.enumerated() {
            let events = try readEvents(c, sub, count: expected[i].count)
            let got = events.map { e in
                "\(e["seq"]?.intValue ?? -1) \(e["type"]?.stringValue ?? "?") t/\(e["id"]?.stringValue ?? "?") \(e["type"] == "delete" ? "-" : e["doc"]?.jsonText ?? "missing")"
            }
            #expect(got == expected[i], "filter \(filters[i].jsonText) (seed \(seed), replay with BLAZE_SEED=\(seed))")
            // Members implied by the events equal what the query engine answers now.
            var members = Set<String>()
            for e in events {
                let id = e["id"]?.stringValue ?? ""
                switch e["type"]?.stringValue {
                case "insert", "enter", "update": members.insert(id)
                default: members.remove(id)
                }
            }
            let found = try w.call("query.find", ["db": "default", "collection": "t", "where": filters[i], "limit": 1000])
            let ids = Set((found["docs"]?.arrayValue ?? []).compactMap { $0["_id"]?.stringValue })
            #expect(members == ids, "filter \(filters[i].jsonText) (seed \(seed))")
        }
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

    /// A subscriber that never reads while 100,000 documents are written: it is dropped with one final error, the
    /// daemon's memory stays bounded, and other clients (a reader and a fast subscriber) keep being served.
    @Test func aSubscriberThatNeverReadsIsDroppedAndMemoryStaysBounded() throws {
        let d = try DaemonProcess(arguments: ["--max-subscriber-backlog-bytes", "1048576"])
        let slow = try d.connect()
        let (slowSub, _) = try subscribe(slow, ["db": "default", "collection": "t"])
        _ = try slow.call("doc.put", ["db": "default", "collection": "probe", "id": "p", "doc": ["ok": true]])
        let total = 100_000
        let batch = 500

        let fastCount = Mutex(0)
        let subscribed = DispatchSemaphore(value: 0)
        let fastReader = Thread {
            do {
                let fast = try d.connect()
                let (fastSub, _) = try subscribe(fast, ["db": "default", "collection": "t"])
                subscribed.signal()
                var n = 0
                var next: Int64 = 2
                while n < total {
                    let events = try readEvents(fast, fastSub, count: 1)
                    for e in events {
                        // Gap-free and in order: each tx.commit is one seq, batch events per seq.
                        #expect(e["seq"]?.intValue.map { $0 >= next - 1 && $0 <= next } == true)
                        next = (e["seq"]?.intValue ?? 0) + 1
                    }
                    n += events.count
                }
                fastCount.withLock { $0 = n }
            } catch {
                Issue.record("fast subscriber: \(error)")
                subscribed.signal()
            }
        }
        fastReader.start()
        subscribed.wait()
        let rssBefore = d.rssKiB()
        let gets = Mutex<[Double]>([])
        let stop = Mutex(false)
        let otherClient = Thread {
            do {
                let r = try d.connect()
                while !stop.withLock({ $0 }) {
                    let start = ContinuousClock.now
                    let doc = try r.call("doc.get", ["db": "default", "collection": "probe", "id": "p"])["doc"]
                    let micros = Double((ContinuousClock.now - start).components.attoseconds) / 1e12
                        + Double((ContinuousClock.now - start).components.seconds) * 1e6
                    #expect(doc == ["_id": "p", "ok": true])
                    gets.withLock { $0.append(micros) }
                }
            } catch { Issue.record("other client: \(error)") }
        }
        otherClient.start()
        let w = try d.connect()
        var maxRSS = rssBefore
        for b in 0..<(total / batch) {
            _ = try w.call("tx.commit", ["db": "default", "ops": .array((0..<batch).map { j in
                ["op": "insert", "collection": "t", "doc": ["_id": .string("d\(b)-\(j)"), "pad": .string(String(repeating: "x", count: 200))]]
            })])
            maxRSS = max(maxRSS, d.rssKiB())
        }
        let latencies = gets.withLock { $0.sorted() }
        let getsDuringWrites = latencies.count
        stop.withLock { $0 = true }
        // The fast subscriber receives everything (bounded by the connection's read timeout).
        while fastCount.withLock({ $0 }) < total && !fastReader.isFinished { _ = try w.call("daemon.info") }
        let growthMiB = (maxRSS - rssBefore) / 1024
        let p50 = latencies.isEmpty ? 0 : latencies[latencies.count / 2]
        let p99 = latencies.isEmpty ? 0 : latencies[latencies.count * 99 / 100]
        print("slow subscriber: RSS before \(rssBefore / 1024) MiB, peak growth \(growthMiB) MiB; \(getsDuringWrites) doc.get "
            + "served during the writes, p50 \(Int(p50)) µs, p99 \(Int(p99)) µs (debug build; figures for the record, not asserted)")
        #expect(growthMiB < 32, "daemon RSS grew by \(growthMiB) MiB")
        #expect(getsDuringWrites > 0)

        // The slow one now reads: a gap-free prefix of the events, then exactly one final error.
        var slowEvents = 0
        var lastSeq: Int64 = 1
        var final: JSONValue?
        while final == nil {
            let n = try slow.nextNotification()
            if let err = n["params"]?["error"] {
                final = err
                break
            }
            for e in n["params"]?["events"]?.arrayValue ?? [] {
                let seq = e["seq"]?.intValue ?? 0
                #expect(seq == lastSeq || seq == lastSeq + 1)
                lastSeq = seq
                slowEvents += 1
            }
        }
        #expect(final?["data"]?["kind"] == "subscriber_too_slow")
        #expect(final?["code"] == .int(-32012))
        #expect(slowEvents < total)
        expectRPCError(slow, "unsubscribe", ["subscription": .string(slowSub)], code: -32010, kind: "subscription_not_found")
        #expect(fastCount.withLock { $0 } == total)
        d.stop()
    }
}
