import BlazeProtocol
import BlazeTestSupport
import Foundation
import GRDB
import Testing

@testable import BlazeCRDT
@testable import BlazeStore

/// Rows of a table.
func rowCount(_ db: BlazeDatabase, _ table: String) throws -> Int {
    try db.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM \(table)") ?? 0 }
}

/// Every document's CRDT state, live (`docs`) and, with `tombstones`, deleted.
/// `states` with every document's history folded as far as `stable` allows.
func folded(_ states: [String: DocumentState], _ stable: VersionVector) -> [String: DocumentState] {
    states.mapValues { $0.folded(stable: stable) ?? $0 }
}

/// The larger of `a` and `b` per origin.
func joined(_ a: VersionVector, _ b: VersionVector) -> VersionVector {
    VersionVector(a.entries.merging(b.entries) { max($0, $1) })
}

/// `states` with every plain write `stable` covers spelled out as one write per leaf of its value (a path into its
/// objects) at one erased stamp, unset ones and leaves a later write at or around their path hides dropped.
///
/// Replicas fold stable history at different times (`DocumentState.folded`: nested paths into their top-level
/// objects, every stamp the latest), and a replica that folded keeps its folded object under later nested writes,
/// where one that did not keeps the nested writes it had. Their documents are the same; their states are the same
/// once stable writes are compared leaf by leaf, whatever register held them.
///
/// Likewise a stable unset under a counter or a set (no losing writes) in a document without nested paths: a
/// replica that folded before the counter's first increment arrived dropped the unset field, and the increment made
/// the field anew; one that folded later keeps the unset as the field's winner. Every later write, increment,
/// addition or removal is after that unset and observes it, and a missing winner and a stable unset show the same
/// value, so the two are the same.
func erasingStableStamps(_ states: [String: DocumentState], _ stable: VersionVector) -> [String: DocumentState] {
    let erased = Stamp(hlc: HLC(raw: 0), origin: NodeID(bytes: [UInt8](repeating: 0, count: 16)), seq: 1, index: 0)
    return states.mapValues { state in
        guard state.cl % 2 == 1 else { return state }
        var out = state
        var leaves: [String: (stamp: Stamp, value: JSONValue)] = [:]
        func spell(_ path: String, _ value: JSONValue, _ stamp: Stamp) {
            if case .object(let members) = value, !members.isEmpty {
                for (k, v) in members { spell(path + "." + k, v, stamp) }
            } else if leaves[path].map({ $0.stamp < stamp }) ?? true {
                leaves[path] = (stamp, value)
            }
        }
        for (name, f) in state.fields {
            if !state.hasPaths, f.losers.isEmpty, !(f.increments.isEmpty && f.additions.isEmpty && f.lastSetOp == nil),
                let w = f.winner, w.value == nil, w.stamp.dot.seq <= stable[w.stamp.dot.origin]
            {
                out.fields[name]?.winner = nil
            }
            guard f.isPlainWrite, let w = f.winner, w.stamp.dot.seq <= stable[w.stamp.dot.origin] else { continue }
            out.fields[name] = nil
            if let value = w.value { spell(name, value, w.stamp) }
        }
        for (path, leaf) in leaves {
            // Hidden by a later write kept as it is: at the path, inside it, or around it.
            let hidden = out.fields.contains { other, f in
                guard let s = f.winner?.stamp, leaf.stamp < s else { return false }
                return other == path || other.hasPrefix(path + ".") || path.hasPrefix(other + ".")
            }
            if !hidden { out.fields[path] = .plain(erased, leaf.value) }
        }
        return out
    }
}

func documentStates(_ db: BlazeDatabase, tombstones: Bool) throws -> [String: DocumentState] {
    try db.read { d in
        var out: [String: DocumentState] = [:]
        let sql =
            "SELECT collection || '/' || id, state, body FROM docs"
            + (tombstones ? " UNION ALL SELECT collection || '/' || id, state, NULL FROM tombstones" : "")
        for row in try Row.fetchAll(d, sql: sql) {
            out[row[0]] = try SQLStorage.decode(state: row[1], body: row[2], db.coding)
        }
        return out
    }
}

