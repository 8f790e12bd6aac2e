import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDB
import Synchronization
import Testing

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

func expectStoreError(_ kind: String, _ body: () throws -> Void) {
    do {
        try body()
        Issue.record("expected \(kind), nothing was thrown")
    } catch let e as StoreError {
        #expect(e.kind == kind, "got \(e)")
    } catch {
        Issue.record("expected StoreError \(kind), got \(error)")
    }
}

@Suite struct DatabaseRegistry {
    @Test func createListDropAndReopen() async throws {
        let t = try TempStore()
        _ = try t.store.create("a")
        _ = try t.store.create("b-2.x")
        #expect(try t.store.list() == ["a", "b-2.x"])
        expectStoreError("database_exists") { _ = try t.store.create("a") }
        try t.store.drop("a")
        #expect(try t.store.list() == ["b-2.x"])
        expectStoreError("database_not_found") { _ = try t.store.database("a") }
        expectStoreError("database_not_found") { try t.store.drop("a") }
        for bad in ["", ".hidden", "a/b", "a b", String(repeating: "x", count: 65), "é"] {
            expectStoreError("invalid_name") { _ = try t.store.create(bad) }
        }
    }

    /// Lookups are served from per-thread shards: every thread must see each create, drop, re-create and close.
    @Test func everyThreadSeesOpensDropsAndCloses() async throws {
        let t = try TempStore()
        let store = t.store
        let threads = 64  // more than the shards, so that every shard is read
        func lookups() -> [BlazeDatabase?] {
            let found = Mutex([BlazeDatabase?](repeating: nil, count: threads))
            DispatchQueue.concurrentPerform(iterations: threads) { i in
                let db = try? store.database("a")
                found.withLock { $0[i] = db }
            }
            return found.withLock { $0 }
        }
        let first = try t.store.create("a")
        #expect(lookups().allSatisfy { $0 === first })
        try t.store.drop("a")
        #expect(lookups().allSatisfy { $0 == nil })
        expectStoreError("database_not_found") { _ = try t.store.database("a") }
        let second = try t.store.create("a")
        #expect(second !== first)
        #expect(lookups().allSatisfy { $0 === second })
        // Closed, the database is opened again (once) on the next lookup, and every thread gets that one.
        t.store.closeAll()
        let reopened = lookups()
        #expect(reopened.allSatisfy { $0 != nil && $0 !== second && $0 === reopened[0] })
        // A name that was never valid is refused as before, whatever the shards hold.
        expectStoreError("invalid_name") { _ = try t.store.database("a/b") }
    }

    @Test func dataSurvivesReopen() async throws {
        let t = try TempStore()
        _ = try t.store.create("db").apply(.insert(collection: "c", doc: ["_id": "x", "v": 1.5]))
        t.store.closeAll()
        let reopened = try Store(directory: t.dir, node: t.store.node)
        #expect(try reopened.database("db").get(collection: "c", id: "x") == ["_id": "x", "v": 1.5])
        reopened.closeAll()
    }

    @Test func databaseUsesWALAndFullSync() async throws {
        let t = try TempStore()
        let db = try t.store.create("db")
        // A synchronous closure, so that GRDB's synchronous write is chosen inside this async test.
        let pragmas: () throws -> (String?, Int?) = { try db.connections.write { db in
            (try String.fetchOne(db, sql: "PRAGMA journal_mode"), try Int.fetchOne(db, sql: "PRAGMA synchronous"))
        } }
        let (mode, sync) = try pragmas()
        #expect(mode == "wal")
        #expect(sync == 2)  // FULL
    }
}

