import BlazeCRDT
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Synchronization
import Testing

@testable import BlazeStore

/// Collects what a feed listener receives.
final class FeedRecorder: Sendable {
    let signals = Mutex<[FeedSignal]>([])

    var listener: ChangeFeed.Listener { { [self] s in signals.withLock { $0.append(s) } } }

    var entries: [FeedEntry] {
        signals.withLock { $0.flatMap { s -> [FeedEntry] in if case .entries(let e) = s { e } else { [] } } }
    }
}

/// "type collection/id" for each event of each entry, one string per entry.
func summary(_ entries: [FeedEntry]) -> [String] {
    entries.map { $0.events.map { "\($0.type.rawValue) \($0.collection)/\($0.id)" }.joined(separator: ", ") }
}

@Suite struct ChangeFeedTests {
    @Test func everyWritePathAppendsOneEntryWithItsVisibleChanges() throws {
        let t = try TempStore()
        let db = try t.store.create("f")
        let rec = FeedRecorder()
        guard case .attached = db.feed.attach(after: db.feed.lastSequence, rec.listener) else {
            Issue.record("not attached")
            return
        }
        let start = db.feed.lastSequence
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "a", "n": 1]))
        _ = try db.apply(.put(collection: "c", id: "a", doc: ["n": 2]))
        _ = try db.apply(.put(collection: "c", id: "b", doc: ["n": 1]))
        _ = try db.apply(.patch(collection: "c", id: "a", set: ["x": "y"]))
        _ = try db.apply(.patch(collection: "c", id: "a", unset: ["x"]))
        _ = try db.apply(.patch(collection: "c", id: "a", incr: ["k": 5]))
        _ = try db.apply(.patch(collection: "c", id: "a", add: ["s": ["p", "q"]]))
        _ = try db.apply(.patch(collection: "c", id: "a", remove: ["s": ["p"]]))
        _ = try db.apply(.delete(collection: "c", id: "b"))
        _ = try db.commit([
            .insert(collection: "c", doc: ["_id": "t1"]), .patch(collection: "c", id: "t1", set: ["v": true]),
            .put(collection: "d", id: "t2", doc: [:]), .insert(collection: "c", doc: ["_id": "gone"]),
            .delete(collection: "c", id: "gone"),
        ])
        _ = try db.write { try $0.createIndex(collection: "c", fields: ["n"], name: nil) }
        _ = try db.apply(.put(collection: "c", id: "a", doc: try db.get(collection: "c", id: "a").objectValue!))
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "b", "again": true]))

        let expected = [
            "insert c/a", "update c/a", "insert c/b", "update c/a", "update c/a", "update c/a", "update c/a",
            "update c/a", "delete c/b", "insert c/t1, insert d/t2", "", "", "insert c/b",
        ]
        #expect(summary(rec.entries) == expected)
        #expect(rec.entries.map(\.seq) == Array((start + 1)...(start + Int64(expected.count))))
        #expect(rec.entries.allSatisfy { $0.origin == db.node })
        // Documents after and before each change.
        let e = rec.entries
        #expect(e[0].events[0].after == ["_id": "a", "n": 1] && e[0].events[0].before == nil)
        #expect(e[1].events[0].before == ["_id": "a", "n": 1] && e[1].events[0].after == ["_id": "a", "n": 2])
        #expect(e[5].events[0].after?["k"] == 5)
        #expect(e[7].events[0].after?["s"] == ["q"])
        #expect(e[8].events[0].after == nil && e[8].events[0].before == ["_id": "b", "n": 1])
        #expect(e[9].events[0].after == ["_id": "t1", "v": true])
        #expect(e[0].events[0].afterText == #"{"_id":"a","n":1}"#)

        // The durable feed holds exactly what was published, and replays from any point.
        let replayed = try db.feedEntries(after: start, limit: 1000)
        #expect(summary(replayed) == expected)
        #expect(replayed.map(\.seq) == e.map(\.seq))
        for (r, l) in zip(replayed, e) { #expect(r.events == l.events) }
        #expect(summary(try db.feedEntries(after: start + 9, limit: 1000)) == Array(expected.dropFirst(9)))
        #expect(try db.feedEntries(after: db.feed.lastSequence).isEmpty)
    }

    @Test func failedWritesLeaveNoEntryAndNoGap() throws {
        let t = try TempStore()
        let db = try t.store.create("f")
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "a"]))
        let before = db.feed.lastSequence
        expectStoreError("document_exists") { _ = try db.apply(.insert(collection: "c", doc: ["_id": "a"])) }
        expectStoreError("document_not_found") {
            _ = try db.commit([.insert(collection: "c", doc: ["_id": "z"]), .delete(collection: "c", id: "nope")])
        }
        #expect(db.feed.lastSequence == before)
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "b"]))
        #expect(try db.feedEntries(after: before).map(\.seq) == [before + 1])
    }

    @Test func feedEntriesPageByChangesAndEvents() throws {
        let t = try TempStore()
        let db = try t.store.create("f")
        for i in 0..<10 {
            _ = try db.commit((0..<5).map { j in .insert(collection: "c", doc: ["_id": .string("\(i)-\(j)")]) })
        }
        #expect(try db.feedEntries(after: 0, limit: 3).map(\.seq) == [1, 2, 3])
        #expect(try db.feedEntries(after: 0, limit: 100, maxEvents: 12).map(\.seq) == [1, 2, 3])
        #expect(try db.feedEntries(after: 9, limit: 100, maxEvents: 1).map(\.seq) == [10])
    }

    @Test func remoteChangesGetLocalSequencesAndTheirOrigin() throws {
        let r = try StoreReplicas(2)
        let (a, b) = (r.dbs[0], r.dbs[1])
        _ = try a.apply(.insert(collection: "c", doc: ["_id": "x", "v": 1]))
        _ = try a.apply(.patch(collection: "c", id: "x", set: ["v": 2]))
        _ = try a.apply(.delete(collection: "c", id: "x"))
        _ = try b.apply(.insert(collection: "c", doc: ["_id": "local"]))
        let rec = FeedRecorder()
        _ = b.feed.attach(after: b.feed.lastSequence, rec.listener)
        // One receive transaction applies three changes to the same document: three entries, each with its own
        // before and after.
        try r.send(0, 1)
        #expect(summary(rec.entries) == ["insert c/x", "update c/x", "delete c/x"])
        #expect(rec.entries.map(\.seq) == [2, 3, 4])
        #expect(rec.entries.allSatisfy { $0.origin == a.node })
        #expect(rec.entries[1].events[0].before?["v"] == 1 && rec.entries[1].events[0].after?["v"] == 2)
        // Duplicates apply nothing and add nothing to the feed.
        try r.send(0, 1)
        #expect(b.feed.lastSequence == 4)
        #expect(summary(try b.feedEntries(after: 1)) == ["insert c/x", "update c/x", "delete c/x"])
    }

    /// Feed rows that point into the op log instead of holding the documents replay exactly what was published.
    @Test func replayEqualsWhatWasPublishedForRandomTransactions() throws {
        let seed = testSeed("feed replay")
        var rng = SeededRandom(seed: seed)
        let t = try TempStore()
        let db = try t.store.create("f")
        let rec = FeedRecorder()
        _ = db.feed.attach(after: 0, rec.listener)
        let names = ["a", "b", "z", "_x", "é", "K", "\u{212A}"].filter { !$0.hasPrefix("_") }
        func value() -> JSONValue {
            switch Int.random(in: 0..<5, using: &rng) {
            case 0: .int(Int64.random(in: -5...5, using: &rng))
            case 1: .double([-0.0, 0.5, 1e300, Double.leastNonzeroMagnitude].randomElement(using: &rng)!)
            case 2: .string(["", "e\u{301}", "é", "x"].randomElement(using: &rng)!)
            case 3: .array([.null, .bool(true)])
            default: .object(["k": .int(1), "_id": "inner"])
            }
        }
        func fields() -> [String: JSONValue] {
            var d: [String: JSONValue] = [:]
            for _ in 0..<Int.random(in: 0...3, using: &rng) { d[names.randomElement(using: &rng)!] = value() }
            return d
        }
        for _ in 0..<400 {
            var ops: [WriteOp] = []
            for _ in 0..<Int.random(in: 1...3, using: &rng) {
                let id = "d\(Int.random(in: 0..<4, using: &rng))"
                switch Int.random(in: 0..<7, using: &rng) {
                case 0: ops.append(.insert(collection: "c", doc: fields().merging(["_id": .string(id)]) { $1 }))
                case 1: ops.append(.put(collection: "c", id: id, doc: fields()))
                case 2: ops.append(.patch(collection: "c", id: id, set: fields().isEmpty ? ["a": 1] : fields()))
                case 3: ops.append(.patch(collection: "c", id: id, unset: [names.randomElement(using: &rng)!]))
                case 4: ops.append(.patch(collection: "c", id: id, incr: ["n": 1]))
                case 5: ops.append(.delete(collection: "c", id: id))
                default: ops.append(.insert(collection: "c", doc: fields()))
                }
            }
            _ = try? db.commit(ops)
        }
        let live = rec.entries
        #expect(live.count > 50, "seed \(seed)")
        let replayed = try db.feedEntries(after: 0, limit: 10_000, maxEvents: 100_000)
        #expect(replayed.map(\.seq) == live.map(\.seq), "seed \(seed)")
        for (r, l) in zip(replayed, live) {
            #expect(r.origin == l.origin)
            #expect(r.events == l.events, "seed \(seed), entry \(l.seq)")
            for (re, le) in zip(r.events, l.events) {
                #expect(re.after == le.after && re.before == le.before, "seed \(seed), entry \(l.seq)")
            }
        }
        // Some rows did point into the op log (a fresh insert, or a plain patch, in every few transactions).
        let pointing = try db.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM feed WHERE events LIKE '{%'") }
        #expect((pointing ?? 0) > 10, "seed \(seed)")
    }

    @Test func pointingRowsHoldNoDocumentCopyAndRefuseBadPointers() throws {
        let t = try TempStore()
        let db = try t.store.create("f")
        let doc: [String: JSONValue] = ["_id": "a", "text": .string(String(repeating: "x", count: 1000))]
        _ = try db.apply(.insert(collection: "c", doc: doc))
        _ = try db.apply(.patch(collection: "c", id: "a", set: ["n": 1]))
        let rows = try db.read { try String.fetchAll($0, sql: "SELECT events FROM feed ORDER BY seq") }
        #expect(rows[0] == #"{"e":[{"t":"insert","x":0}],"s":1}"#)
        // The update keeps the document before (1,000 bytes and more) and points at the patch for the after.
        #expect(rows[1].utf8.count < 1100 && rows[1].hasPrefix(#"{"e":[{"b":{"#) && rows[1].hasSuffix(#","t":"update","x":0}],"s":2}"#))
        let replayed = try db.feedEntries(after: 0)
        #expect(replayed[0].events[0].afterText == JSONValue.object(doc).jsonText)
        #expect(replayed[1].events[0].after?["n"] == 1 && replayed[1].events[0].before?["n"] == nil)
        // A pointer to an operation or change that is not there is corruption, not a silently empty event.
        for bad in [#"{"e":[{"t":"insert","x":7}],"s":1}"#, #"{"e":[{"t":"insert","x":0}],"s":99}"#,
            #"{"e":[{"t":"update","x":0}],"s":1}"#, #"{"e":[{"t":"delete","x":0}],"s":1}"#]
        {
            try db.pool.write { try $0.execute(sql: "UPDATE feed SET events = ? WHERE seq = 1", arguments: [bad]) }
            expectStoreError("corrupt_feed") { _ = try db.feedEntries(after: 0) }
        }
    }

    @Test func sequencesSurviveReopenAndPruningKeepsTheRetention() throws {
        var limits = StoreLimits()
        limits.feedRetention = 10
        let t = try TempStore(limits: limits)
        let db = try t.store.create("f")
        for i in 0..<300 { _ = try db.apply(.put(collection: "c", id: "d\(i % 7)", doc: ["i": .int(Int64(i))])) }
        #expect(db.feed.lastSequence == 300)
        #expect(db.feed.floor >= 300 - 10 - ChangeFeedTests.pruneStep && db.feed.floor <= 290)
        expectStoreError("feed_expired") { _ = try db.feedEntries(after: 0) }
        expectStoreError("since_in_future") { _ = try db.feedEntries(after: 301) }
        let kept = try db.feedEntries(after: db.feed.floor, limit: 10_000)
        #expect(kept.map(\.seq) == Array((db.feed.floor + 1)...300))

        let floor = db.feed.floor
        try db.close()
        let store2 = try Store(directory: t.dir, limits: limits, node: t.store.node)
        let reopened = try store2.database("f")
        #expect(reopened.feed.lastSequence == 300 && reopened.feed.floor == floor)
        _ = try reopened.apply(.delete(collection: "c", id: "d0"))
        #expect(summary(try reopened.feedEntries(after: 300)) == ["delete c/d0"])
        #expect(try reopened.feedEntries(after: 300).first?.seq == 301)
        store2.closeAll()
    }

    static let pruneStep = BlazeDatabase.pruneStep

    /// The retention counts document events: bulk transactions go once newer events fill it (their op log with them),
    /// and a change larger than the whole retention is still kept whole while it is the last.
    @Test func retentionCountsDocumentEventsNotChanges() throws {
        var limits = StoreLimits()
        limits.feedRetention = 100
        let t = try TempStore(limits: limits)
        let db = try t.store.create("f")
        for chunk in 0..<3 {
            _ = try db.commit((0..<200).map { i in .insert(collection: "c", doc: ["_id": .string("b\(chunk)-\(i)")]) })
        }
        for i in 0..<400 { _ = try db.apply(.put(collection: "c", id: "s\(i)", doc: ["i": .int(Int64(i))])) }
        #expect(db.feed.lastSequence == 403)
        // At most the retention plus one pruning step of events is kept, and the bulk changes are gone.
        #expect(db.feed.floor >= 403 - 100 - ChangeFeedTests.pruneStep && db.feed.floor <= 303)
        expectStoreError("feed_expired") { _ = try db.feedEntries(after: 3) }
        _ = try db.compact(stable: try db.versionVector())
        #expect(db.feed.floor == 303)
        #expect(try db.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM changes") } == 100)
        _ = try db.commit((0..<300).map { i in .insert(collection: "c", doc: ["_id": .string("big-\(i)")]) })
        _ = try db.compact(stable: try db.versionVector())
        let kept = try db.feedEntries(after: db.feed.floor, limit: 10, maxEvents: 10_000)
        #expect(kept.map(\.seq) == [404] && kept[0].events.count == 300)
        t.store.closeAll()
        let reopened = try Store(directory: t.dir, limits: limits, node: t.store.node).database("f")
        #expect(reopened.feed.floor == 403 && reopened.feed.lastSequence == 404)
    }

    @Test func droppingTheDatabaseEndsItsFeed() throws {
        let t = try TempStore()
        let db = try t.store.create("f")
        let rec = FeedRecorder()
        _ = db.feed.attach(after: 0, rec.listener)
        try t.store.drop("f")
        let last = rec.signals.withLock { $0.last }
        guard case .ended(let e)? = last else {
            Issue.record("expected the feed to end, got \(String(describing: last))")
            return
        }
        #expect(e.kind == "database_dropped")
        #expect(db.feed.attach(after: 0, rec.listener) == .ended(e))
    }

    @Test func attachIsRefusedWhileBehindAndDetachStopsDelivery() throws {
        let t = try TempStore()
        let db = try t.store.create("f")
        _ = try db.apply(.insert(collection: "c", doc: [:]))
        let rec = FeedRecorder()
        #expect(db.feed.attach(after: 0, rec.listener) == .behind)
        guard case .attached(let token) = db.feed.attach(after: 1, rec.listener) else {
            Issue.record("not attached")
            return
        }
        _ = try db.apply(.insert(collection: "c", doc: [:]))
        db.feed.detach(token)
        _ = try db.apply(.insert(collection: "c", doc: [:]))
        #expect(rec.entries.map(\.seq) == [2])
        #expect(db.feed.listenerCount == 0)
    }
}
