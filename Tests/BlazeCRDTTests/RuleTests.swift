import BlazeCRDT
import BlazeProtocol
import BlazeTestSupport
import Testing

/// Replicas with fixed ids A < B < C and controlled wall clocks, for pinning single rules of Protocol/SYNC.md.
final class Trio {
    let a = MemoryReplica(node: NodeID(hex: "0a" + String(repeating: "0", count: 30))!, skew: 0)
    let b = MemoryReplica(node: NodeID(hex: "0b" + String(repeating: "0", count: 30))!, skew: 0)
    let c = MemoryReplica(node: NodeID(hex: "0c" + String(repeating: "0", count: 30))!, skew: 0)
    let key = DocKey(collection: "c", id: "d")

    @discardableResult
    func write(_ r: MemoryReplica, at wall: UInt64, _ ops: (DocumentState?) -> [CRDTOp]) throws -> Change {
        try r.commit(wall: wall) { _, emit in for op in ops(r.docs[key]) { try emit(op) } }!
    }

    func put(_ r: MemoryReplica, at wall: UInt64, _ fields: [String: JSONValue]) throws {
        try write(r, at: wall) { [.doc(LocalEdit.replace(key, fields: fields, current: $0))] }
    }

    func patch(
        _ r: MemoryReplica, at wall: UInt64, set: [String: JSONValue] = [:], unset: [String] = [],
        incr: [String: JSONValue] = [:], add: [String: [JSONValue]] = [:], remove: [String: [JSONValue]] = [:]
    ) throws {
        try write(r, at: wall) { [.doc(LocalEdit.patch(key, current: $0, set: set, unset: unset, incr: incr, add: add, remove: remove)!)] }
    }

    func send(_ from: MemoryReplica, _ to: MemoryReplica) throws -> ReceiveReport {
        var clock = to.clock
        let report = try Replica.receive(from.changes(after: to.vv), into: to, clock: &clock, now: 0)
        to.clock = clock
        return report
    }

    /// Everyone gets everything.
    func sync() throws {
        for _ in 0..<2 { for x in [a, b, c] { for y in [a, b, c] where x !== y { _ = try send(x, y) } } }
    }

    func doc(_ r: MemoryReplica) -> [String: JSONValue]? { r.docs[key]?.materialize(id: key.id) }

    /// Converged view (asserting all three agree).
    func view(sourceLocation: SourceLocation = #_sourceLocation) -> [String: JSONValue]? {
        #expect(a.docs == b.docs && b.docs == c.docs, "replicas disagree", sourceLocation: sourceLocation)
        return doc(a)
    }
}

@Suite struct Rules {
    @Test func theVisibleTextIsTheMaterializedDocumentsCanonicalText() throws {
        // Names on both sides of "_id" in UTF-8 order ('A' < 'Z' < '^' < '_' < "_a" < 'a' < 'é'), a field named
        // "_id", removed fields (no value), a counter, a set, nested paths, a deleted document.
        let t = Trio()
        let names = ["A", "Z", "^", "_", "_a", "a", "é", "zz"]
        for (n, count) in [0, 1, 2, 5, names.count].enumerated() {
            let fields = Dictionary(uniqueKeysWithValues: names.prefix(count).enumerated().map { ($1, JSONValue.int(Int64($0))) })
            try t.put(t.a, at: UInt64(1_000 + 10 * n), fields)
            let state = try #require(t.a.docs[t.key])
            #expect(state.visibleText(id: "d") == state.materialize(id: "d").map { JSONValue.object($0).jsonText }, "\(count) fields")
        }
        try t.patch(t.a, at: 2_000, unset: ["a", "_"], incr: ["n": 3], add: ["s": ["x", 1]])
        try t.patch(t.a, at: 2_001, set: ["_id": "own", "m.k": 1])
        _ = try t.send(t.a, t.b)
        try t.patch(t.b, at: 2_002, set: ["Z": "b"])
        try t.patch(t.a, at: 2_002, set: ["Z": "a"])
        _ = try t.send(t.b, t.a)
        for state in [t.a.docs[t.key], t.b.docs[t.key]] {
            let state = try #require(state)
            #expect(state.visibleText(id: "d") == state.materialize(id: "d").map { JSONValue.object($0).jsonText })
            #expect(state.visibleText(id: "d") != nil)
        }
        var deleted = try #require(t.a.docs[t.key])
        deleted.delete(cl: deleted.cl + 2 - deleted.cl % 2)
        #expect(deleted.visibleText(id: "d") == nil)
    }

