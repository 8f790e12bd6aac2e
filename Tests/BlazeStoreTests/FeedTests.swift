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

    /// A recorder attached to `db`'s live feed after its last change; nil, with an issue recorded, when it did not
    /// attach.
    static func attached(to db: BlazeDatabase, sourceLocation: SourceLocation = #_sourceLocation) -> FeedRecorder? {
        let rec = FeedRecorder()
        guard case .attached = db.feed.attach(after: db.feed.lastSequence, rec.listener) else {
            Issue.record("not attached", sourceLocation: sourceLocation)
            return nil
        }
        return rec
    }

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
        guard let rec = FeedRecorder.attached(to: db) else { return }
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

    /// Rows of reverse deltas replay exactly what was published, from any point and in pages of any size, with local
    /// and merged remote changes and compaction between them.
    @Test func replayEqualsWhatWasPublishedForRandomTransactions() throws {
        let seed = testSeed("feed replay")
        var rng = SeededRandom(seed: seed)
        let r = try StoreReplicas(2)
        let db = r.dbs[0]
        let rec = FeedRecorder()
        _ = db.feed.attach(after: 0, rec.listener)
        // "q\"k" needs an escape: its documents' updates keep the whole document before.
        let names = ["a", "b", "z", "é", "K", "\u{212A}", "q\"k"]
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
        var compactions = 0
        for _ in 0..<400 {
            switch Int.random(in: 0..<20, using: &rng) {
            case 0..<3:
                try r.sendMangled(from: 1, &rng)
                continue
            case 3:
                try r.send(0, 1)
                continue
            case 4:
                // What both replicas hold is stable between them.
                let (va, vb) = (try db.versionVector(), try r.dbs[1].versionVector())
                let both = VersionVector(Dictionary(uniqueKeysWithValues: va.entries.map { ($0.key, min($0.value, vb[$0.key])) }))
                try db.compact(stable: both, stepRows: Int.random(in: 1...50, using: &rng))
                compactions += 1
                continue
            default: break
            }
            let writer = r.dbs[Int.random(in: 0..<2, using: &rng)]
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
            _ = try? writer.commit(ops)
        }
        let live = rec.entries
        #expect(live.count > 50 && compactions > 0, "seed \(seed)")
        func check(_ replayed: [FeedEntry], from: Int) {
            #expect(replayed.map(\.seq) == live[from..<(from + replayed.count)].map(\.seq), "seed \(seed)")
            for (r, l) in zip(replayed, live[from...]) {
                #expect(r.origin == l.origin)
                #expect(r.events == l.events, "seed \(seed), entry \(l.seq)")
                for (re, le) in zip(r.events, l.events) {
                    #expect(re.after == le.after && re.before == le.before, "seed \(seed), entry \(l.seq)")
                }
            }
        }
        check(try db.feedEntries(after: 0, limit: 10_000, maxEvents: 100_000), from: 0)
        for _ in 0..<30 {
            let from = Int.random(in: 0..<live.count, using: &rng)
            let page = try db.feedEntries(
                after: from == 0 ? 0 : live[from - 1].seq, limit: Int.random(in: 1...40, using: &rng),
                maxEvents: Int.random(in: 1...60, using: &rng))
            #expect(!page.isEmpty)
            check(page, from: from)
        }
        // Remote changes were merged, and some updates kept the whole document (an escaped key).
        #expect(live.contains { $0.origin != live[0].origin }, "seed \(seed)")
        var whole = 0
        for text in try db.read({ try String.fetchAll($0, sql: "SELECT events FROM feed") }) {
            let events: [JSONValue] = try JSONParser().parse(text)["d"]?.arrayValue ?? []
            whole += events.filter { e in e["w"] != nil }.count
        }
        #expect(whole > 0, "seed \(seed)")
    }

    @Test func rowsHoldReverseDeltasNotDocumentCopies() throws {
        let t = try TempStore()
        let db = try t.store.create("f")
        let doc: [String: JSONValue] = ["_id": "a", "text": .string(String(repeating: "x", count: 1000)), "v": 1]
        _ = try db.apply(.insert(collection: "c", doc: doc))
        _ = try db.apply(.patch(collection: "c", id: "a", set: ["n": 1, "v": 2]))
        _ = try db.apply(.patch(collection: "c", id: "a", unset: ["n"]))
        _ = try db.apply(.put(collection: "c", id: "a", doc: ["text": "short"]))
        _ = try db.apply(.delete(collection: "c", id: "a"))
        let rows = try db.read { try String.fetchAll($0, sql: "SELECT events FROM feed ORDER BY seq") }
        // An insert holds no document; an update the earlier text of what it altered; a delete the document.
        #expect(rows[0] == #"{"d":[{"c":"c","i":"a"}]}"#)
        #expect(rows[1] == #"{"d":[{"n":["n"],"u":{"v":1},"c":"c","i":"a"}]}"#)
        #expect(rows[2] == #"{"d":[{"u":{"n":1},"c":"c","i":"a"}]}"#)
        #expect(rows[3].utf8.count > 1000 && rows[3].hasPrefix(#"{"d":[{"u":{"text":"xxx"#))
        #expect(rows[4].hasPrefix(#"{"d":[{"b":{"_id":"a","text":"short"}"#))
        // The database's own origin is written as "".
        #expect(try db.read { try String.fetchAll($0, sql: "SELECT DISTINCT origin FROM feed") } == [""])
        // Replayed from any point, every event has its documents back, walked from the current ones.
        let all = try db.feedEntries(after: 0)
        #expect(all.map { $0.events[0].type } == [.insert, .update, .update, .update, .delete])
        #expect(all.allSatisfy { $0.origin == db.node })
        #expect(all[0].events[0].afterText == JSONValue.object(doc).jsonText)
        #expect(all[1].events[0].after?["n"] == 1 && all[1].events[0].before?["v"] == 1 && all[1].events[0].after?["v"] == 2)
        #expect(all[2].events[0].after?["n"] == nil && all[2].events[0].before?["n"] == 1)
        #expect(all[3].events[0].after == ["_id": "a", "text": "short"])
        for page in 0..<5 {
            let one = try db.feedEntries(after: Int64(page), limit: 1)
            #expect(one.count == 1 && one[0].events == all[page].events)
        }
    }

    @Test func rowsOfEarlierVersionsStillReplayAndCorruptionIsReported() throws {
        let t = try TempStore()
        let db = try t.store.create("f")
        let doc: [String: JSONValue] = ["_id": "a", "v": 1]
        _ = try db.apply(.insert(collection: "c", doc: doc))
        _ = try db.apply(.patch(collection: "c", id: "a", set: ["v": 2]))
        // As earlier versions wrote them: pointing into the op log, and self-contained.
        try db.connections.write {
            try $0.execute(sql: #"UPDATE feed SET events = '{"e":[{"t":"insert","x":0}],"s":1}' WHERE seq = 1"#)
            try $0.execute(sql: #"UPDATE feed SET events = '[{"a":{"_id":"a","v":2},"b":{"_id":"a","v":1},"c":"c","i":"a","t":"update"}]' WHERE seq = 2"#)
        }
        let replayed = try db.feedEntries(after: 0)
        #expect(replayed[0].events[0].after == doc && replayed[1].events[0].after?["v"] == 2)
        // A pointer to an operation or change that is not there is corruption, not a silently empty event; so is a
        // delta that does not fit the document after it.
        let bad: [(Int64, String)] = [
            (1, #"{"e":[{"t":"insert","x":7}],"s":1}"#), (1, #"{"e":[{"t":"insert","x":0}],"s":99}"#),
            (1, #"{"e":[{"t":"update","x":0}],"s":1}"#), (1, #"{"e":[{"t":"delete","x":0}],"s":1}"#),
            (2, #"{"d":[{"c":"c","i":"a","b":{"_id":"a"}}]}"#), (2, #"{"d":[{"c":"c","i":"a","n":["v"]}]}"#),
            (2, #"{"d":[{"c":"c","i":"a","b":{"_id":"a"},"u":{}}]}"#), (2, #"{"d":[{"c":"c","i":"a","t":"update","u":{}}]}"#),
            (2, #"{"d":[{"c":"c","i":"b","u":{}}]}"#), (2, #"{"d":[{"c":"c","u":{}}]}"#),
            (2, #"{"d":[{"c":"c","i":"a","u":{},"n":[1]}]}"#), (2, #"{"d":[{"c":"c","i":"a","w":7}]}"#), (2, #"{"d":7}"#),
        ]
        let good = try db.read { try String.fetchAll($0, sql: "SELECT events FROM feed ORDER BY seq") }
        for (seq, text) in bad {
            try db.connections.write { try $0.execute(sql: "UPDATE feed SET events = ? WHERE seq = ?", arguments: [text, seq]) }
            expectStoreError("corrupt_feed") { _ = try db.feedEntries(after: 0) }
            try db.connections.write { try $0.execute(sql: "UPDATE feed SET events = ? WHERE seq = ?", arguments: [good[Int(seq) - 1], seq]) }
        }
        #expect(try db.feedEntries(after: 0).count == 2)
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

    static let pruneStep = FeedPruner.pruneStep

    /// The retention counts document events: bulk transactions go once newer events fill it,
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
        // Feed rows hold reverse deltas, not pointers into the op log: every stable change body goes.
        #expect(try db.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM changes") } == 0)
        #expect(try db.feedEntries(after: 303, limit: 1_000).count == 100)
        _ = try db.commit((0..<300).map { i in .insert(collection: "c", doc: ["_id": .string("big-\(i)")]) })
        _ = try db.compact(stable: try db.versionVector())
        let kept = try db.feedEntries(after: db.feed.floor, limit: 10, maxEvents: 10_000)
        #expect(kept.map(\.seq) == [404] && kept[0].events.count == 300)
        t.store.closeAll()
        let reopened = try Store(directory: t.dir, limits: limits, node: t.store.node).database("f")
        #expect(reopened.feed.floor == 403 && reopened.feed.lastSequence == 404)
    }

    /// The floor moves by whole feed rows, so a bulk change's row holds it until the retention has passed that row:
    /// the first search that finds nothing to prune records when one can, and none is tried before then.
    @Test func aBulkRowHoldsTheFloorUntilTheRetentionPassesIt() throws {
        var limits = StoreLimits()
        limits.feedRetention = 100
        let t = try TempStore(limits: limits)
        let db = try t.store.create("f")
        _ = try db.commit((0..<1000).map { i in .insert(collection: "c", doc: ["_id": .string("b\(i)")]) })
        for i in 0..<99 { _ = try db.apply(.put(collection: "c", id: "s\(i)", doc: [:])) }
        // 1,099 events: pruning was due (past the retention and a step) but the bulk row ends at 1,000 > 999.
        #expect(db.feed.floor == 0)
        #expect(db.feedPruner.pruneNotBefore == 1100)
        _ = try db.apply(.put(collection: "c", id: "s99", doc: [:]))
        #expect(db.feed.floor == 1)
        #expect(try db.feedEntries(after: 1, limit: 1_000).count == 100)
        // From then on single changes prune a step at a time, keeping the retention.
        for i in 100..<500 { _ = try db.apply(.put(collection: "c", id: "s\(i)", doc: [:])) }
        #expect(db.feed.floor >= 501 - 100 - ChangeFeedTests.pruneStep && db.feed.floor <= 401)
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