@Suite struct DocumentWrites {
    @Test func insertGetPutPatchDelete() async throws {
        let t = try TempStore()
        let db = try t.store.create("db")
        let generated = try db.apply(.insert(collection: "c", doc: ["a": 1])).id
        #expect(generated.count == 36)
        #expect(try db.get(collection: "c", id: generated) == ["_id": .string(generated), "a": 1])
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "k", "a": 1, "b": ["x": true]]))
        expectStoreError("document_exists") { _ = try db.apply(.insert(collection: "c", doc: ["_id": "k"])) }
        let put = try db.apply(.put(collection: "c", id: "k", doc: ["z": .null]))
        #expect(put.created == false)
        #expect(try db.get(collection: "c", id: "k") == ["_id": "k", "z": .null])
        #expect(try db.apply(.put(collection: "c", id: "new", doc: [:])).created == true)
        _ = try db.apply(.patch(collection: "c", id: "k", set: ["a": 2, "s": "x"], unset: ["z"]))
        let got = try db.get(collection: "c", id: "k"); #expect(got == ["_id": "k", "a": 2, "s": "x"], "\(got.jsonText)")
        #expect(try db.get(collection: "c", id: "k", fields: [FieldPath("s")]) == ["_id": "k", "s": "x"])
        _ = try db.apply(.delete(collection: "c", id: "k"))
        expectStoreError("document_not_found") { _ = try db.get(collection: "c", id: "k") }
        expectStoreError("document_not_found") { _ = try db.apply(.delete(collection: "c", id: "k")) }
        expectStoreError("document_not_found") {
            _ = try db.apply(.patch(collection: "c", id: "k", set: ["a": 1], unset: []))
        }
        expectStoreError("document_not_found") { _ = try db.get(collection: "nope", id: "k") }
        #expect(try db.getMany(collection: "c", ids: ["new", "missing"]) == [["_id": "new"], .null])
    }

    /// Ids are bytes: "é" composed and decomposed are canonically equivalent strings but two documents, in one
    /// transaction as in separate ones, and both replicate.
    @Test func canonicallyEquivalentIDsAreDistinctDocuments() async throws {
        let composed = "caf\u{E9}"
        let decomposed = "cafe\u{301}"
        #expect(composed == decomposed)  // as Swift strings
        #expect(DocKey(collection: "c", id: composed) != DocKey(collection: "c", id: decomposed))
        #expect(DocKey(collection: "c", id: composed) == DocKey(collection: "c", id: "caf\u{E9}"))
        #expect(DocKey(collection: "c", id: composed).hashValue == DocKey(collection: "c", id: "caf\u{E9}").hashValue)
        #expect(DocKey(collection: "ab", id: "c") != DocKey(collection: "a", id: "bc"))
        let t = try TempStore()
        let db = try t.store.create("db")
        _ = try db.commit([
            .insert(collection: "c", doc: ["_id": .string(composed), "n": 1]),
            .insert(collection: "c", doc: ["_id": .string(decomposed), "n": 2]),
            .patch(collection: "c", id: composed, set: ["m": 1]),
        ])
        _ = try db.apply(.patch(collection: "c", id: decomposed, set: ["m": 2]))
        #expect(try db.get(collection: "c", id: composed) == ["_id": .string(composed), "m": 1, "n": 1])
        #expect(try db.get(collection: "c", id: decomposed) == ["_id": .string(decomposed), "m": 2, "n": 2])
        _ = try db.apply(.delete(collection: "c", id: composed))
        #expect(try db.count(collection: "c", filter: .all) == 1)
        let other = try TempStore()
        let replica = try other.store.create("db")
        _ = try replica.receive(try db.changes(since: VersionVector()))
        #expect(try replica.stateHash() == (try db.stateHash()))
        #expect(try replica.get(collection: "c", id: decomposed) == ["_id": .string(decomposed), "m": 2, "n": 2])
    }

    @Test func rejectsInvalidDocuments() async throws {
        let t = try TempStore(limits: { var l = StoreLimits(); l.maxDocumentBytes = 100; return l }())
        let db = try t.store.create("db")
        expectStoreError("reserved_field") { _ = try db.apply(.insert(collection: "c", doc: ["_x": 1])) }
        expectStoreError("reserved_field") { _ = try db.apply(.insert(collection: "c", doc: ["_\u{301}x": 1])) }
        expectStoreError("reserved_field") { _ = try db.apply(.insert(collection: "c", doc: ["_id": "ok", "a": 1, "_y": 1])) }
        expectStoreError("reserved_field") { _ = try db.apply(.put(collection: "c", id: "ok", doc: ["_id": "ok", "_y": 1])) }
        expectStoreError("invalid_field") { _ = try db.apply(.insert(collection: "c", doc: ["": 1])) }
        expectStoreError("invalid_field") { _ = try db.apply(.put(collection: "c", id: "ok", doc: ["": 1, "a": 2])) }
        expectStoreError("invalid_id") { _ = try db.apply(.insert(collection: "c", doc: ["_id": 5])) }
        expectStoreError("invalid_id") { _ = try db.apply(.insert(collection: "c", doc: ["_id": ""])) }
        expectStoreError("invalid_name") { _ = try db.apply(.insert(collection: "a b", doc: [:])) }
        expectStoreError("document_too_large") {
            _ = try db.apply(.insert(collection: "c", doc: ["s": .string(String(repeating: "x", count: 200))]))
        }
        expectStoreError("invalid_patch") {
            _ = try db.apply(.patch(collection: "c", id: "x", set: ["a": 1], unset: ["a"]))
        }
        expectStoreError("id_mismatch") { _ = try db.apply(.put(collection: "c", id: "a", doc: ["_id": "b"])) }
        // The limit holds on every write path: a patch that rewrites the stored text, a replacing put, and an insert
        // over a deleted document; the document stays as it was.
        let big: JSONValue = .string(String(repeating: "y", count: 120))
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "p", "n": 1]))
        expectStoreError("document_too_large") { _ = try db.apply(.patch(collection: "c", id: "p", set: ["s": big])) }
        expectStoreError("document_too_large") { _ = try db.apply(.put(collection: "c", id: "p", doc: ["s": big])) }
        #expect(try db.get(collection: "c", id: "p") == ["_id": "p", "n": 1])
        _ = try db.apply(.delete(collection: "c", id: "p"))
        expectStoreError("document_too_large") { _ = try db.apply(.insert(collection: "c", doc: ["_id": "p", "s": big])) }
        #expect(try db.count(collection: "c", filter: .all) == 0)
    }

    @Test func transactionIsAllOrNothing() async throws {
        let t = try TempStore()
        let db = try t.store.create("db")
        do {
            _ = try db.commit([
                .insert(collection: "c", doc: ["_id": "1"]), .insert(collection: "c", doc: ["_id": "2"]),
                .delete(collection: "c", id: "missing"),
            ])
            Issue.record("transaction with a failing op committed")
        } catch let e as StoreError {
            #expect(e.kind == "document_not_found" && e.details["op"] == 2)
        }
        expectStoreError("document_not_found") { _ = try db.get(collection: "c", id: "1") }
        #expect(try db.collections().isEmpty, "the failed transaction created no collection")
        let results = try db.commit([
            .insert(collection: "c", doc: ["_id": "1"]), .patch(collection: "c", id: "1", set: ["v": 1], unset: []),
            .put(collection: "d", id: "2", doc: [:]),
        ])
        #expect(results.map(\.id) == ["1", "1", "2"])
        #expect(try db.collections() == [CollectionInfo(name: "c", count: 1), CollectionInfo(name: "d", count: 1)])
    }

    @Test func numbersRoundTripThroughSQLiteExactly() async throws {
        let t = try TempStore()
        let db = try t.store.create("db")
        let doc: [String: JSONValue] = [
            "_id": "n", "neg0": .double(-0.0), "sub": .double(.leastNonzeroMagnitude), "max": .int(.max),
            "min": .int(.min), "one": .double(1), "big": .int(9_007_199_254_740_993), "pi": .double(Double.pi),
            "nfd": "e\u{301}",
        ]
        _ = try db.apply(.insert(collection: "c", doc: doc))
        let back = try db.get(collection: "c", id: "n")
        #expect(back.jsonText == JSONValue.object(doc).jsonText)
        if case .double(let z)? = back["neg0"] { #expect(z.sign == .minus) } else { Issue.record("-0.0 lost") }
        // The NFD string is found by its own bytes and not by the NFC spelling.
        #expect(try db.count(collection: "c", filter: Filter.parse(["nfd": "e\u{301}"])) == 1)
        #expect(try db.count(collection: "c", filter: Filter.parse(["nfd": "\u{e9}"])) == 0)
        #expect(try db.count(collection: "c", filter: Filter.parse(["big": .int(9_007_199_254_740_992)])) == 0)
        #expect(try db.count(collection: "c", filter: Filter.parse(["big": .int(9_007_199_254_740_993)])) == 1)
    }
}

