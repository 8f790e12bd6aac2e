// Backpressure on subscriptions: a subscriber that never reads is dropped while memory stays bounded and other
// clients are served. The subscription helpers are in SubscriptionTests.swift.

import BlazeProtocol
import Foundation
import Synchronization
import Testing

@Suite struct SubscriptionBackpressure {
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
