import BlazeCRDT
import BlazeProtocol
import Testing

/// The rules of nested fields (Protocol/SYNC.md §2, "Nested fields"), one test per rule.
@Suite struct NestedFieldRules {
    @Test func concurrentEditsOfDifferentNestedFieldsBothSurvive() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["address": ["city": "Bergen", "zip": "5003"], "name": "x"])
        try t.sync()
        try t.patch(t.a, at: 20, set: ["address.city": "Oslo"])
        try t.patch(t.b, at: 21, set: ["address.zip": "0150"])
        try t.patch(t.c, at: 22, set: ["address.geo.lat": .double(59.9)])
        try t.sync()
        #expect(t.view() == ["_id": "d", "name": "x", "address": ["city": "Oslo", "zip": "0150", "geo": ["lat": .double(59.9)]]])
        #expect(!t.a.docs[t.key]!.hasConflicts)
    }

    @Test func theSameNestedFieldKeepsTheLaterWriteAndRecordsAConflict() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["address": ["city": "Bergen"]])
        try t.sync()
        try t.patch(t.a, at: 30, set: ["address.city": "Oslo"])
        try t.patch(t.b, at: 31, set: ["address.city": "Trondheim"])
        try t.sync()
        #expect(t.view()?["address"] == ["city": "Trondheim"])
        for r in [t.a, t.b, t.c] {
            let city = r.docs[t.key]!.fields["address.city"]!
            #expect(city.winner?.stamp.dot.origin == t.b.node)
            #expect(city.losers.map(\.value) == ["Oslo"] && city.losers.first?.stamp.dot.origin == t.a.node)
            #expect(r.docs[t.key]!.hasConflicts)
        }
        // A later write that saw both resolves it.
        try t.patch(t.c, at: 40, set: ["address.city": "Oslo"])
        try t.sync()
        #expect(t.view()?["address"] == ["city": "Oslo"] && !t.a.docs[t.key]!.hasConflicts)
    }

    @Test func countersAtNestedPathsAddUp() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["stats": ["views": 5, "label": "p"]])
        try t.sync()
        try t.patch(t.a, at: 20, incr: ["stats.views": 2])
        try t.patch(t.b, at: 21, incr: ["stats.views": 3])
        try t.patch(t.c, at: 22, incr: ["stats.likes": 1])
        try t.patch(t.c, at: 23, incr: ["totals.day.n": .double(0.5)])
        try t.sync()
        #expect(t.view() == ["_id": "d", "stats": ["views": 10, "likes": 1, "label": "p"], "totals": ["day": ["n": .double(0.5)]]])
    }

    @Test func aWriteOfTheWholeObjectHidesOlderNestedEditsNotNewerOnes() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["address": ["city": "Bergen"]])
        try t.sync()
        try t.patch(t.a, at: 20, set: ["address.zip": "5003"])  // older than B's object write: hidden
        try t.patch(t.b, at: 30, set: ["address": ["city": "Oslo"]])
        try t.patch(t.c, at: 40, set: ["address.street": "Storgata"])  // newer, concurrent: stays on top
        try t.sync()
        #expect(t.view()?["address"] == ["city": "Oslo", "street": "Storgata"])
        // The hidden edit's state is gone on every replica, whatever the order it arrived in.
        #expect([t.a, t.b, t.c].allSatisfy { $0.docs[t.key]!.fields["address.zip"] == nil })
    }

    @Test func aNestedWriteMakesItsPathAnObjectOnlyIfNewer() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["a": ["x": 1]])
        try t.sync()
        try t.patch(t.a, at: 20, set: ["a": 5])
        try t.patch(t.b, at: 30, set: ["a.y": 2])  // concurrent and newer: `a` becomes an object again
        try t.sync()
        #expect(t.view()?["a"] == ["y": 2])
        let u = Trio()
        try u.put(u.a, at: 10, ["a": ["x": 1]])
        try u.sync()
        try u.patch(u.a, at: 30, set: ["a": 5])
        try u.patch(u.b, at: 20, set: ["a.y": 2])  // concurrent and older: hidden
        try u.sync()
        #expect(u.view()?["a"] == 5)
    }

    @Test func unsetOfANestedFieldRemovesTheMemberOnly() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["a": ["x": 1, "y": 2], "b": "s"])
        try t.sync()
        try t.patch(t.a, at: 20, unset: ["a.y"])
        try t.patch(t.b, at: 21, unset: ["b.z"])  // through a non-object: nothing to remove, `b` stays
        try t.patch(t.c, at: 22, unset: ["m.n"])  // through a missing object: nothing is created
        try t.sync()
        #expect(t.view() == ["_id": "d", "a": ["x": 1], "b": "s"])
        try t.patch(t.a, at: 30, unset: ["a.x"])
        try t.sync()
        #expect(t.view()?["a"] == [:], "the object stays, empty")
    }

    @Test func nestedSetsRemoveOnlyObservedElements() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["p": ["tags": ["a", "b"]]])
        try t.sync()
        try t.patch(t.a, at: 20, remove: ["p.tags": ["a"]])
        try t.sync()
        #expect(t.view()?["p"] == ["tags": ["b"]])
        try t.patch(t.a, at: 30, remove: ["p.tags": ["b"]])
        try t.patch(t.b, at: 29, add: ["p.tags": ["b", "c"]])  // a concurrent re-add survives the remove
        try t.sync()
        #expect(t.view()?["p"] == ["tags": ["b", "c"]])
    }

    @Test func aPutStillReplacesTheWholeDocument() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["address": ["city": "Bergen"], "n": 1])
        try t.patch(t.a, at: 11, set: ["address.zip": "5003"])
        try t.sync()
        try t.put(t.b, at: 20, ["address": ["city": "Oslo"]])
        try t.patch(t.c, at: 15, set: ["address.street": "x"])  // concurrent, older than the put: hidden
        try t.sync()
        #expect(t.view() == ["_id": "d", "address": ["city": "Oslo"]])
    }

    @Test func deepPathsCreateTheirObjects() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["k": 1])
        try t.sync()
        try t.patch(t.a, at: 20, set: ["a.b.c.d": "deep"])
        try t.patch(t.b, at: 21, set: ["a.b.e": true])
        try t.sync()
        #expect(t.view() == ["_id": "d", "k": 1, "a": ["b": ["c": ["d": "deep"], "e": true]]])
    }

    @Test func aStableDocumentFoldsItsNestedFieldsIntoItsObjects() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["address": ["city": "Bergen", "zip": "5003"], "n": 1])
        try t.patch(t.a, at: 20, set: ["address.city": "Oslo"])
        try t.patch(t.a, at: 21, unset: ["address.zip"])
        try t.sync()
        let state = t.a.docs[t.key]!
        #expect(state.hasPaths)
        let folded = try #require(state.folded(stable: t.a.vv))
        #expect(!folded.hasPaths && folded.materialize(id: "d") == state.materialize(id: "d"))
        #expect(folded.compactText.utf8.count < state.compactText.utf8.count)
        // Not folded while a nested write is not stable.
        #expect(state.folded(stable: VersionVector()) == nil)
    }

    @Test func aStateWithNestedFieldsSurvivesItsStorageForm() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["o": ["x": 1]])
        try t.patch(t.a, at: 20, incr: ["o.n": 2], add: ["o.s": ["v"]])
        let state = t.a.docs[t.key]!
        let text = state.compactText
        #expect(text.contains(#""n":1"#) && text == state.compactJSON.jsonText)
        // Self-contained: it decodes without the body.
        let back = try DocumentState(compact: try JSONParser().parse(text), body: nil)
        #expect(back == state)
        // A self-contained state that also claims body-relative parts is refused.
        let forged = text.replacingOccurrences(of: #""n":1"#, with: #""n":1,"u":["z"]"#)
        #expect(throws: CRDTDecodingError.self) { try DocumentState(compact: try JSONParser().parse(forged), body: nil) }
    }
}