/// Stored bodies are spliced into response lines as they are, unless one holds a line break.
@Suite struct SplicedBodies {
    @Test func aBodyWithALineBreakIsWrittenAgainAndOthersPassAsTheyAre() throws {
        let plain = Array(#"{"_id":"a","s":"x y","n":1}"#.utf8)
        #expect(try BlazeDatabase.spliceable(plain) == plain)
        #expect(try BlazeDatabase.spliceable([]) == [])
        for raw in ["{\"_id\":\"a\",\n\"n\":1}", "{\"_id\":\"a\",\r\"n\":1}", "{\"_id\":\"a\",\"n\":1}\n"] {
            let out = try BlazeDatabase.spliceable(Array(raw.utf8))
            #expect(!out.contains(0x0A) && !out.contains(0x0D))
            #expect(try JSONParser().parse(out) == (try JSONParser().parse(raw)))
        }
    }
}

@Suite struct FilterSemantics {
    static let docs: [[String: JSONValue]] = [
        ["_id": "1", "a": 1, "s": "apple", "t": ["x", "y"], "n": ["x": 1]],
        ["_id": "2", "a": 2.5, "s": "banana", "t": [], "n": ["x": "1"]],
        ["_id": "3", "a": true, "s": "", "t": "x", "n": .null],
        ["_id": "4", "a": .null, "s": "apricot"],
        ["_id": "5", "a": "1", "t": [1, ["x"]]],
        ["_id": "6", "a": [1], "s": "Apple"],
    ]

