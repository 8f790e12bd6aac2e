import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDB
import Testing

@testable import BlazeStore

/// Patches of nested fields by dotted path, through the store (Protocol/SYNC.md §2, "Nested fields").
@Suite struct NestedFieldPatches {
    @Test func patchesEditNestedFieldsByPathAndQueriesSeeThem() throws {
        let t = try TempStore()
        let db = try t.store.create("db")
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "p", "address": ["city": "Bergen", "zip": "5003"], "n": 1]))
        _ = try db.write { try $0.createIndex(collection: "c", fields: ["address.city"], name: nil) }
        _ = try db.apply(.patch(collection: "c", id: "p", set: ["address.city": "Oslo", "geo.lat": .double(59.9)], unset: ["address.zip"]))
        _ = try db.apply(.patch(collection: "c", id: "p", incr: ["stats.views": 2]))
        _ = try db.apply(.patch(collection: "c", id: "p", incr: ["stats.views": 3], add: ["address.tags": ["a", "b"]]))
        _ = try db.apply(.patch(collection: "c", id: "p", remove: ["address.tags": ["a"]]))
        let expected: JSONValue = [
            "_id": "p", "n": 1, "address": ["city": "Oslo", "tags": ["b"]], "geo": ["lat": .double(59.9)],
            "stats": ["views": 5],
        ]
        #expect(try db.get(collection: "c", id: "p") == expected)
        let found = try db.find(FindQuery(collection: "c", filter: try Filter.parse(["address.city": "Oslo"]), limit: 10))
        #expect(found.docs == [expected])
        // A top-level patch of a document with nested state takes the general path and keeps the nested fields.
        _ = try db.apply(.patch(collection: "c", id: "p", set: ["n": 2]))
        #expect(try db.get(collection: "c", id: "p")["address"] == ["city": "Oslo", "tags": ["b"]])
        #expect(try db.get(collection: "c", id: "p")["n"] == 2)
        // In one transaction: a nested edit is seen by the next operation.
        _ = try db.commit([
            .patch(collection: "c", id: "p", set: ["address.city": "Tromsø"]),
            .patch(collection: "c", id: "p", incr: ["stats.views": 1]),
        ])
        #expect(try db.get(collection: "c", id: "p")["address"]?["city"] == "Tromsø")
        #expect(try db.get(collection: "c", id: "p")["stats"] == ["views": 6])
        // A put still replaces the whole document.
        _ = try db.apply(.put(collection: "c", id: "p", doc: ["address": ["city": "Bodø"]]))
        #expect(try db.get(collection: "c", id: "p") == ["_id": "p", "address": ["city": "Bodø"]])
        // A replica that receives the changes holds the same document and state hash.
        let other = try TempStore()
        let replica = try other.store.create("db")
        _ = try replica.receive(try db.changes(since: VersionVector()))
        #expect(try replica.stateHash() == (try db.stateHash()))
    }

    /// Field names with a single quote (doubled in the SQL literal of their JSON path) and other punctuation are
    /// filtered, sorted and indexed like any other.
    @Test func pathsWithQuotesAndPunctuationQueryAndIndex() throws {
        for (path, literal) in [
            ("a", #"'$."a"'"#), ("it's", #"'$."it''s"'"#), ("o'k.''", #"'$."o''k"."''''"'"#), ("é.x y", #"'$."é"."x y"'"#),
        ] {
            #expect(QueryCompiler.pathLiteral(try FieldPath(path)) == literal)
        }
        let t = try TempStore()
        let db = try t.store.create("db")
        for i in 0..<6 {
            _ = try db.apply(.insert(collection: "c", doc: ["_id": .string("d\(i)"), "it's": ["o'k": .int(Int64(i % 3))]]))
        }
        let query = FindQuery(
            collection: "c", filter: try Filter.parse(["it's.o'k": ["$gte": 1]]), sort: try SortKey.parse(["-it's.o'k"] as JSONValue),
            limit: 10)
        let before = try db.find(query).docs.map { $0["_id"] }
        #expect(before == ["d5", "d2", "d4", "d1"])
        _ = try db.write { try $0.createIndex(collection: "c", fields: ["it's.o'k"], name: "quoted") }
        #expect(try db.find(query).docs.map { $0["_id"] } == before)
    }

    /// The path parser splits and refuses exactly as the plain definition does (split on '.', no empty segment, no
    /// '"', '\\' or control character), over random paths from an alphabet of the characters that matter.
    @Test func pathParsingMatchesItsDefinition() {
        func reference(_ path: String) -> [String]? {
            let segments = path.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
            guard !path.isEmpty, segments.allSatisfy({ !$0.isEmpty }) else { return nil }
            let refused = segments.contains { s in
                s.unicodeScalars.contains { $0 == "\"" || $0 == "\\" || $0.value < 0x20 }
            }
            return refused ? nil : segments
        }
        let alphabet: [Character] = ["a", "b", ".", "\"", "\\", "\n", "\u{1}", "é", "'", " ", "_", "\u{7f}", "😀"]
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<5000 {
            let path = String((0..<Int.random(in: 0...6, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! })
            #expect((try? Names.parsePath(path)) == reference(path), "\(path.debugDescription)")
        }
    }

    @Test func badPathsAreRefusedAndNothingIsWritten() throws {
        let t = try TempStore()
        let db = try t.store.create("db")
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "p", "n": 1, "list": [1, 2], "o": ["x": "s"]]))
        let before = try db.get(collection: "c", id: "p")
        expectStoreError("reserved_field") { _ = try db.apply(.patch(collection: "c", id: "p", set: ["_id.x": 1])) }
        expectStoreError("reserved_field") { _ = try db.apply(.patch(collection: "c", id: "p", set: ["_id": "q"])) }
        expectStoreError("reserved_field") { _ = try db.apply(.patch(collection: "c", id: "p", unset: ["_meta.a"])) }
        for empty in ["a..b", "a.", ".a", "."] {
            expectStoreError("invalid_path") { _ = try db.apply(.patch(collection: "c", id: "p", set: [empty: 1])) }
            expectStoreError("invalid_path") { _ = try db.apply(.patch(collection: "c", id: "p", incr: [empty: 1])) }
        }
        let deep = (0...Names.maxPathSegments).map { "s\($0)" }.joined(separator: ".")
        expectStoreError("invalid_path") { _ = try db.apply(.patch(collection: "c", id: "p", set: [deep: 1])) }
        // Through values that are not objects: a number, an array, a string inside an object.
        expectStoreError("invalid_path") { _ = try db.apply(.patch(collection: "c", id: "p", set: ["n.x": 1])) }
        expectStoreError("invalid_path") { _ = try db.apply(.patch(collection: "c", id: "p", incr: ["list.0": 1])) }
        expectStoreError("invalid_path") { _ = try db.apply(.patch(collection: "c", id: "p", add: ["o.x.y": [1]])) }
        // An object and a field inside it in one patch.
        expectStoreError("invalid_patch") { _ = try db.apply(.patch(collection: "c", id: "p", set: ["o": [:], "o.x": 1])) }
        expectStoreError("invalid_patch") { _ = try db.apply(.patch(collection: "c", id: "p", set: ["o.y": 1], unset: ["o"])) }
        expectStoreError("invalid_patch") { _ = try db.apply(.patch(collection: "c", id: "p", incr: ["o.a.b": 1], remove: ["o.a": [1]])) }
        // Field names hold no '.' (it separates a path's segments).
        expectStoreError("invalid_field") { _ = try db.apply(.insert(collection: "c", doc: ["a.b": 1])) }
        expectStoreError("invalid_field") { _ = try db.apply(.put(collection: "c", id: "q", doc: ["ok": 1, "a.b": 1])) }
        expectStoreError("document_not_found") { _ = try db.apply(.patch(collection: "c", id: "nope", set: ["a.b": 1])) }
        #expect(try db.get(collection: "c", id: "p") == before)
        // A path that goes through a missing object creates it; siblings are fine.
        _ = try db.apply(.patch(collection: "c", id: "p", set: ["m.k.v": 1, "o.y": 2]))
        #expect(try db.get(collection: "c", id: "p")["m"] == ["k": ["v": 1]])
        #expect(try db.get(collection: "c", id: "p")["o"] == ["x": "s", "y": 2])
    }

    @Test func concurrentNestedEditsFromTwoStoresMerge() throws {
        let ta = try TempStore(), tb = try TempStore()
        let a = try ta.store.create("db"), b = try tb.store.create("db")
        _ = try a.apply(.insert(collection: "c", doc: ["_id": "p", "address": ["city": "Bergen", "zip": "5003"], "stats": ["views": 1]]))
        _ = try b.receive(try a.changes(since: VersionVector()))
        _ = try a.apply(.patch(collection: "c", id: "p", set: ["address.city": "Oslo", "note.text": "from a"], incr: ["stats.views": 10]))
        _ = try b.apply(.patch(collection: "c", id: "p", set: ["address.zip": "0150", "note.text": "from b"], incr: ["stats.views": 100]))
        _ = try b.receive(try a.changes(since: try b.versionVector()))
        _ = try a.receive(try b.changes(since: try a.versionVector()))
        #expect(try a.stateHash() == (try b.stateHash()))
        let doc = try a.get(collection: "c", id: "p")
        #expect(doc["address"] == ["city": "Oslo", "zip": "0150"] && doc["stats"] == ["views": 111])
        // Both wrote note.text: one wins everywhere and the other is listed as its conflict.
        let conflicts = try a.conflicts(collection: "c")
        #expect(conflicts.count == 1 && conflicts.first?.field == "note.text")
        let winner = try #require(doc["note"]?["text"])
        #expect(conflicts.first?.value == winner && conflicts.first?.losers.count == 1)
        #expect(conflicts.first?.losers.first?.value != winner)
        #expect(try b.conflicts(collection: "c").map(\.field) == ["note.text"])
    }
}
