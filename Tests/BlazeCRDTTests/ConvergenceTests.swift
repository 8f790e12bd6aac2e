import BlazeCRDT
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

struct Scenario {
    var rng: SeededRandom
    var replicas: [MemoryReplica] = []
    var wall: UInt64 = 1_700_000_000_000
    var parkedTotal = 0

    static let values: [JSONValue] = [
        0, 1, -1, .int(.max), .int(9_007_199_254_740_993), .double(-0.0), .double(0.5), .double(.leastNonzeroMagnitude),
        .double(1e300), "a", "é", "e\u{301}", "", true, false, .null, [1, "x"], ["k": 1],
    ]
    static let deltas: [JSONValue] = [1, -1, 2, 5, .double(0.5), .double(-0.25), .int(.max)]
    static let fields = ["f", "g", "h"]
    /// What patches edit: top-level fields and nested paths, some inside others, some through objects that puts
    /// replace whole (`o`), so concurrent object writes and nested edits meet.
    static let paths = ["f", "g", "h", "o", "o.x", "o.y", "o.p.q", "f.x"]
    static let objects: [JSONValue] = [["x": 1], ["x": "a", "p": ["q": 2]], ["y": ["z": 1]], [:], ["p": 3]]

    init(seed: UInt64) {
        rng = SeededRandom(seed: seed)
        let n = Int.random(in: 3...5, using: &rng)
        for i in 0..<n {
            var bytes = [UInt8](repeating: 0, count: 16)
            bytes[0] = UInt8(i + 1)
            for j in 1..<16 { bytes[j] = UInt8.random(in: 0...255, using: &rng) }
            let skew = Int64.random(in: -3_600_000...3_600_000, using: &rng)
            replicas.append(MemoryReplica(node: NodeID(bytes: bytes), skew: skew))
        }
    }

    mutating func pick<T>(_ xs: [T]) -> T { xs.randomElement(using: &rng)! }
    mutating func chance(_ p: Double) -> Bool { Double.random(in: 0..<1, using: &rng) < p }

    mutating func someFields() -> [String: JSONValue] {
        var o: [String: JSONValue] = [:]
        for f in Self.fields where chance(0.5) { o[f] = pick(Self.values) }
        if chance(0.5) { o["o"] = pick(Self.objects) }
        return o
    }

    /// One local transaction of 1–3 random edits on shared ("s0"-"s2") or replica-private documents.
    mutating func localWrite(_ r: Int) throws {
        let replica = replicas[r]
        wall += UInt64.random(in: 0...3, using: &rng)
        var plan: [(DocKey, Int)] = []
        for _ in 0..<Int.random(in: 1...3, using: &rng) {
            let id = chance(0.75) ? "s\(Int.random(in: 0...2, using: &rng))" : "p\(r)-\(Int.random(in: 0...1, using: &rng))"
            plan.append((DocKey(collection: pick(["c", "d"]), id: id), Int.random(in: 0..<9, using: &rng)))
        }
        var gen = self
        try replica.commit(wall: wall) { _, emit in
            for (key, kind) in plan {
                let current = replica.docs[key]
                switch kind {
                case 0, 1:
                    try emit(.doc(LocalEdit.replace(key, fields: gen.someFields(), current: current)))
                case 2:
                    if let op = LocalEdit.delete(key, current: current) { try emit(op) }
                default:
                    var set: [String: JSONValue] = [:]
                    var unset: [String] = []
                    var incr: [String: JSONValue] = [:]
                    var add: [String: [JSONValue]] = [:]
                    var remove: [String: [JSONValue]] = [:]
                    let f = gen.pick(Self.paths)
                    switch kind {
                    case 3: set[f] = gen.chance(0.2) ? gen.pick(Self.objects) : gen.pick(Self.values)
                    case 4: unset = [f]
                    case 5, 6: incr[f] = gen.pick(Self.deltas)
                    case 7: add[f] = [gen.pick(Self.values), gen.pick(Self.values)]
                    default: remove[f] = [gen.pick(Self.values)]
                    }
                    if let op = LocalEdit.patch(key, current: current, set: set, unset: unset, incr: incr, add: add, remove: remove) {
                        try emit(.doc(op))
                    } else {
                        try emit(.doc(LocalEdit.replace(key, fields: gen.someFields(), current: current)))
                    }
                }
            }
        }
        rng = gen.rng
    }