    /// Each row pins one rule of Protocol/QUERIES.md with a hand-computed answer.
    @Test(arguments: [
        (#"{"a":1}"#, ["1"]),  // numbers match numbers only, not true or "1"
        (#"{"a":1.0}"#, ["1"]),
        (#"{"a":true}"#, ["3"]),
        (#"{"a":null}"#, ["4"]),  // null matches null and missing... (5 and 6 have a)
        (#"{"s":null}"#, ["5"]),
        (#"{"a":{"$gt":1}}"#, ["2"]),
        (#"{"a":{"$gte":1,"$lt":3}}"#, ["1", "2"]),
        (#"{"a":{"$ne":1}}"#, ["2", "3", "4", "5", "6"]),
        (#"{"a":{"$in":[1,"1",false]}}"#, ["1", "5"]),
        (#"{"a":{"$nin":[1,"1"]}}"#, ["2", "3", "4", "6"]),
        (#"{"a":{"$exists":false}}"#, []),
        (#"{"s":{"$exists":false}}"#, ["5"]),
        (#"{"n":{"$exists":true}}"#, ["1", "2", "3"]),
        (#"{"n.x":1}"#, ["1"]),
        (#"{"n.x":{"$exists":true}}"#, ["1", "2"]),
        (#"{"t":{"$contains":"x"}}"#, ["1", "3"]),  // array element or substring
        (#"{"t":{"$contains":["x"]}}"#, ["5"]),
        (#"{"s":{"$prefix":"ap"}}"#, ["1", "4"]),  // case-sensitive
        (#"{"s":{"$prefix":""}}"#, ["1", "2", "3", "4", "6"]),
        (#"{"a":[1]}"#, ["6"]),
        (#"{"$or":[{"a":1},{"s":"banana"}]}"#, ["1", "2"]),
        (#"{"$not":{"s":{"$prefix":"a"}}}"#, ["2", "3", "5", "6"]),
        (#"{"s":{"$not":{"$gt":"b"}}}"#, ["1", "3", "4", "5", "6"]),
        (#"{"_id":{"$in":["2","9"]}}"#, ["2"]),
        (#"{"_id":{"$gte":"5"}}"#, ["5", "6"]),
    ])
    func filterMatchesExactly(filter: String, expected: [String]) async throws {
        let t = try TempStore()
        let db = try t.store.create("db")
        _ = try db.commit(Self.docs.map { .insert(collection: "c", doc: $0) })
        let f = try Filter.parse(try JSONParser().parse(filter))
        let sql = try db.find(FindQuery(collection: "c", filter: f, limit: 100)).docs.compactMap { $0["_id"]?.stringValue }
        let memory = Self.docs.filter { f.matches($0) }.compactMap { $0["_id"]?.stringValue }
        #expect(sql == expected, "SQL: \(filter)")
        #expect(memory == expected, "in-memory: \(filter)")
    }

    @Test(arguments: [
        #"{"a":{"$gt":null}}"#, #"{"a":{"$bogus":1}}"#, #"{"$and":[]}"#, #"{"a":{"$in":5}}"#, #"{"a":{"$exists":1}}"#,
        #"{"a":{"$prefix":1}}"#, #"{"a":{"$gt":1,"b":2}}"#, #"{"a..b":1}"#, #"{"$where":"x"}"#, #"[1]"#,
    ])
    func rejectsBadFilters(filter: String) throws {
        #expect(throws: StoreError.self) { try Filter.parse(try JSONParser().parse(filter)) }
    }
}

@Suite struct GeneratedIDs {
    @Test func generatedIDsAreUUIDv7ShapedAndSortInCreationOrder() {
        let ids = (0..<5000).map { _ in DocumentID.generate() }
        #expect(Set(ids).count == ids.count)
        #expect(ids == ids.sorted(by: utf8Less), "ids made in sequence must sort in creation order")
        for id in ids.prefix(50) {
            let parts = id.split(separator: "-").map(\.count)
            #expect(parts == [8, 4, 4, 4, 12], "\(id)")
            #expect(id.allSatisfy { "0123456789abcdef-".contains($0) }, "\(id)")
            #expect(Array(id)[14] == "7", "version nibble: \(id)")
            #expect("89ab".contains(Array(id)[19]), "variant bits: \(id)")
        }
        // The random tail (62 bits) is drawn afresh for every id: 5,000 of them do not repeat.
        #expect(Set(ids.map { $0.suffix(17) }).count == ids.count)
    }
}