@Suite struct Compaction {
    /// A database nobody shares is its only member: everything it holds is stable. Compaction leaves the documents
    /// exactly as they were, drops the op log (the feed holds reverse deltas and needs none of it) and every
    /// tombstone, and gives the freed pages back to the file system; the clock stays ahead of the pruned changes.
    @Test func aLocalDatabaseKeepsItsDocumentsAndLosesItsHistory() throws {
        var limits = StoreLimits()
        limits.feedRetention = 10
        let t = try TempStore(limits: limits)
        var db = try t.store.create("c")
        for chunk in 0..<20 {
            _ = try db.commit((0..<10).map { i in .insert(collection: "c", doc: ["_id": .string("d\(chunk * 10 + i)"), "n": .int(0), "pad": .string(String(repeating: "x", count: 200))]) })
        }
        for round in 1...5 {
            for i in 0..<200 { _ = try db.apply(.patch(collection: "c", id: "d\(i)", set: ["n": .int(Int64(round))])) }
        }
        for i in stride(from: 0, to: 200, by: 2) { _ = try db.apply(.delete(collection: "c", id: "d\(i)")) }
        // The feed keeps the last 10 changes, as reverse deltas from the current documents.
        for i in stride(from: 1, to: 21, by: 2) { _ = try db.apply(.patch(collection: "c", id: "d\(i)", set: ["n": .int(-1)])) }
        let hash = try db.stateHash()
        let live = try documentStates(db, tombstones: false)
        let pagesBefore = try db.read { try Int.fetchOne($0, sql: "PRAGMA page_count") ?? 0 }
        let maxClock = try db.read { try Int64.fetchOne($0, sql: "SELECT max(hlc) FROM changes") ?? 0 }
        #expect(try rowCount(db, "tombstones") == 100)

        let report = try db.compact(stable: try db.versionVector())
        #expect(report.changes == 1130)
        #expect(report.tombstones == 100)
        #expect(report.pagesFreed > 0)
        #expect(try rowCount(db, "changes") == 0)
        #expect(try rowCount(db, "tombstones") == 0)
        #expect(try db.stateHash() == hash)
        // The same documents; every state (no counter, set or conflict here) folded into one stamp.
        #expect(try documentStates(db, tombstones: false) == folded(live, try db.versionVector()))
        #expect(report.folded == 100)
        #expect(try db.read { try String.fetchAll($0, sql: "SELECT state FROM docs") }.allSatisfy { !$0.contains("\"p\":") })
        #expect(try db.read { try Int.fetchOne($0, sql: "PRAGMA page_count") ?? 0 } < pagesBefore)
        #expect(try db.read { try Int.fetchOne($0, sql: "PRAGMA freelist_count") ?? 0 } == 0)
        #expect(try db.lastCompaction() == report)
        // The retained feed still replays, from its floor.
        let entries = try db.feedEntries(after: db.feed.floor)
        #expect(entries.count == 10)
        #expect(entries.allSatisfy { $0.events.count == 1 && $0.events[0].type == .update && $0.events[0].after?["n"] == .int(-1) })
        #expect(try db.compact(stable: try db.versionVector()).rows == 0)

        // After a restart the clock is still ahead of every pruned change, and deleted ids can be inserted again.
        t.store.closeAll()
        db = try t.store.database("c")
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "d0", "n": 9]))
        let newest = try db.read { try Int64.fetchOne($0, sql: "SELECT hlc FROM changes ORDER BY hlc DESC LIMIT 1") ?? 0 }
        #expect(newest > maxClock)
        #expect(try db.get(collection: "c", id: "d0")["n"] == .int(9))
        #expect(try db.read { try String.fetchOne($0, sql: "PRAGMA integrity_check") } == "ok")
    }

    /// Updates that grow small documents leave their pages part empty, which no page-level vacuum returns. A
    /// compaction asked for space (`db.compact`) rewrites such a file once more than a quarter of it, and over
    /// 256 KiB, is unused, and leaves its write-ahead log empty: the size `db.info` reports is then what it holds.
    @Test func askedForSpaceCompactionRewritesASmallFileLeftPartEmptyByUpdates() throws {
        let t = try TempStore()
        let db = try t.store.create("small")
        for chunk in stride(from: 0, to: 4000, by: 500) {
            _ = try db.commit((chunk..<(chunk + 500)).map { i in .insert(collection: "c", doc: ["_id": .string("d\(i)"), "n": .int(Int64(i))]) })
        }
        for round in 0..<3 {
            _ = try db.commit((0..<4000).map { i in
                .patch(collection: "c", id: "d\((i &* 7919) % 4000)", set: ["name": .string("item \(i) of round \(round)")])
            })
        }
        let unused = { () throws -> (unused: Int64, total: Int64) in
            try db.read { d in
                let row = try Row.fetchOne(d, sql: "SELECT coalesce(sum(unused), 0), coalesce(sum(pgsize), 0) FROM dbstat")
                return (row?[0] as Int64? ?? 0, row?[1] as Int64? ?? 0)
            }
        }
        let hash = try db.stateHash()
        _ = try db.compact(stable: try db.versionVector())
        let states = try documentStates(db, tombstones: false)
        let left = try unused()
        #expect(left.unused > 256 << 10 && left.unused * 4 > left.total, "the shape leaves pages part empty: \(left)")
        let report = try db.compact(stable: try db.versionVector(), defragment: true)
        let after = try unused()
        #expect(report.pagesFreed > 0)
        #expect(after.unused * 4 < after.total, "\(after)")
        #expect(after.total < left.total)
        let wal = try FileManager.default.attributesOfItem(atPath: db.path + "-wal")[.size] as? NSNumber
        #expect(wal?.intValue == 0)
        let pages = try db.read { try Int64.fetchOne($0, sql: "SELECT page_count * page_size FROM pragma_page_count, pragma_page_size") }
        #expect(try db.summary().sizeBytes == pages)
        #expect(try db.stateHash() == hash)
        #expect(try documentStates(db, tombstones: false) == states)
    }

    /// A tombstone of a delete that is not yet stable stays, and a tombstone made before v10 (no deleting change
    /// known) is never dropped.
    /// A live document's history folds into one stamp only when every field is a plain write every member holds;
    /// later writes still win over the folded stamp, and take the in-place patch path.
    @Test func onlyStablePlainHistoryFolds() throws {
        let t = try TempStore()
        let db = try t.store.create("c")
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "plain", "a": 1, "b": 2, "c": 3]))
        _ = try db.apply(.patch(collection: "c", id: "plain", set: ["a": 4], unset: ["b"]))
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "counter", "a": 1]))
        _ = try db.apply(.patch(collection: "c", id: "counter", incr: ["n": 1]))
        let first = try db.versionVector()
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "late", "a": 1, "b": 1]))
        _ = try db.apply(.patch(collection: "c", id: "late", set: ["a": 2]))
        func state(_ id: String) throws -> String {
            try db.read { try String.fetchOne($0, sql: "SELECT state FROM docs WHERE id = ?", arguments: [id]) ?? "" }
        }
        #expect(try db.compact(stable: VersionVector()).folded == 0)
        #expect(try state("plain").contains(#""p":"#))
        // Stable up to `first`: "late"'s patch is not, and "counter" holds a counter.
        #expect(try db.compact(stable: first).folded == 1)
        let folded = try state("plain")
        #expect(folded.hasPrefix(#"{"l":1,"t":["#) && !folded.contains(#""p":"#) && !folded.contains(#""u":"#))
        #expect(try state("counter").contains(#""f":"#) && state("late").contains(#""p":"#))
        #expect(try db.get(collection: "c", id: "plain") == ["_id": "plain", "a": 4, "c": 3])
        _ = try db.apply(.patch(collection: "c", id: "plain", set: ["b": 5]))
        _ = try db.apply(.patch(collection: "c", id: "plain", set: ["a": 6]))
        #expect(try db.get(collection: "c", id: "plain") == ["_id": "plain", "a": 6, "b": 5, "c": 3])
        #expect(try db.compact(stable: try db.versionVector()).folded == 2)
        #expect(try db.compact(stable: try db.versionVector()).folded == 0)
    }

    @Test func tombstonesStayUntilTheirDeleteIsStable() throws {
        let t = try TempStore()
        let db = try t.store.create("c")
        for i in 0..<4 { _ = try db.apply(.insert(collection: "c", doc: ["_id": .string("d\(i)")])) }
        for i in 0..<4 { _ = try db.apply(.delete(collection: "c", id: "d\(i)")) }
        let node = db.node
        // Deletes are changes 5...8; stable up to 6.
        let report = try db.compact(stable: VersionVector([node: 6]))
        #expect(report.tombstones == 2)
        #expect(try db.read { try String.fetchAll($0, sql: "SELECT id FROM tombstones ORDER BY id") } == ["d2", "d3"])
        try db.connections.write { try $0.execute(sql: "UPDATE tombstones SET del_origin = NULL, del_seq = NULL WHERE id = 'd2'") }
        #expect(try db.compact(stable: try db.versionVector()).tombstones == 1)
        #expect(try db.read { try String.fetchAll($0, sql: "SELECT id FROM tombstones") } == ["d2"])
    }

    /// The rule's second half matters: X deletes a document while Y, not having seen the delete, edits it; everyone
    /// then acknowledges the delete. Z, which has not applied Y's edit, must not count the delete as stable (the edit
    /// still to come is concurrent with it): had Z dropped the tombstone, the edit would bring the document back on
    /// Z alone.
    @Test func aDeleteIsNotStableWhileAMembersEarlierEditIsMissing() throws {
        let r = try StoreReplicas(3)
        let (x, y, z) = (0, 1, 2)
        _ = try r.dbs[x].apply(.insert(collection: "c", doc: ["_id": "d", "v": 1]))
        try r.syncAll()
        _ = try r.dbs[x].apply(.delete(collection: "c", id: "d"))
        _ = try r.dbs[y].apply(.patch(collection: "c", id: "d", set: ["v": 2]))
        try r.send(x, y)
        try r.send(x, z)
        let acknowledged = Dictionary(uniqueKeysWithValues: try r.dbs.map { ($0.node, try $0.versionVector()) })
        #expect(Stability.stableVector(acknowledged: acknowledged, applied: try r.dbs[z].versionVector()) == nil)
        // What a stable vector without the condition would do: Z drops the tombstone, and Y's edit revives it there.
        let naive = VersionVector([r.dbs[x].node: 2])
        try r.dbs[z].compact(stable: naive)
        try r.syncAll()
        #expect(try r.dbs[y].stateHash() != r.dbs[z].stateHash())
        // With Y's edit applied, the delete is stable at Z.
        #expect(
            Stability.stableVector(acknowledged: acknowledged, applied: try r.dbs[y].versionVector())?[r.dbs[x].node] == 2)
    }

    /// The convergence property with compaction at random points on random replicas: each replica publishes what it
    /// holds (an acknowledgement) now and then, and compacts up to the stable vector those acknowledgements give
    /// (SYNC.md §11: every member holds it, and the compacting replica applied everything each member had authored
    /// when it acknowledged). Every replica still reaches the same documents, CRDT states and version vector, and
    /// once all is stable and compacted everywhere, the same tombstones.
    @Test func randomHistoriesConvergeWithCompactionAnywhere() throws {
        let base = testSeed("compaction")
        var limits = StoreLimits()
        limits.feedRetention = 2
        var total = 0
        for i in 0..<UInt64(120) {
            let seed = base &+ i
            var rng = SeededRandom(seed: seed)
            let r = try StoreReplicas(Int.random(in: 3...4, using: &rng), limits: limits)
            var acks = r.dbs.map { _ in VersionVector() }
            var compacted = 0
            var everStable = VersionVector()
            func compact(_ k: Int) throws {
                var acknowledged: [NodeID: VersionVector] = [:]
                for m in r.dbs.indices { acknowledged[r.dbs[m].node] = acks[m] }
                guard let stable = Stability.stableVector(acknowledged: acknowledged, applied: try r.dbs[k].versionVector())
                else { return }
                everStable = joined(everStable, stable)
                compacted += try r.dbs[k].compact(stable: stable, stepRows: Int.random(in: 1...5, using: &rng)).rows
            }
            for _ in 0..<Int.random(in: 20...60, using: &rng) {
                let who = Int.random(in: 0..<r.dbs.count, using: &rng)
                let dice = Double.random(in: 0..<1, using: &rng)
                if dice < 0.45 {
                    let ops = (0..<Int.random(in: 1...3, using: &rng)).map { _ in StoreReplication.randomOp(writer: who, &rng) }
                    _ = try? r.dbs[who].commit(ops)
                } else if dice < 0.7 {
                    try r.sendMangled(from: who, &rng)
                } else if dice < 0.85 {
                    acks[who] = try r.dbs[who].versionVector()
                } else {
                    try compact(who)
                }
            }
            try r.syncAll()
            let hashes = try r.dbs.map { try $0.stateHash() }
            #expect(Set(hashes).count == 1, "stateHash differs; replay with BLAZE_SEED=\(seed): \(hashes)")
            let vectors = try r.dbs.map { try $0.versionVector() }
            #expect(vectors.allSatisfy { $0 == vectors[0] }, "version vectors differ (seed \(seed))")
            // Replicas fold stable history at different times: states compare up to the stamps of stable writes.
            let live = try r.dbs.map { erasingStableStamps(try documentStates($0, tombstones: false), everStable) }
            #expect(live.allSatisfy { $0 == live[0] }, "CRDT states differ (seed \(seed))")
            if ProcessInfo.processInfo.environment["BLAZE_DEBUG"] != nil, !live.allSatisfy({ $0 == live[0] }) {
                for k in Set(live.flatMap { $0.keys }).sorted() where !live.allSatisfy({ $0[k] == live[0][k] }) {
                    for (n, l) in live.enumerated() { print("DEBUG \(k) replica \(n): \(l[k].map { "\($0.cl) \($0.compactJSON.jsonText)" } ?? "absent")") }
                }
            }
            // Everything is stable now: compacted everywhere, no tombstone with a known delete is left.
            acks = vectors
            for k in r.dbs.indices { try compact(k) }
            let all = try r.dbs.map { erasingStableStamps(try documentStates($0, tombstones: true), vectors[0]) }
            #expect(all.allSatisfy { $0 == all[0] }, "states with tombstones differ after compaction (seed \(seed))")
            // No tombstone is left, and no op-log body but those of changes the retained feed still holds.
            for db in r.dbs {
                #expect(try rowCount(db, "tombstones") == 0, "tombstones left (seed \(seed))")
                #expect(try rowCount(db, "changes") <= rowCount(db, "feed"), "op-log rows beyond the feed's (seed \(seed))")
            }
            total += compacted
        }
        #expect(total > 0, "no run compacted anything")
    }
}
