// The convergence property of compaction at the level of sealed entries and snapshots. The store-level property is
// in BlazeStoreTests; the helpers shared with it are copied in StoreSupport.swift.

import BlazeCRDT
import BlazeCrypto
import BlazeSync
import BlazeTestSupport
import Foundation
import Testing

@testable import BlazeStore

/// Prints `text` when `BLAZE_DEBUG` is set.
func debug(_ text: @autoclosure () throws -> String) rethrows {
    if ProcessInfo.processInfo.environment["BLAZE_DEBUG"] != nil { print("TRACE " + (try text())) }
}

/// The convergence property at the level of sealed entries, with everything compaction adds: random writes on
/// random replicas, pulls of entries between random pairs, acknowledgements now and then, compaction at random points
/// up to the stable vector the acknowledgements give — and a replica that goes away past the horizon (the others stop
/// counting it and compact what it lacks) and comes back through a snapshot. Whenever a pull meets entries
/// compacted away, the puller installs a snapshot from that replica, as a session does.
@Suite struct CompactionPropertyTests {
    /// Pulls what `to` lacks from `from`, through a snapshot when `from` compacted it away.
    @discardableResult
    static func exchange(_ to: SyncReplica, from: SyncReplica, key: SpaceKey) throws -> Bool {
        do {
            try pull(to, from: from, key: key)
            return false
        } catch let e as StoreError where e.kind == "entries_pruned" {
            let snapshot = try #require(try from.db.makeSnapshot(key: key, identity: from.identity, partBytes: 700))
            try install(snapshot, into: to, key: key)
            try pull(to, from: from, key: key)
            return true
        }
    }