    /// Sends what `to` lacks from `from`, possibly partial, shuffled, duplicated or with drops.
    mutating func exchange(from: Int, to: Int, lossy: Bool) throws {
        var batch = replicas[from].changes(after: replicas[to].vv)
        if lossy {
            if chance(0.3) { batch = Array(batch.prefix(Int.random(in: 0...batch.count, using: &rng))) }
            if chance(0.3) { batch = batch.filter { _ in chance(0.7) } }
            if chance(0.5) { batch += batch.filter { _ in chance(0.3) } }
            if chance(0.3) { batch += replicas[from].changes(after: VersionVector()).filter { _ in chance(0.2) } }
            batch.shuffle(using: &rng)
        }
        var clock = replicas[to].clock
        parkedTotal += try Replica.receive(batch, into: replicas[to], clock: &clock, now: replicas[to].now(wall)).parked
        replicas[to].clock = clock
    }

    mutating func run(steps: Int) throws {
        for _ in 0..<steps {
            let r = Int.random(in: 0..<replicas.count, using: &rng)
            if chance(0.6) {
                try localWrite(r)
            } else {
                var other = Int.random(in: 0..<replicas.count, using: &rng)
                if other == r { other = (other + 1) % replicas.count }
                try exchange(from: r, to: other, lossy: true)
            }
        }
        // Full exchange: everyone sends everything to everyone until nothing is missing.
        for _ in 0..<replicas.count {
            for a in replicas.indices { for b in replicas.indices where a != b { try exchange(from: a, to: b, lossy: false) } }
        }
    }
}

@Suite struct Convergence {
    @Test func replicasConvergeUnderAnyDeliveryOrder() throws {
        let base = testSeed("convergence")
        let cases = Int(ProcessInfo.processInfo.environment["BLAZE_CASES"] ?? "") ?? 10_000
        var failures = 0
        var stats = (changes: 0, parked: 0, losers: 0, deleted: 0, counters: 0, sets: 0, alive: 0, nested: 0)
        for i in 0..<UInt64(cases) {
            let seed = base &+ i
            var s = Scenario(seed: seed)
            try s.run(steps: Int.random(in: 5...25, using: &s.rng))
            let first = s.replicas[0]
            stats.changes += first.log.values.map(\.count).reduce(0, +)
            stats.parked += s.parkedTotal
            for d in first.docs.values {
                if d.isAlive { stats.alive += 1 } else { stats.deleted += 1 }
                for (name, f) in d.fields {
                    if name.contains(".") { stats.nested += 1 }
                    stats.losers += f.losers.count
                    if !f.increments.isEmpty { stats.counters += 1 }
                    if f.lastSetOp != nil { stats.sets += 1 }
                }
            }
            var ok = first.parkedChanges.isEmpty
            for r in s.replicas.dropFirst() {
                ok = ok && r.vv == first.vv && r.docs == first.docs && r.indexes == first.indexes && r.parkedChanges.isEmpty
            }
            if !ok {
                failures += 1
                if failures <= 2 {
                    let views = s.replicas.map { $0.materialized.sorted { $0.key < $1.key }.map { "\($0.key.collection)/\($0.key.id)=\($0.value)" } }
                    Issue.record("diverged: replay with BLAZE_SEED=\(seed) BLAZE_CASES=1\n\(views.map { $0.joined(separator: " ") }.joined(separator: "\n"))")
                }
            }
        }
        #expect(failures == 0, "\(failures) of \(cases) cases diverged (base seed \(base))")
        // The generator must really exercise merging, or convergence proves nothing.
        let perCase = { (n: Int) in Double(n) / Double(cases) }
        #expect(perCase(stats.changes) > 5 && perCase(stats.parked) > 0.2 && perCase(stats.losers) > 0.2
            && perCase(stats.deleted) > 0.2 && perCase(stats.counters) > 0.2 && perCase(stats.sets) > 0.2
            && perCase(stats.alive) > 1 && perCase(stats.nested) > 0.2, "weak generator: \(stats) over \(cases) cases")
    }
}