    @Test func clockIsMonotonicAndFollowsRemoteClocks() {
        var clock = HybridClock()
        let t1 = clock.tick(now: 1000)
        let t2 = clock.tick(now: 1000)
        let t3 = clock.tick(now: 999)
        #expect(t1 < t2 && t2 < t3 && t1.milliseconds == 1000)
        let nearSkewed = clock.observe(HLC(milliseconds: 50_000), now: 1000)
        let afterNear = clock.tick(now: 1000)
        #expect(!nearSkewed && afterNear > HLC(milliseconds: 50_000))
        let farSkewed = clock.observe(HLC(milliseconds: 1000 + 3_600_000), now: 1000)
        let afterFar = clock.tick(now: 1000)
        #expect(farSkewed, "an hour ahead is counted as skewed")
        #expect(afterFar.milliseconds == 1000 + 3_600_000, "but still followed")
    }

    @Test func changesWaitForTheirDependencies() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["x": 1])
        _ = try t.send(t.a, t.b)
        try t.patch(t.b, at: 20, set: ["x": 2])  // B1 depends on A1
        var clock = t.c.clock
        let onlyB = t.b.changes(after: t.c.vv).filter { $0.origin == t.b.node }
        let parked = try Replica.receive(onlyB, into: t.c, clock: &clock, now: 0)
        #expect(parked.applied == 0 && parked.parked == 1 && t.doc(t.c) == nil)
        let rest = try t.send(t.a, t.c)
        #expect(rest.applied == 2 && rest.parked == 0 && t.doc(t.c)?["x"] == 2 && t.c.parkedChanges.isEmpty)
    }

    @Test func duplicatesAreIgnored() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["n": 1])
        try t.patch(t.a, at: 11, incr: ["n": 1])
        let all = t.a.changes(after: VersionVector())
        var clock = t.b.clock
        let first = try Replica.receive(all + all.reversed(), into: t.b, clock: &clock, now: 0)
        #expect(first.applied == 2 && first.duplicates == 2)
        let again = try Replica.receive(all, into: t.b, clock: &clock, now: 0)
        #expect(again.applied == 0 && again.duplicates == 2 && t.doc(t.b)?["n"] == 2, "an increment applies once")
    }

    @Test func deleteBeatsConcurrentEdit() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["x": 1])
        try t.sync()
        try t.write(t.a, at: 20) { [LocalEdit.delete(t.key, current: $0)!] }
        try t.patch(t.b, at: 30, set: ["x": 5])  // later clock, but concurrent and at the older causal length
        try t.sync()
        #expect(t.view() == nil)
        #expect(t.a.docs[t.key]?.cl == 2)
    }

    @Test func insertAfterDeleteRevives() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["x": 1, "y": 1])
        try t.sync()
        try t.write(t.a, at: 20) { [LocalEdit.delete(t.key, current: $0)!] }
        try t.sync()
        try t.put(t.b, at: 30, ["z": 3])
        try t.sync()
        #expect(t.view() == ["_id": "d", "z": 3])
        #expect(t.a.docs[t.key]?.cl == 3)
    }

    @Test func concurrentInsertsMerge() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["x": 1, "y": 1])
        try t.put(t.b, at: 11, ["y": 2, "z": 2])
        try t.sync()
        #expect(t.view() == ["_id": "d", "x": 1, "y": 2, "z": 2])
    }

    @Test func lastWriterWinsByStamp() throws {
        let t = Trio()
        try t.put(t.a, at: 10, [:])
        try t.sync()
        try t.patch(t.a, at: 100, set: ["x": 1])
        try t.patch(t.b, at: 90, set: ["x": 2])
        try t.patch(t.c, at: 100, set: ["y": "c"])
        try t.patch(t.b, at: 91, set: ["y": "b"])  // equal clocks are impossible here; see tie test below
        try t.sync()
        #expect(t.view()?["x"] == 1)
        // Equal clocks: the larger origin wins.
        let u = Trio()
        try u.put(u.a, at: 10, [:])
        try u.sync()
        try u.patch(u.a, at: 50, set: ["x": "a"])
        try u.patch(u.b, at: 50, set: ["x": "b"])
        try u.sync()
        #expect(u.view()?["x"] == "b")
    }

    @Test func unsetIsAWriteOfAbsent() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["x": 1])
        try t.sync()
        try t.patch(t.a, at: 30, unset: ["x"])
        try t.patch(t.b, at: 20, set: ["x": 2])
        try t.sync()
        #expect(t.view() == ["_id": "d"])
    }

    @Test func sameChangeLaterOpWins() throws {
        let t = Trio()
        try t.write(t.a, at: 10) { _ in
            [.doc(DocOp(key: t.key, cl: 1, set: ["x": 1])), .doc(DocOp(key: t.key, cl: 1, set: ["x": 2]))]
        }
        try t.sync()
        #expect(t.view() == ["_id": "d", "x": 2])
    }

    @Test func concurrentIncrementsAddUp() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["n": 10])
        try t.sync()
        try t.patch(t.a, at: 20, incr: ["n": 2])
        try t.patch(t.b, at: 20, incr: ["n": 3])
        try t.patch(t.c, at: 5, incr: ["m": 1])
        try t.sync()
        #expect(t.view() == ["_id": "d", "n": 15, "m": 1])
    }

    @Test func countersKeepIntegersExact() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["n": .int(9_007_199_254_740_993)])
        try t.sync()
        try t.patch(t.a, at: 20, incr: ["n": 1])
        try t.patch(t.b, at: 21, incr: ["n": 1])
        try t.sync()
        #expect(t.view()?["n"] == .int(9_007_199_254_740_995))
        try t.patch(t.c, at: 30, incr: ["n": .double(0.5)])
        try t.patch(t.a, at: 31, incr: ["n": .int(.max)])
        try t.sync()
        if case .double? = t.view()?["n"] {} else { Issue.record("a double delta or an overflow makes the sum a double") }
    }

    @Test func setRemoveOnlyRemovesObservedAdds() throws {
        let t = Trio()
        try t.put(t.a, at: 10, [:])
        try t.patch(t.a, at: 11, add: ["tags": ["a"]])
        try t.sync()
        try t.patch(t.a, at: 20, remove: ["tags": ["a"]])
        try t.patch(t.b, at: 19, add: ["tags": ["a"]])  // concurrent re-add survives the remove
        try t.sync()
        #expect(t.view()?["tags"] == ["a"])
        try t.patch(t.c, at: 30, remove: ["tags": ["a"]])  // saw both adds: removes both
        try t.sync()
        #expect(t.view()?["tags"] == [])
    }

    @Test func setsAreSortedAndDeduplicated() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["s": ["z", 2]])
        try t.sync()
        try t.patch(t.a, at: 20, add: ["s": ["b", .double(1.0), 1, true, "z"]])
        try t.patch(t.b, at: 21, add: ["s": [.null, ["k": 1], [1]]])
        try t.patch(t.c, at: 22, remove: ["s": [2]])
        try t.sync()
        #expect(t.view()?["s"] == [.null, true, 1, .double(1.0), "b", "z", [1], ["k": 1]])
    }

    @Test func writeReplacesOlderCounterAndSetState() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["n": 5, "s": ["a"]])
        try t.sync()
        try t.patch(t.a, at: 200, set: ["n": 0, "s": ["x"]])
        try t.patch(t.c, at: 190, incr: ["n": 1], add: ["s": ["c"]])
        try t.sync()
        #expect(t.view() == ["_id": "d", "n": 0, "s": ["x"]])
    }

    @Test func newerIncrementsStayOnTopOfAWrite() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["n": 5, "s": ["a"]])
        try t.sync()
        try t.patch(t.a, at: 200, set: ["n": 0, "s": ["x"]])
        try t.patch(t.b, at: 210, incr: ["n": 1], add: ["s": ["b"]])
        try t.patch(t.c, at: 190, incr: ["n": 1], add: ["s": ["c"]])
        try t.sync()
        #expect(t.view() == ["_id": "d", "n": 1, "s": ["b", "x"]])
    }

    @Test func concurrentLoserIsListedSequentialOverwriteIsNot() throws {
        let t = Trio()
        try t.put(t.a, at: 10, ["x": 1])
        try t.sync()
        try t.patch(t.a, at: 20, set: ["x": 2])  // sequential overwrite of x = 1: no conflict
        try t.sync()
        #expect(t.a.docs[t.key]!.fields["x"]!.losers.isEmpty)
        try t.patch(t.a, at: 30, set: ["x": "from a"])
        try t.patch(t.b, at: 31, set: ["x": "from b"])
        try t.sync()
        for r in [t.a, t.b, t.c] {
            let x = r.docs[t.key]!.fields["x"]!
            #expect(x.value == "from b" && x.winner?.stamp.dot.origin == t.b.node)
            #expect(x.losers.map(\.value) == ["from a"] && x.losers.first?.stamp.dot.origin == t.a.node)
        }
    }

    @Test func aWriteThatSawTheConflictResolvesIt() throws {
        let t = Trio()
        try t.put(t.a, at: 10, [:])
        try t.sync()
        try t.patch(t.a, at: 30, set: ["x": "a"])
        try t.patch(t.b, at: 31, set: ["x": "b"])
        try t.patch(t.c, at: 32, set: ["x": "c"])
        try t.sync()
        #expect(t.a.docs[t.key]!.fields["x"]!.losers.count == 2)
        try t.patch(t.a, at: 40, set: ["x": "a"])  // resolution: observes every loser
        try t.sync()
        #expect(t.view()?["x"] == "a")
        #expect([t.a, t.b, t.c].allSatisfy { $0.docs[t.key]!.fields["x"]!.losers.isEmpty })
    }

    @Test func indexDefinitionsReplicate() throws {
        let t = Trio()
        try t.write(t.a, at: 10) { _ in [.index(name: "by_x", collection: "c", fields: ["x"])] }
        try t.write(t.b, at: 20) { _ in [.index(name: "by_x", collection: "c", fields: ["y"])] }
        try t.sync()
        #expect(t.a.indexes == t.b.indexes && t.b.indexes == t.c.indexes && t.a.indexes["by_x"]?.fields == ["y"])
        try t.write(t.c, at: 30) { _ in [.index(name: "by_x", collection: "c", fields: nil)] }
        try t.sync()
        #expect(t.a.indexes["by_x"]?.fields == nil && t.b.indexes == t.a.indexes)
    }
}

