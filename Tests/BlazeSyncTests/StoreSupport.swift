// Store-level helpers for the tests of the sync log, snapshots and compaction through BlazeSync: copies of
// BlazeStoreTests' (TempStore, rowCount, documentStates, erasingStableStamps, StoreReplication.randomOp,
// committedVersionsMatchTheTable), since one test target cannot import another.

import BlazeProtocol
import BlazeTestSupport
import Foundation
import GRDB

@testable import BlazeCRDT
@testable import BlazeStore

/// A random node id for a test replica.
func randomNode() -> NodeID { NodeID(bytes: (0..<16).map { _ in UInt8.random(in: 0...255) }) }

/// A store in a fresh temporary directory, removed when the test ends.
final class TempStore {
    let dir: String
    let store: Store

    init(limits: StoreLimits = StoreLimits(), node: NodeID = randomNode()) throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("blazestore-\(UUID().uuidString)").path
        store = try Store(directory: dir, limits: limits, node: node)
    }

    deinit {
        store.closeAll()
        try? FileManager.default.removeItem(atPath: dir)
    }
}

/// Rows of a table.
func rowCount(_ db: BlazeDatabase, _ table: String) throws -> Int {
    try db.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM \(table)") ?? 0 }
}

/// Every document's CRDT state, live (`docs`) and, with `tombstones`, deleted.
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

/// Random writes, as BlazeStoreTests' replication property makes them.
enum StoreReplication {
    /// A random write on one of four documents of collection "c".
    static func randomOp(writer: Int, _ rng: inout SeededRandom) -> WriteOp {
        let id = "d\(Int.random(in: 0...3, using: &rng))"
        let value: JSONValue = [.int(Int64.random(in: -3...3, using: &rng)), "s", .double(-0.0), .bool(true), ["x": 1]]
            .randomElement(using: &rng)!
        switch Int.random(in: 0..<12, using: &rng) {
        case 0: return .put(collection: "c", id: id, doc: ["v": value, "w": .int(Int64(writer))])
        case 1: return .delete(collection: "c", id: id)
        case 2: return .patch(collection: "c", id: id, incr: ["n": .int(Int64.random(in: 1...5, using: &rng))])
        case 3: return .patch(collection: "c", id: id, add: ["tags": [value]])
        case 4: return .patch(collection: "c", id: id, remove: ["tags": [value]])
        case 5: return .patch(collection: "c", id: id, unset: ["v"])
        // Keys that sort before and after `_id`, and an empty document: the stored text is built around `_id`.
        case 6: return .insert(collection: "c", doc: ["_id": .string(id), "A": value, "Z9": 1, "z": .int(Int64(writer))])
        // New documents with no field, a field after `_id` in key order, or one before it (`_id` is then last).
        case 7: return .insert(collection: "c", doc: [["_id": .string(id)], ["v": value], ["V": value]].randomElement(using: &rng)!)
        // Nested fields: edits inside `o`, and writes of `o` whole (some not objects: later nested edits then fail
        // locally, or meet them concurrently).
        case 9: return .patch(collection: "c", id: id, set: [["o.a", "o.b.c"].randomElement(using: &rng)!: value])
        case 10: return .patch(collection: "c", id: id, incr: ["o.n": .int(Int64.random(in: 1...5, using: &rng))])
        case 11:
            return Bool.random(using: &rng)
                ? .patch(collection: "c", id: id, set: ["o": [["a": 1], ["b": ["c": 2]], 7].randomElement(using: &rng)!])
                : .patch(collection: "c", id: id, unset: ["o.a"])
        default: return .patch(collection: "c", id: id, set: ["v": value])
        }
    }
}

extension BlazeDatabase {
    /// Whether the in-memory committed version vector is the `versions` table's.
    func committedVersionsMatchTheTable() throws -> Bool {
        try connections.writeWithoutTransaction { db in
            let table = try Row.fetchAll(db, sql: "SELECT origin, seq FROM versions").map { (NodeID(hex: $0[0])!, UInt64($0[1] as Int64)) }
            return try committedVersions.value(db) == VersionVector(Dictionary(uniqueKeysWithValues: table))
        }
    }
}
