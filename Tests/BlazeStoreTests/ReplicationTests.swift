import BlazeCRDT
import BlazeProtocol
import BlazeTestSupport
import Foundation
import GRDB
import Testing

@testable import BlazeStore

/// Several real SQLite replicas in one process, exchanging changes through the store's public replication API.
final class StoreReplicas {
    let stores: [TempStore]
    let dbs: [BlazeDatabase]

    init(_ n: Int, limits: StoreLimits = StoreLimits()) throws {
        stores = try (0..<n).map { _ in try TempStore(limits: limits) }
        dbs = try stores.map { try $0.store.create("r") }
    }

    /// Sends what `to` lacks from `from`; `mangle` may drop, duplicate or reorder.
    @discardableResult
    func send(_ from: Int, _ to: Int, mangle: ([Change]) -> [Change] = { $0 }) throws -> ReceiveReport {
        let missing = try dbs[from].changes(since: try dbs[to].versionVector())
        return try dbs[to].receive(mangle(missing))
    }

    /// Sends from `who` to another random replica, dropping, duplicating and reordering changes at random.
    func sendMangled(from who: Int, _ rng: inout SeededRandom) throws {
        var other = Int.random(in: 0..<dbs.count, using: &rng)
        if other == who { other = (other + 1) % dbs.count }
        var mangler = rng
        try send(who, other) { changes in
            var c = changes.filter { _ in Double.random(in: 0..<1, using: &mangler) < 0.7 }
            c += c.filter { _ in Bool.random(using: &mangler) }
            return c.shuffled(using: &mangler)
        }
        rng = mangler
    }

    func syncAll() throws {
        for _ in 0..<dbs.count {
            for a in dbs.indices { for b in dbs.indices where a != b { try send(a, b) } }
        }
    }
}

