import BlazeCRDT
import BlazeProtocol

/// An in-memory replica over the real engine, for property tests without files.
final class MemoryReplica: ReplicaStorage {
    let node: NodeID
    var clock: HybridClock
    /// Offset of this replica's wall clock (skew), in milliseconds.
    let skew: Int64
    var vv = VersionVector()
    var log: [NodeID: [Change]] = [:]
    var docs: [DocKey: DocumentState] = [:]
    var indexes: [String: IndexState] = [:]
    var parkedChanges: [Dot: Change] = [:]

    init(node: NodeID, skew: Int64) {
        self.node = node
        self.skew = skew
        clock = HybridClock()
    }

    func versionVector() throws -> VersionVector { vv }
    func recordApplied(_ change: Change) throws {
        precondition(change.seq == vv[change.origin] + 1, "non-contiguous apply")
        log[change.origin, default: []].append(change)
        vv[change.origin] = change.seq
    }
    func document(_ key: DocKey) throws -> DocumentState? { docs[key] }
    /// Stores the state after a trip through its JSON form, so the codec is exercised by every test: with hex
    /// origins, and with this replica's own origin as home (written `0`, as databases store it).
    func saveDocument(_ key: DocKey, _ state: DocumentState) throws {
        let body = state.materialize(id: key.id)
        precondition(state.visibleText(id: key.id) == body.map { JSONValue.object($0).jsonText }, "visibleText differs")
        precondition(state.compactText == state.compactJSON.jsonText, "compactText differs: \(state.compactText)")
        let compact = try DocumentState(compact: try JSONParser().parse(state.compactText), body: body)
        precondition(compact == state, "document state does not survive its compact form: \(state.compactJSON.jsonText)")
        let home = StampCoding(home: node)
        let homeText = state.compactText(home)
        precondition(homeText == state.compactJSON(home).jsonText, "compactText(home) differs: \(homeText)")
        let fromHome = try DocumentState(compact: try JSONParser().parse(homeText), body: body, home)
        precondition(fromHome == state, "document state does not survive its home-coded form: \(homeText)")
        // The text reader (what databases use) reads both forms to the same state.
        let read = try DocumentState(compactText: state.compactText, body: body)
        precondition(read == state, "the compactText reader differs: \(state.compactText)")
        let readHome = try DocumentState(compactText: homeText, body: body, home)
        precondition(readHome == state, "the compactText reader differs on the home-coded form: \(homeText)")
        docs[key] = fromHome
    }
    func index(_ name: String) throws -> IndexState? { indexes[name] }
    func saveIndex(_ name: String, _ state: IndexState) throws { indexes[name] = state }
    func park(_ change: Change) throws { parkedChanges[Dot(origin: change.origin, seq: change.seq, index: 0)] = change }
    func parked() throws -> [Change] { Array(parkedChanges.values) }
    func unpark(origin: NodeID, seq: UInt64) throws { parkedChanges[Dot(origin: origin, seq: seq, index: 0)] = nil }

    /// Everything this replica has that `other` lacks, per origin in sequence order.
    /// Changes travel in their JSON form, as they do between real replicas.
    func changes(after other: VersionVector) -> [Change] {
        log.keys.sorted().flatMap { origin in log[origin]!.filter { $0.seq > other[origin] } }.map { change in
            let back = try! Change(json: try! JSONParser().parse(change.jsonValue.jsonText))
            precondition(back == change, "change does not survive its JSON form")
            let read = try! Change(text: Array(change.jsonValue.jsonText.utf8), maxDepth: 10_000)
            precondition(read == change, "the change text reader differs")
            return back
        }
    }

    func now(_ wall: UInt64) -> UInt64 { UInt64(max(0, Int64(wall) + skew)) }

    /// Runs a local transaction: `build` produces ops one at a time against the current state.
    @discardableResult
    func commit(wall: UInt64, _ build: (Change, (CRDTOp) throws -> Void) throws -> Void) throws -> Change? {
        let hlc = clock.tick(now: now(wall))
        var ops: [CRDTOp] = []
        let draft = Change(origin: node, seq: vv[node] + 1, hlc: hlc, deps: vv, ops: [])
        try build(draft) { op in
            try Replica.applyOp(op, index: ops.count, of: draft, to: self)
            ops.append(op)
        }
        guard !ops.isEmpty else { return nil }
        let change = Change(origin: node, seq: draft.seq, hlc: hlc, deps: draft.deps, ops: ops)
        try recordApplied(change)
        return change
    }

    /// Materialized documents, canonical text by key.
    var materialized: [DocKey: String] {
        var out: [DocKey: String] = [:]
        for (k, s) in docs { if let d = s.materialize(id: k.id) { out[k] = JSONValue.object(d).jsonText } }
        return out
    }
}