    @Test func entriesSnapshotsAndCompactionConverge() throws {
        let base = testSeed("compaction-sync")
        var installs = 0, returns = 0
        for i in 0..<UInt64(40) {
            let seed = base &+ i
            var rng = SeededRandom(seed: seed)
            let key = SpaceKey.generate()
            let r = try (0..<Int.random(in: 3...4, using: &rng)).map { _ in try SyncReplica(key: key) }
            var acks = r.map { _ in VersionVector() }
            var away: Int? = nil
            var everStable = VersionVector()
            // Entries go up to what the members counted hold (the one away is past the horizon); tombstones only up
            // to what everyone holds.
            func compact(_ k: Int) throws {
                var counted: [NodeID: VersionVector] = [:]
                var everyone: [NodeID: VersionVector] = [:]
                for m in r.indices {
                    let ack = m == k ? try r[m].db.versionVector() : acks[m]
                    everyone[r[m].db.node] = ack
                    if m != away || m == k { counted[r[m].db.node] = ack }
                }
                let applied = try r[k].db.versionVector()
                guard let stable = Stability.stableVector(acknowledged: counted, applied: applied) else { return }
                let strict = Stability.stableVector(acknowledged: everyone, applied: applied) ?? VersionVector()
                everStable = joined(everStable, strict)
                try r[k].db.sealLocal(key: key, identity: r[k].identity)
                try r[k].db.compact(stable: stable, tombstonesStable: strict, stepRows: Int.random(in: 1...7, using: &rng))
            }
            for _ in 0..<Int.random(in: 40...90, using: &rng) {
                if i == 0, ProcessInfo.processInfo.environment["BLAZE_DEBUG"] != nil {
                    let d2 = try r.map { rep -> String in
                        let live = try documentStates(rep.db, tombstones: false)["c/d2"]
                        let all = try documentStates(rep.db, tombstones: true)["c/d2"]
                        return live != nil ? "alive\(live!.cl)" : all != nil ? "dead\(all!.cl)" : "none"
                    }
                    print("TRACE   d2: \(d2) vv: \(try r.map { try $0.db.versionVector().entries.sorted { $0.key < $1.key }.map { $0.value } })")
                }
                let who = Int.random(in: 0..<r.count, using: &rng)
                let dice = Double.random(in: 0..<1, using: &rng)
                if dice < 0.4 {
                    let ops = (0..<Int.random(in: 1...3, using: &rng)).map { _ in StoreReplication.randomOp(writer: who, &rng) }
                    let ok = (try? r[who].db.commit(ops)) != nil
                    try debug("\(who) writes \(ok ? "" : "(refused) ")\(ops) -> \(try r[who].db.versionVector()[r[who].db.node])")
                } else if dice < 0.65 {
                    var other = Int.random(in: 0..<r.count, using: &rng)
                    if other == who { other = (other + 1) % r.count }
                    // The replica away talks to nobody.
                    guard who != away, other != away else { continue }
                    if try Self.exchange(r[who], from: r[other], key: key) { installs += 1; debug("\(who) snapshot from \(other)") }
                    debug("\(who) pulled from \(other)")
                } else if dice < 0.8 {
                    if who != away { acks[who] = try r[who].db.versionVector(); debug("\(who) acks") }
                } else if dice < 0.92 {
                    if who != away { try compact(who); try debug("\(who) compacted; tombstones \(try rowCount(r[who].db, "tombstones"))") }
                } else if away == nil {
                    away = who
                    debug("\(who) away")
                } else if let back = away {
                    // Back: it pulls from someone (through a snapshot if it must) and is counted again.
                    away = nil
                    let other = (back + 1) % r.count
                    if try Self.exchange(r[back], from: r[other], key: key) { installs += 1; returns += 1 }
                    debug("\(back) back via \(other)")
                }
            }
            // Then, every time: replica 0 goes away, the others write, exchange, acknowledge and compact past it, and
            // it comes back through a snapshot, keeping a write of its own made while away.
            away = 0
            _ = try r[0].db.apply(.put(collection: "c", id: "away", doc: ["by": 0]))
            for k in r.indices.dropFirst() { _ = try r[k].db.apply(.put(collection: "c", id: .init("coda\(k)"), doc: ["by": .int(Int64(k))])) }
            for _ in 0..<2 {
                for a in r.indices.dropFirst() { for b in r.indices.dropFirst() where a != b { if try Self.exchange(r[a], from: r[b], key: key) { installs += 1 } } }
            }
            for k in r.indices.dropFirst() { acks[k] = try r[k].db.versionVector() }
            for k in r.indices.dropFirst() { try compact(k) }
            away = nil
            if try Self.exchange(r[0], from: r[1], key: key) { installs += 1; returns += 1 }
            #expect(try r[0].db.get(collection: "c", id: "away")["by"] == 0, "a write made while away was lost (seed \(seed))")
            // Everyone exchanges with everyone until nothing moves.
            for _ in 0..<r.count + 1 {
                for a in r.indices { for b in r.indices where a != b { if try Self.exchange(r[a], from: r[b], key: key) { installs += 1 } } }
            }
            let hashes = try r.map { try $0.db.stateHash() }
            #expect(Set(hashes).count == 1, "stateHash differs; replay with BLAZE_SEED=\(seed)")
            let vectors = try r.map { try $0.db.versionVector() }
            #expect(vectors.allSatisfy { $0 == vectors[0] }, "version vectors differ (seed \(seed))")
            let live = try r.map { erasingStableStamps(try documentStates($0.db, tombstones: false), everStable) }
            #expect(live.allSatisfy { $0 == live[0] }, "CRDT states differ (seed \(seed))")
            if ProcessInfo.processInfo.environment["BLAZE_DEBUG"] != nil, !live.allSatisfy({ $0 == live[0] }) {
                for k in Set(live.flatMap { $0.keys }).sorted() where !live.allSatisfy({ $0[k] == live[0][k] }) {
                    for (n, l) in live.enumerated() { print("DEBUG \(k) replica \(n): \(l[k].map { "\($0.cl) \($0.compactJSON.jsonText)" } ?? "absent")") }
                }
            }
            let parked = try r.map { try rowCount($0.db, "parked") }
            #expect(parked.allSatisfy { $0 == 0 }, "changes left parked (seed \(seed))")
        }
        #expect(returns >= 30, "snapshots: \(installs), of which on coming back \(returns) in 40 histories")
    }
}