@Suite struct StoreReplication {
    @Test func randomHistoriesConvergeInSQLite() async throws {
        let base = testSeed("replication")
        for i in 0..<UInt64(150) {
            let seed = base &+ i
            var rng = SeededRandom(seed: seed)
            let r = try StoreReplicas(Int.random(in: 3...4, using: &rng))
            for _ in 0..<Int.random(in: 10...40, using: &rng) {
                let who = Int.random(in: 0..<r.dbs.count, using: &rng)
                if Double.random(in: 0..<1, using: &rng) < 0.65 {
                    // Transactions of one to three operations, often on one document: a document inserted and then
                    // edited or deleted in the same change. Patches and deletes of missing documents (and inserts of
                    // existing ones) fail locally and write nothing; that is part of the test.
                    let ops = (0..<Int.random(in: 1...3, using: &rng)).map { _ in Self.randomOp(writer: who, &rng) }
                    _ = try? r.dbs[who].commit(ops)
                } else {
                    try r.sendMangled(from: who, &rng)
                }
            }
            try r.syncAll()
            let hashes = try r.dbs.map { try $0.stateHash() }
            let finds = try r.dbs.map { db -> String in
                guard (try? db.count(collection: "c", filter: .all)) != nil else { return "no collection" }
                let docs = try db.find(FindQuery(collection: "c", filter: try Filter.parse(["n": ["$gte": 1]]), sort: try SortKey.parse("-n"), limit: 100)).docs
                return JSONValue.array(docs).jsonText
            }
            #expect(Set(hashes).count == 1, "stateHash differs; replay with BLAZE_SEED=\(seed): \(hashes)")
            #expect(Set(finds).count == 1, "query results differ; replay with BLAZE_SEED=\(seed)")
            // Not only what clients see converges: every replica holds the same CRDT state for every document, so a
            // wrong stamp or causal length written by a local fast path cannot hide until a later conflict.
            let states = try r.dbs.map { db in
                try db.read { d in
                    var out: [String: DocumentState] = [:]
                    for row in try Row.fetchAll(
                        d, sql: "SELECT id, state, body FROM docs UNION ALL SELECT id, state, NULL FROM tombstones")
                    {
                        out[row[0]] = try SQLStorage.decode(state: row[1], body: row[2], db.coding)
                    }
                    return out
                }
            }
            #expect(states.allSatisfy { $0 == states[0] }, "CRDT states differ; replay with BLAZE_SEED=\(seed)")
            // Stored texts are canonical: what local writes assemble from pieces equals a fresh encoding.
            for db in r.dbs {
                try db.read { d in
                    for body in try String.fetchAll(d, sql: "SELECT body FROM changes") {
                        let text = try Change(json: try JSONParser().parse(body)).jsonValue.jsonText
                        #expect(text == body, "change text is not canonical (seed \(seed))")
                    }
                    for body in try String.fetchAll(d, sql: "SELECT body FROM docs") {
                        #expect(try JSONParser().parse(body).jsonText == body, "document text is not canonical (seed \(seed))")
                    }
                }
            }
            let parked = try r.dbs.map { db in try db.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM parked") ?? 0 } }
            #expect(parked.allSatisfy { $0 == 0 }, "changes left parked after a full exchange (seed \(seed))")
        }
    }

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

    /// The state text a new document is stored with is the one its state would encode to.
    @Test func createdStateTextMatchesTheGeneralEncoding() throws {
        let stamp = Stamp(hlc: HLC(raw: 1 << 40 | 7), origin: randomNode(), seq: 12, index: 3)
        for coding in [StampCoding.hex, StampCoding(home: stamp.dot.origin), StampCoding(home: randomNode())] {
            for fields: [String: JSONValue] in [[:], ["a": 1], ["a": 1, "B": "x", "c": [1, 2], "d": ["e": .null]]] {
                let state = DocumentState.created(fields: fields, stamp: stamp)
                let text = DocumentState.CreatedStateText(stamp, coding).bytes(fieldCount: fields.count, index: stamp.dot.index)
                #expect(String(decoding: text, as: UTF8.self) == state.compactText(coding))
                #expect(state.compactText(coding) == state.compactJSON(coding).jsonText)
            }
        }
    }

    /// Stored states write the database's home origin as `0`; both forms read back, and `0` means nothing without
    /// a home.
    @Test func homeOriginsAreWrittenShortAndReadBothWays() throws {
        let home = randomNode()
        let coding = StampCoding(home: home)
        let ours = Stamp(hlc: HLC(raw: 5 << 16), origin: home, seq: 3, index: 1)
        let theirs = Stamp(hlc: HLC(raw: 6 << 16), origin: randomNode(), seq: 9, index: 0)
        #expect(ours.jsonValue(coding) == [.int(5 << 16), .int(0), .int(3), .int(1)])
        #expect(theirs.jsonValue(coding) == theirs.jsonValue)
        for stamp in [ours, theirs] {
            #expect(Stamp(json: stamp.jsonValue(coding), coding) == stamp)
            #expect(Stamp(json: stamp.jsonValue, coding) == stamp)
        }
        #expect(Stamp(json: ours.jsonValue(coding)) == nil)
        #expect(Stamp(json: [.int(1), .int(1), .int(1), .int(0)], coding) == nil)
        // A database keeps its home in its file: a store with another node reads it unchanged.
        let t = try TempStore(node: home)
        let db = try t.store.create("h")
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "a", "v": 1]))
        _ = try db.apply(.patch(collection: "c", id: "a", set: ["w": 2]))
        let states = try db.read { try String.fetchAll($0, sql: "SELECT state FROM docs") }
        #expect(states.count == 1 && states[0].contains(",0,") && !states[0].contains(home.hex))
        t.store.closeAll()
        let other = try Store(directory: t.dir, node: randomNode())
        defer { other.closeAll() }
        let reopened = try other.database("h")
        _ = try reopened.apply(.patch(collection: "c", id: "a", set: ["v": 3]))
        #expect(try reopened.get(collection: "c", id: "a") == ["_id": "a", "v": 3, "w": 2])
        let text = try reopened.read { try String.fetchOne($0, sql: "SELECT state FROM docs") } ?? ""
        #expect(text.contains(",0,") && !text.contains(home.hex) && text.contains(other.node.hex))
    }

    /// An inserted document's op records its fields without `_id`, wherever `_id` falls among them, in canonical text.
    @Test func insertedDocumentsRecordTheirFieldsWithoutTheID() throws {
        let t = try TempStore()
        let db = try t.store.create("s")
        let docs: [[String: JSONValue]] = [
            [:], ["A": 1], ["A": 1, "B": 2], ["a": 1], ["A": 1, "z": 2], ["0": 1, "Z": [1], "~": "x"], ["a": ["_id": 1]],
        ]
        for (i, d) in docs.enumerated() {
            _ = try db.apply(.insert(collection: "c", doc: d.merging(["_id": .string("d\(i)")]) { $1 }))
        }
        let changes = try db.changes(since: VersionVector())
        let texts = try db.read { try String.fetchAll($0, sql: "SELECT body FROM changes ORDER BY seq") }
        #expect(changes.count == docs.count)
        for (i, d) in docs.enumerated() where i < changes.count {
            guard case .doc(let op) = changes[i].ops.first else {
                Issue.record("change \(i) is not a document op")
                continue
            }
            #expect(op.set == d && op.key.id == "d\(i)")
            #expect(texts[i] == changes[i].jsonValue.jsonText)
        }
    }

    /// A remote change that creates documents is stored without the engine (`SQLStorage.createIfNew`): each row
    /// holds exactly what the engine makes of the op on a document never seen, whatever its fields; a creation of a
    /// key that has a state (deleted here, or created earlier in the same change) takes the general path.
    @Test func remoteCreationsStoreWhatTheEngineMakes() throws {
        let r = try StoreReplicas(2)
        let (a, b) = (r.dbs[0], r.dbs[1])
        let shapes: [[String: JSONValue]] = [
            [:], ["A": 1], ["a": 1], ["A": 1, "z": "x"], ["0": 1, "Z": [1, ["q": .null]], "~": "x"], ["\u{E9}": 1.5, "k": true],
        ]
        for (i, d) in shapes.enumerated() { _ = try a.apply(.insert(collection: "c", doc: d.merging(["_id": .string("d\(i)")]) { $1 })) }
        // One change that creates a document and then writes it again.
        _ = try a.commit([.insert(collection: "c", doc: ["_id": "twice", "v": 1]), .patch(collection: "c", id: "twice", set: ["v": 2])])
        // A key deleted on b before a's creation of it arrives: the tombstone's causal length wins.
        _ = try b.apply(.insert(collection: "c", doc: ["_id": "gone", "v": 0]))
        _ = try b.apply(.delete(collection: "c", id: "gone"))
        _ = try a.apply(.insert(collection: "c", doc: ["_id": "gone", "v": 9]))
        let changes = try a.changes(since: VersionVector())
        #expect(try b.receive(changes).applied == changes.count)
        let rows = try b.read { d in
            try Row.fetchAll(d, sql: "SELECT id, body, state FROM docs").reduce(into: [String: (String, String)]()) {
                $0[$1[0]] = ($1[1], $1[2])
            }
        }
        var checked = 0
        for change in changes where change.ops.count == 1 {
            guard case .doc(let op) = change.ops[0], op.key.id != "gone" else { continue }
            #expect(op.isPlainCreation)
            var engine = DocumentState()
            engine.apply(op, change: change, index: 0)
            let expected = (JSONValue.object(engine.materialize(id: op.key.id)!).jsonText, engine.compactText(b.coding))
            #expect(rows[op.key.id]?.0 == expected.0, "body of \(op.key.id)")
            #expect(rows[op.key.id]?.1 == expected.1, "state of \(op.key.id)")
            checked += 1
        }
        #expect(checked == shapes.count)
        #expect(try b.get(collection: "c", id: "twice") == ["_id": "twice", "v": 2])
        #expect(rows["gone"] == nil)
        #expect(throws: StoreError.self) { try b.get(collection: "c", id: "gone") }
        // Both replicas end with the same states, a's written by its local paths, b's by the remote ones.
        try r.send(1, 0)
        #expect(try a.stateHash() == (try b.stateHash()))
    }

    /// After a remote creation found no document, the next one is inserted without a lookup first: a patch of the
    /// same shape (causal length 1, only `set`) of a document held here must then still take the general path, and
    /// so must a creation of a deleted key, whichever came before them in the same transaction.
    @Test func creationShapedPatchesAfterNewDocumentsTakeTheGeneralPath() throws {
        let r = try StoreReplicas(2)
        let (a, b) = (r.dbs[0], r.dbs[1])
        _ = try a.commit((0..<4).map { .insert(collection: "c", doc: ["_id": .string("d\($0)"), "v": 0, "w": 0]) })
        _ = try b.apply(.insert(collection: "c", doc: ["_id": "gone", "v": 0]))
        _ = try b.apply(.delete(collection: "c", id: "gone"))
        try r.send(0, 1)
        let held = try a.versionVector()
        for i in 0..<4 {
            _ = try a.apply(.insert(collection: "c", doc: ["_id": .string("n\(i)"), "v": .int(Int64(i))]))
            _ = try a.apply(.patch(collection: "c", id: "d\(i)", set: ["v": .int(Int64(10 + i))]))
        }
        _ = try a.apply(.insert(collection: "c", doc: ["_id": "n4"]))
        _ = try a.apply(.insert(collection: "c", doc: ["_id": "gone", "v": 9]))
        _ = try a.apply(.insert(collection: "c", doc: ["_id": "n5", "v": 5]))
        let changes = try a.changes(since: held)
        #expect(changes.count == 11)
        #expect(changes.allSatisfy { if case .doc(let op) = $0.ops[0] { op.isPlainCreation } else { false } })
        // One transaction: creations, then patches of held rows, alternate.
        #expect(try b.receive(changes).applied == changes.count)
        for i in 0..<4 {
            #expect(try b.get(collection: "c", id: "d\(i)") == ["_id": .string("d\(i)"), "v": .int(Int64(10 + i)), "w": 0])
            #expect(try b.get(collection: "c", id: "n\(i)") == ["_id": .string("n\(i)"), "v": .int(Int64(i))])
        }
        #expect(try b.get(collection: "c", id: "n5") == ["_id": "n5", "v": 5])
        #expect(throws: StoreError.self) { try b.get(collection: "c", id: "gone") }
        #expect(try b.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM docs") } == 10)
        try r.send(1, 0)
        #expect(try a.stateHash() == (try b.stateHash()))
    }

    /// Local patches that only set and unset fields rewrite rows without the engine (checked against it in debug
    /// builds on every patch); whatever mix of fields they write, a replica applying the changes through the engine
    /// ends with the same states.
    @Test func aPatchByAnEquivalentNameReplacesAGroupedField() throws {
        // The Kelvin sign's field is unset at its own stamp (grouped under `p`, absent from the body); a patch of
        // "K", canonically the same name, must write that field as the engine does on any replica.
        let r = try StoreReplicas(2)
        let db = r.dbs[0]
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "x", "a": 1, "b": 1, "\u{212A}": 1]))
        _ = try db.apply(.patch(collection: "c", id: "x", unset: ["\u{212A}"]))
        #expect(try db.read { try String.fetchOne($0, sql: "SELECT state FROM docs") }?.contains(#""p":"#) == true)
        _ = try db.apply(.patch(collection: "c", id: "x", set: ["K": 2]))
        try r.send(0, 1)
        #expect(try db.stateHash() == r.dbs[1].stateHash())
        #expect(try db.get(collection: "c", id: "x").objectValue?.count == 4)
    }

    @Test func setAndUnsetPatchesMatchTheEngine() throws {
        let base = testSeed("replication")
        var rng = SeededRandom(seed: base)
        let r = try StoreReplicas(2)
        // Non-ASCII names too, canonically equivalent to others ("K" and the Kelvin sign, "é" composed and not):
        // those patches must take the general path.
        let names = (0..<6).map { "f\($0)" } + ["K", "\u{212A}", "\u{E9}", "e\u{301}"]
        _ = try r.dbs[0].commit((0..<4).map { .insert(collection: "c", doc: ["_id": .string("d\($0)"), "f0": 0, "f1": 1]) })
        for _ in 0..<400 {
            let id = "d\(Int.random(in: 0..<4, using: &rng))"
            let chosen = names.filter { _ in Bool.random(using: &rng) }
            let unset = chosen.filter { _ in Int.random(in: 0..<4, using: &rng) == 0 }
            var set: [String: JSONValue] = [:]
            for name in chosen where !unset.contains(name) { set[name] = .int(Int64.random(in: 0...9, using: &rng)) }
            let op: WriteOp =
                Int.random(in: 0..<10, using: &rng) == 0
                ? .patch(collection: "c", id: id, incr: ["f5": 1])
                : .patch(collection: "c", id: id, set: set, unset: unset)
            _ = try? r.dbs[0].apply(op)  // an empty patch is refused; that is fine
        }
        try r.syncAll()
        #expect(try r.dbs[0].stateHash() == (try r.dbs[1].stateHash()), "replay with BLAZE_SEED=\(base)")
        let states = try r.dbs.map { db in
            try db.read { d in
                try Row.fetchAll(d, sql: "SELECT id, state, body FROM docs").reduce(into: [String: DocumentState]()) {
                    $0[$1[0]] = try SQLStorage.decode(state: $1[1], body: $1[2], db.coding)
                }
            }
        }
        #expect(states[0] == states[1], "replay with BLAZE_SEED=\(base)")
    }

    @Test func everyLocalTransactionIsExactlyOneChange() async throws {
        let t = try TempStore()
        let db = try t.store.create("x")
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "a", "n": 1]))
        _ = try db.commit([
            .insert(collection: "c", doc: ["_id": "b"]), .patch(collection: "c", id: "a", incr: ["n": 2]),
            .delete(collection: "c", id: "b"),
        ])
        _ = try db.write { tx in try tx.createIndex(collection: "c", fields: ["n"], name: "by_n") }
        _ = try? db.apply(.delete(collection: "c", id: "missing"))  // fails: no change
        let changes = try db.changes(since: VersionVector())
        #expect(changes.map(\.seq) == [1, 2, 3])
        #expect(changes.map(\.ops.count) == [1, 3, 1])
        #expect(changes.allSatisfy { $0.origin == db.node })
        #expect(changes[1].deps == VersionVector([db.node: 1]))
        #expect(try db.versionVector() == VersionVector([db.node: 3]))
        #expect(try db.get(collection: "c", id: "a") == ["_id": "a", "n": 3])
        // A fresh replica that receives the three changes holds the same state, index included.
        let other = try TempStore()
        let replica = try other.store.create("x")
        let report = try replica.receive(changes.reversed())
        #expect(report.applied == 3 && report.parked == 0)
        #expect(try replica.stateHash() == (try db.stateHash()))
        #expect(try replica.indexes().map(\.name) == ["by_n"])
        #expect(try replica.explain(FindQuery(collection: "c", filter: try Filter.parse(["n": 3]))).indexes == ["by_n"])
    }

    @Test func concurrentLoserAppearsInConflictsAndResolutionReplicates() async throws {
        let r = try StoreReplicas(2)
        _ = try r.dbs[0].apply(.insert(collection: "c", doc: ["_id": "d", "x": 0]))
        try r.syncAll()
        _ = try r.dbs[0].apply(.patch(collection: "c", id: "d", set: ["x": 1]))  // sequential overwrite
        try r.syncAll()
        #expect(try r.dbs[1].conflicts().isEmpty, "a sequential overwrite is not a conflict")
        _ = try r.dbs[0].apply(.patch(collection: "c", id: "d", set: ["x": "zero"]))
        _ = try r.dbs[1].apply(.patch(collection: "c", id: "d", set: ["x": "one"]))
        try r.syncAll()
        for db in r.dbs {
            let list = try db.conflicts()
            #expect(list.count == 1)
            let c = try #require(list.first)
            #expect(c.field == "x" && c.losers.count == 1)
            let sides = Set([c.value, c.losers[0].value].compactMap { $0?.stringValue })
            #expect(sides == ["zero", "one"])
            #expect(Set([c.winner!.stamp.dot.origin, c.losers[0].stamp.dot.origin]) == Set(r.dbs.map(\.node)))
        }
        _ = try r.dbs[1].apply(.patch(collection: "c", id: "d", set: ["x": "agreed"]))
        try r.syncAll()
        for db in r.dbs {
            #expect(try db.conflicts().isEmpty)
            #expect(try db.get(collection: "c", id: "d")["x"] == "agreed")
        }
    }

    @Test func malformedRemoteChangesAreRejectedBeforeAnythingApplies() async throws {
        let t = try TempStore()
        let db = try t.store.create("x")
        let evil = Change(
            origin: randomNode(), seq: 1, hlc: HLC(milliseconds: 1), deps: VersionVector(),
            ops: [.index(name: "x\"; DROP TABLE docs; --", collection: "c", fields: ["a"])])
        expectStoreError("invalid_change") { _ = try db.receive([evil]) }
        let badField = Change(
            origin: randomNode(), seq: 1, hlc: HLC(milliseconds: 1), deps: VersionVector(),
            ops: [.doc(DocOp(key: DocKey(collection: "c", id: "d"), cl: 1, set: ["_secret": 1]))])
        expectStoreError("invalid_change") { _ = try db.receive([badField]) }
        #expect(try db.versionVector() == VersionVector())
    }
}