@Suite struct Identifiers {
    @Test func nodeIDsRoundTripAndOrderLikeTheirBytes() throws {
        var rng = SeededRandom(seed: testSeed("node ids"))
        var ids: [NodeID] = []
        for _ in 0..<500 {
            let bytes = (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) }
            let id = NodeID(bytes: bytes)
            #expect(id.hex == bytes.map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }.joined())
            #expect(NodeID(hex: id.hex) == id)
            ids.append(id)
        }
        #expect(ids.sorted().map(\.hex) == ids.map(\.hex).sorted())
        #expect(NodeID(hex: "0A" + String(repeating: "0", count: 30)) == nil)
        #expect(NodeID(hex: "abc") == nil)
        #expect(NodeID(hex: String(repeating: "g", count: 32)) == nil && NodeID(hex: "0" + String(repeating: "/", count: 31)) == nil)
        for id in ids.prefix(20) {
            var out: [UInt8] = [1]
            id.writeHex(to: &out)
            #expect(out == [1] + Array(id.hex.utf8))
        }
    }
}

@Suite struct ChangeText {
    /// The op writer that skips building a `JSONValue` writes exactly the canonical JSON of the op's JSON form.
    @Test func writtenDocOpsAreTheirCanonicalJSON() throws {
        var rng = SeededRandom(seed: 5)
        let names = ["a", "Z", "set", "é", "k", "unset"]
        func pick() -> String { names.randomElement(using: &rng)! }
        func values() -> [JSONValue] {
            (0..<Int.random(in: 1...2, using: &rng)).map { _ in .int(Int64.random(in: -3...3, using: &rng)) }
        }
        for _ in 0..<2_000 {
            let id = ["i", "é", "x\\y"].randomElement(using: &rng)!
            var op = DocOp(key: DocKey(collection: "c\"", id: id), cl: Int64.random(in: 1...5, using: &rng))
            if Bool.random(using: &rng) {
                op.set[pick()] = .string(pick())
                op.set[pick()] = ["n": .double(-0.0)]
            }
            if Bool.random(using: &rng) { op.unset = [pick(), pick()] }
            if Bool.random(using: &rng) { op.incr = [pick(): .int(2)] }
            if Bool.random(using: &rng) { op.add = [pick(): values()] }
            if Bool.random(using: &rng) { op.remove = [pick(): values()] }
            for crdt in [CRDTOp.doc(op), .delete(op.key, cl: op.cl + 1)] {
                var out: [UInt8] = []
                Change.writeOp(crdt, to: &out)
                let change = Change(
                    origin: NodeID(bytes: Array(repeating: 1, count: 16)), seq: 1, hlc: HLC(raw: 1), deps: VersionVector([:]),
                    ops: [crdt])
                #expect(change.text(opsJSON: out) == change.jsonValue.jsonText)
                #expect(try Change(json: JSONParser().parse(change.text(opsJSON: out))).ops == [crdt])
            }
        }
    }

