import BlazeCRDT
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

@testable import BlazeStore

/// `doc.history` and `doc.get` with `at`: the changes that touched a document, and the document as it was.
@Suite struct DocumentHistoryTests {
    @Test func aHundredPatchesFromTwoDevicesAreListedInOrderAndEveryStateIsReproduced() throws {
        let ta = try TempStore(), tb = try TempStore()
        let a = try ta.store.create("db"), b = try tb.store.create("db")
        var rng = SeededRandom(seed: testSeed("history"))
        // What A held after each change it applied: its feed sequence and the document then.
        var recorded: [(seq: Int64, doc: JSONValue?)] = []
        func record() throws {
            recorded.append((a.feed.bounds.last, try? a.get(collection: "c", id: "d")))
        }
        let beforeInsert = a.feed.bounds.last
        _ = try a.apply(.insert(collection: "c", doc: ["_id": "d", "n": 0, "address": ["city": "Bergen"], "tags": ["x"]]))
        try record()
        _ = try a.apply(.insert(collection: "c", doc: ["_id": "other", "n": 1]))  // another document: not listed
        /// Delivers what `to` lacks from `from` one change at a time (A records each).
        func deliver(_ from: BlazeDatabase, _ to: BlazeDatabase) throws {
            for change in try from.changes(since: try to.versionVector()).sorted(by: { $0.seq < $1.seq }) {
                _ = try to.receive([change])
                if to === a { try record() }
            }
        }
        try deliver(a, b)
        var patches = 0
        while patches < 100 {
            let onA = Bool.random(using: &rng)
            let db = onA ? a : b
            let edit: WriteOp
            switch Int.random(in: 0..<5, using: &rng) {
            case 0: edit = .patch(collection: "c", id: "d", set: ["s": .string("v\(patches)")])
            case 1: edit = .patch(collection: "c", id: "d", incr: ["n": .int(Int64(patches))])
            case 2: edit = .patch(collection: "c", id: "d", set: ["address.city": .string("c\(patches)")], add: ["tags": [.int(Int64(patches))]])
            case 3: edit = .patch(collection: "c", id: "d", set: ["address.zip": .int(Int64(patches))], unset: ["s"])
            default: edit = .patch(collection: "c", id: "d", incr: ["address.visits": 1], remove: ["tags": ["x"]])
            }
            _ = try db.apply(edit)
            patches += 1
            if onA { try record() }
            if Int.random(in: 0..<4, using: &rng) == 0 { try deliver(b, a) }
            if Int.random(in: 0..<4, using: &rng) == 0 { try deliver(a, b) }
        }
        try deliver(b, a)
        #expect(recorded.count == 101, "the insert and every patch reached A")
        // The history lists them in the order A applied them, each with its origin and what changed.
        let history = try a.history(collection: "c", id: "d", limit: 1000)
        #expect(history.entries.map(\.seq) == recorded.map(\.seq) && history.next == nil && history.floor == 0)
        #expect(history.entries.first?.type == .insert)
        #expect(history.entries.dropFirst().allSatisfy { $0.type == .update || $0.type == .unchanged })
        #expect(Set(history.entries.map(\.origin)) == [a.node, b.node])
        #expect(history.entries.allSatisfy { $0.change != nil && $0.hlc != nil && $0.appliedAt != nil })
        // A change lists what it changed; one whose writes lost to concurrent ones changed nothing visible.
        for (i, e) in history.entries.enumerated() {
            let before = i == 0 ? nil : recorded[i - 1].doc
            #expect(e.changed.isEmpty == (before == recorded[i].doc), "entry \(i)")
            #expect((e.type == .unchanged) == (before == recorded[i].doc), "entry \(i)")
        }
        // A write of what is there already is listed too, as unchanged.
        let n = try #require(try a.get(collection: "c", id: "d")["n"])
        _ = try a.apply(.patch(collection: "c", id: "d", set: ["n": n]))
        let same = try a.history(collection: "c", id: "d", after: recorded.last!.seq).entries
        #expect(same.map(\.type) == [.unchanged] && same.first?.changed == [] && same.first?.origin == a.node)
        recorded.append((a.feed.bounds.last, try a.get(collection: "c", id: "d")))
        // Applied in a causal order: each origin's changes in sequence.
        for origin in [a.node, b.node] {
            let seqs = history.entries.filter { $0.origin == origin }.compactMap(\.change)
            #expect(seqs == seqs.sorted())
        }
        // Every intermediate state, exactly.
        for (seq, doc) in recorded {
            #expect(try a.get(collection: "c", id: "d", at: seq) == doc, "at \(seq)")
        }
        expectStoreError("document_not_found") { _ = try a.get(collection: "c", id: "d", at: beforeInsert) }
        #expect(try a.get(collection: "c", id: "d", at: recorded[50].seq, fields: [try FieldPath("n")]) == ["_id": "d", "n": recorded[50].doc?["n"] ?? .null])
        // Pages: 30 at a time, resuming after the cursor, give the same list.
        var paged: [Int64] = []
        var cursor: Int64 = 0
        while true {
            let page = try a.history(collection: "c", id: "d", after: cursor, limit: 30)
            paged += page.entries.map(\.seq)
            guard let next = page.next else { break }
            cursor = next
        }
        #expect(paged == recorded.map(\.seq))
        // What changed, for a known edit.
        _ = try a.apply(.patch(collection: "c", id: "d", set: ["address.city": "Oslo", "fresh": true]))
        let last = try #require(try a.history(collection: "c", id: "d", after: recorded.last!.seq).entries.first)
        #expect(last.changed == ["address.city", "fresh"] || last.changed == ["fresh"] && recorded.last?.doc?["address"]?["city"] == "Oslo")
        _ = try a.apply(.delete(collection: "c", id: "d"))
        let deleted = try a.history(collection: "c", id: "d", after: last.seq)
        #expect(deleted.entries.map(\.type) == [.delete])
        #expect(try a.get(collection: "c", id: "d", at: last.seq)["fresh"] == true)
        expectStoreError("document_not_found") { _ = try a.get(collection: "c", id: "d") }
        expectStoreError("at_in_future") { _ = try a.get(collection: "c", id: "d", at: a.feed.bounds.last + 1) }
        // Times: the state at a wall time is the one after the last change applied by then.
        let time = try #require(history.entries[40].appliedAt)
        let seqAtTime = try a.feedSequence(atTime: time)
        #expect(seqAtTime >= history.entries[40].seq)
        #expect(try a.feedSequence(atTime: 0) == 0)
    }

