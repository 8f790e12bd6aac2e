import BlazeCRDT
import BlazeProtocol
import BlazeTestSupport
import Testing

/// `DocumentState.compactTextAfterLocalWrite` (the store's patch-in-place shortcut) re-implements the merge of a
/// local set/unset over the compact state text. Checked here against the general engine on random states, in every
/// build configuration (the store's own check runs in debug builds only).
@Suite struct LocalWriteShortcut {
    static let names = ["a", "b", "c", "d", "e", "f"]

    /// A random alive document state: local writes, concurrent writes of other origins (conflicts), sometimes a
    /// counter or a set, and unsets; returns it with the largest clock used and the version vector of its changes.
    static func randomState(_ rng: inout SeededRandom) -> (DocumentState, Int64, VersionVector) {
        let origins = (0..<3).map { i in NodeID(bytes: (0..<16).map { _ in UInt8(truncatingIfNeeded: i &* 37 &+ 1) }) }
        let key = DocKey(collection: "c", id: "d")
        var state = DocumentState()
        var clock: Int64 = 1_000
        var seqs = [UInt64](repeating: 0, count: origins.count)
        var seen = VersionVector(), beforeLatest = VersionVector()
        for step in 0..<Int.random(in: 1...8, using: &rng) {
            let o = step == 0 ? 0 : Int.random(in: 0..<origins.count, using: &rng)
            // Mostly later than everything so far; sometimes concurrent (an earlier clock from another origin).
            let concurrent = step > 0 && Int.random(in: 0..<4, using: &rng) == 0
            let hlc = concurrent ? clock - Int64.random(in: 1...5, using: &rng) : clock + Int64.random(in: 1...3, using: &rng)
            clock = max(clock, hlc)
            seqs[o] += 1
            var op = DocOp(key: key, cl: max(state.cl, 1))
            for name in names where Int.random(in: 0..<3, using: &rng) == 0 {
                switch Int.random(in: 0..<10, using: &rng) {
                case 0: op.incr[name] = .int(Int64.random(in: 1...3, using: &rng))
                case 1: op.add[name] = [.string("x\(Int.random(in: 0...2, using: &rng))")]
                case 2, 3: op.unset.append(name)
                default: op.set[name] = .int(Int64.random(in: 0...99, using: &rng))
                }
            }
            if op.set.isEmpty && op.unset.isEmpty && op.incr.isEmpty && op.add.isEmpty { op.set["a"] = .int(Int64(step)) }
            // A concurrent change has not seen the latest one; the others have seen everything.
            let change = Change(
                origin: origins[o], seq: seqs[o], hlc: HLC(milliseconds: UInt64(hlc)), deps: concurrent ? beforeLatest : seen,
                ops: [])
            state.apply(op, change: change, index: 0)
            beforeLatest = seen
            seen[origins[o]] = seqs[o]
        }
        return (state, clock, seen)
    }

    @Test func theShortcutAgreesWithTheGeneralEngine() throws {
        let seed = testSeed("local write shortcut")
        var rng = SeededRandom(seed: seed)
        let local = NodeID(bytes: [UInt8](repeating: 0xEE, count: 16))
        var taken = 0
        for i in 0..<20_000 {
            let (state, clock, seen) = Self.randomState(&rng)
            guard state.cl % 2 == 1, let body = state.materialize(id: "d") else { continue }
            var set: [String: JSONValue] = [:]
            var unset: [String] = []
            for name in Self.names + ["new"] where Int.random(in: 0..<3, using: &rng) == 0 {
                if Bool.random(using: &rng) { set[name] = .string("v\(i)") } else { unset.append(name) }
            }
            if set.isEmpty && unset.isEmpty { set["a"] = .bool(true) }
            var writes = [String: JSONValue?]()
            for (name, value) in set { writes[name] = .some(value) }
            for name in unset { writes[name] = .some(nil) }
            // A local write has seen every change the state holds (that is when the store takes the shortcut).
            let change = Change(origin: local, seq: 1, hlc: HLC(milliseconds: UInt64(clock + 1)), deps: seen, ops: [])
            let compact = try JSONParser(maxDepth: 64).parse(state.compactText)
            let shortcut = DocumentState.compactTextAfterLocalWrite(
                compact: compact, fieldCount: body.keys.filter { $0 != "_id" }.count, hasField: { body[$0] != nil && $0 != "_id" },
                body: { body }, writes: writes, stamp: change.stamp(0))
            var general = state
            general.apply(DocOp(key: DocKey(collection: "c", id: "d"), cl: state.cl, set: set, unset: unset), change: change, index: 0)
            guard let shortcut else { continue }
            taken += 1
            #expect(
                shortcut == general.compactText,
                "case \(i) (seed \(seed)): state \(state.compactText) set \(set) unset \(unset)")
        }
        // The shortcut must actually be exercised, not only declined.
        #expect(taken > 2_000, "the shortcut applied only \(taken) times")
    }
}