    /// A version vector written straight to text (the dependencies of every change text) is its canonical JSON:
    /// members in the order of their hex keys, whatever the ids' bytes and the sequence numbers.
    @Test func writtenVersionVectorsAreTheirCanonicalJSON() throws {
        var rng = SeededRandom(seed: 11)
        for _ in 0..<2_000 {
            var entries: [NodeID: UInt64] = [:]
            for _ in 0..<Int.random(in: 0...6, using: &rng) {
                // Ids that differ only in a low byte, only in the high half, or everywhere.
                var bytes = [UInt8](repeating: UInt8.random(in: 0...1, using: &rng) == 0 ? 0 : 0xFF, count: 16)
                bytes[Int.random(in: 0..<16, using: &rng)] = UInt8.random(in: 0...255, using: &rng)
                if Bool.random(using: &rng) { bytes = (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) } }
                entries[NodeID(bytes: bytes)] = [1, 9, 10, UInt64(Int64.max)].randomElement(using: &rng)!
            }
            let vector = VersionVector(entries)
            var out: [UInt8] = []
            vector.write(to: &out)
            #expect(String(decoding: out, as: UTF8.self) == vector.jsonValue.jsonText)
            #expect(VersionVector(json: try JSONParser().parse(String(decoding: out, as: UTF8.self))) == vector)
            let change = Change(
                origin: NodeID(bytes: Array(repeating: 2, count: 16)), seq: 3, hlc: HLC(raw: 4), deps: vector,
                ops: [.delete(DocKey(collection: "c", id: "d"), cl: 2)])
            var ops: [UInt8] = []
            Change.writeOp(change.ops[0], to: &ops)
            #expect(change.text(opsJSON: ops) == change.jsonValue.jsonText)
        }
    }
}