    @Test func historyBeforeTheFeedFloorIsGoneAndTheErrorSaysSo() throws {
        let t = try TempStore(limits: { var l = StoreLimits(); l.feedRetention = 10; return l }())
        let db = try t.store.create("db")
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "d", "n": 0]))
        for i in 1...40 { _ = try db.apply(.patch(collection: "c", id: "d", set: ["n": .int(Int64(i))])) }
        try db.trimFeed()
        let history = try db.history(collection: "c", id: "d", limit: 1000)
        #expect(history.floor == 31 && history.entries.count == 10 && history.entries.first?.seq == 32)
        do {
            _ = try db.get(collection: "c", id: "d", at: 5)
            Issue.record("a state before the floor was returned")
        } catch let e as StoreError {
            #expect(e.kind == "history_expired" && e.details["floor"] == 31 && e.message.contains("no longer kept"))
        }
        #expect(try db.get(collection: "c", id: "d", at: 31) == ["_id": "d", "n": 30])
        expectStoreError("history_expired") { _ = try db.feedSequence(atTime: 0) }
        expectStoreError("limit_out_of_range") { _ = try db.history(collection: "c", id: "d", limit: 0) }
        expectStoreError("invalid_cursor") { _ = try db.history(collection: "c", id: "d", after: -1) }
        expectStoreError("invalid_name") { _ = try db.history(collection: "a b", id: "d") }
        // A document never written has an empty history.
        #expect(try db.history(collection: "c", id: "nope").entries.isEmpty)
        #expect(try db.history(collection: "later", id: "nope").entries.isEmpty)
    }

    @Test func changedPathsRecurseIntoObjects() {
        let diff = BlazeDatabase.changedPaths(
            ["_id": "x", "a": ["b": 1, "c": 2], "d": 1, "e": [1]], ["_id": "x", "a": ["b": 1, "c": 3, "z": .null], "e": [2], "f": ["g": 1]])
        #expect(diff == ["a.c", "a.z", "d", "e", "f"])
        #expect(BlazeDatabase.changedPaths(nil, ["_id": "x", "k": 1]) == ["k"])
    }
}
