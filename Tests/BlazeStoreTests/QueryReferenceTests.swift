import BlazeProtocol
import Foundation
import BlazeTestSupport
import Testing

@testable import BlazeStore

/// Random documents and queries over a small value space, so filters hit, miss, and collide across types.
struct QueryGen {
    var rng: SeededRandom

    static let strings: [String] = ["", "a", "ab", "abc", "b", "B", "é", "e\u{301}", "日本", "a\u{10FFFF}", "ap", "apple"]
    static let numbers: [JSONValue] = [
        0, 1, -1, 2, 5, -5, .double(-0.0), .double(0.5), .double(1.0), .double(2.5), .double(.leastNonzeroMagnitude),
        .int(9_007_199_254_740_993), .double(9_007_199_254_740_992), .int(.max), .double(1e300),
    ]

    mutating func pick<T>(_ xs: [T]) -> T { xs.randomElement(using: &rng)! }
    mutating func chance(_ p: Double) -> Bool { Double.random(in: 0..<1, using: &rng) < p }

    mutating func scalar() -> JSONValue {
        switch Int.random(in: 0..<10, using: &rng) {
        case 0: return .null
        case 1: return .bool(chance(0.5))
        case 2, 3, 4: return pick(Self.numbers)
        case 5, 6, 7: return .string(pick(Self.strings))
        case 8: return .int(Int64.random(in: -3...3, using: &rng))
        default: return .double(Double(Int.random(in: -6...6, using: &rng)) / 2)
        }
    }

    mutating func value(depth: Int = 0) -> JSONValue {
        if depth < 2 && chance(0.12) {
            return .array((0..<Int.random(in: 0...3, using: &rng)).map { _ in chance(0.8) ? scalar() : value(depth: depth + 1) })
        }
        if depth < 2 && chance(0.1) {
            var o: [String: JSONValue] = [:]
            for k in ["x", "y"] where chance(0.7) { o[k] = value(depth: depth + 1) }
            return .object(o)
        }
        return scalar()
    }

    mutating func document(_ i: Int) -> [String: JSONValue] {
        var d: [String: JSONValue] = ["_id": .string(String(format: "d%05d", i))]
        for f in ["a", "b", "c", "t"] where chance(0.85) { d[f] = value() }
        if chance(0.7) {
            var n: [String: JSONValue] = [:]
            for k in ["x", "y"] where chance(0.8) { n[k] = value(depth: 1) }
            d["n"] = chance(0.9) ? .object(n) : scalar()
        }
        return d
    }

    static let paths = ["a", "b", "c", "t", "n", "n.x", "n.y", "_id", "zz"]

    mutating func operand(for path: String) -> JSONValue {
        if path == "_id" { return .string(String(format: "d%05d", Int.random(in: 0..<10_000, using: &rng))) }
        return chance(0.85) ? scalar() : value(depth: 1)
    }

    mutating func comparable(for path: String) -> JSONValue {
        var v: JSONValue
        repeat { v = operand(for: path) } while TypeRank.of(v) == 0 || TypeRank.of(v) > 3
        return v
    }

    mutating func condition(_ path: String) -> JSONValue {
        switch Int.random(in: 0..<12, using: &rng) {
        case 0, 1: return operand(for: path)
        case 2: return ["$ne": operand(for: path)]
        case 3: return [pick(["$gt", "$gte", "$lt", "$lte"]): comparable(for: path)]
        case 4:
            return ["$gte": comparable(for: path), "$lt": comparable(for: path)]
        case 5: return ["$in": .array((0..<Int.random(in: 0...4, using: &rng)).map { _ in operand(for: path) })]
        case 6: return ["$nin": .array((0..<Int.random(in: 0...3, using: &rng)).map { _ in operand(for: path) })]
        case 7: return ["$exists": .bool(chance(0.5))]
        case 8: return ["$contains": chance(0.5) ? .string(pick(Self.strings)) : scalar()]
        case 9: return ["$prefix": .string(pick(["", "a", "ap", "e", "日", "d0", "d01", "B"]))]
        case 10: return ["$not": [pick(["$gt", "$lte"]): comparable(for: path)]]
        default: return ["$eq": operand(for: path)]
        }
    }

    mutating func filter(depth: Int = 0) -> JSONValue {
        if depth < 2 && chance(0.25) {
            let op = pick(["$and", "$or", "$not"])
            if op == "$not" { return ["$not": filter(depth: depth + 1)] }
            return .object([op: .array((0..<Int.random(in: 1...3, using: &rng)).map { _ in filter(depth: depth + 1) })])
        }
        var o: [String: JSONValue] = [:]
        for _ in 0..<Int.random(in: 1...2, using: &rng) {
            let p = pick(Self.paths)
            o[p] = condition(p)
        }
        return .object(o)
    }

    mutating func sort() -> [String] {
        (0..<Int.random(in: 0...3, using: &rng)).map { _ in (chance(0.5) ? "-" : "") + pick(Array(Self.paths.dropLast())) }
    }
}

/// The expected order: each key by `TypeRank.compare` in its direction, then `_id` by bytes in the last key's direction.
func referenceSort(_ docs: [[String: JSONValue]], _ keys: [SortKey]) -> [[String: JSONValue]] {
    let idDescending = keys.last?.descending ?? false
    return docs.sorted { x, y in
        for key in keys {
            let c = TypeRank.compare(key.path.lookup(in: x), key.path.lookup(in: y))
            if c != 0 { return key.descending ? c > 0 : c < 0 }
        }
        let (a, b) = (x["_id"]!.stringValue!, y["_id"]!.stringValue!)
        return idDescending ? utf8Less(b, a) : utf8Less(a, b)
    }
}

@Suite struct QueryReference {
    @Test func randomQueriesMatchReferenceWithAndWithoutIndexes() async throws {
        let seed = testSeed("query reference")
        var gen = QueryGen(rng: SeededRandom(seed: seed))
        let t = try TempStore()
        let db = try t.store.create("q")
        let docs = (0..<10_000).map { gen.document($0) }
        for chunk in stride(from: 0, to: docs.count, by: 1000) {
            _ = try db.commit(docs[chunk..<min(chunk + 1000, docs.count)].map { .insert(collection: "c", doc: $0) })
        }
        struct Case {
            let whereJSON: JSONValue
            let sortJSON: [String]
            let expected: [String]
            let pageSizes: [Int]
        }
        var cases: [Case] = []
        for _ in 0..<500 {
            let w = gen.filter()
            let s = gen.sort()
            let filter = try Filter.parse(w)
            let keys = try SortKey.parse(.array(s.map(JSONValue.string)))
            let expected = referenceSort(docs.filter { filter.matches($0) }, keys).map { $0["_id"]!.stringValue! }
            let pages = Int.random(in: 1...4, using: &gen.rng)
            let size = max(1, (expected.count + pages - 1) / pages) + Int.random(in: 0...1, using: &gen.rng)
            cases.append(Case(whereJSON: w, sortJSON: s, expected: expected, pageSizes: [min(size, 10_000)]))
        }
        let matchedSome = cases.filter { !$0.expected.isEmpty && $0.expected.count < docs.count }.count
        #expect(matchedSome > 150, "generator too weak: only \(matchedSome) selective queries (seed \(seed))")

        func runAll(_ label: String) throws -> Int {
            var failures = 0
            for (i, c) in cases.enumerated() {
                var q = FindQuery(
                    collection: "c", filter: try Filter.parse(c.whereJSON),
                    sort: try SortKey.parse(.array(c.sortJSON.map(JSONValue.string))), limit: c.pageSizes[0])
                var got: [String] = []
                var pages = 0
                while true {
                    let page = try db.find(q)
                    got += page.docs.map { $0["_id"]!.stringValue! }
                    pages += 1
                    guard let next = page.cursor, pages < 20 else { break }
                    q.cursor = try QueryCursor.decode(next, for: q)
                }
                let count = try db.count(collection: "c", filter: q.filter)
                if got != c.expected || count != c.expected.count {
                    failures += 1
                    if failures <= 3 {
                        Issue.record(
                            """
                            \(label) case \(i) (seed \(seed), replay with BLAZE_SEED=\(seed)): where \(c.whereJSON.jsonText) \
                            sort \(c.sortJSON): expected \(c.expected.count) \(c.expected.prefix(8)), got \(got.count) \
                            \(got.prefix(8)), count \(count)
                            """)
                    }
                }
            }
            return failures
        }
        #expect(try runAll("no index") == 0)
        for fields in [["a"], ["b"], ["c", "a"], ["n.x"], ["t"], ["_id"], ["n.y", "b"]] {
            _ = try db.write { tx in try tx.createIndex(collection: "c", fields: fields, name: nil) }
        }
        #expect(try runAll("indexed") == 0)
    }

    @Test func explainShowsTheIndexThatMatches() async throws {
        let t = try TempStore()
        let db = try t.store.create("q")
        _ = try db.commit(
            (0..<5000).map { i in
                .insert(
                    collection: "c",
                    doc: ["a": .int(Int64(i)), "b": .string("s\(i % 500)"), "n": ["x": .int(Int64(i % 700))]])
            })
        func used(_ w: JSONValue, sort: [String] = []) throws -> [String] {
            try db.explain(
                FindQuery(
                    collection: "c", filter: try Filter.parse(w), sort: try SortKey.parse(.array(sort.map(JSONValue.string))))
            ).indexes
        }
        #expect(try used(["a": 1]) == [])
        _ = try db.write { tx in try tx.createIndex(collection: "c", fields: ["a"], name: "by_a") }
        _ = try db.write { tx in try tx.createIndex(collection: "c", fields: ["n.x", "b"], name: "by_nx_b") }
        #expect(try used(["a": 1]) == ["by_a"])
        #expect(try used(["a": ["$gt": 4990]]) == ["by_a"])
        #expect(try used(["a": ["$gte": 10, "$lt": 20]]) == ["by_a"])
        #expect(try used(["a": ["$in": [1, 2, 3]]]) == ["by_a"])
        #expect(try used([:], sort: ["-a"]) == ["by_a"])
        #expect(try used([:], sort: ["a"]) == ["by_a"])
        let sortPlan = try db.explain(FindQuery(collection: "c", sort: try SortKey.parse("-a"))).plan
        #expect(!sortPlan.joined().contains("TEMP B-TREE"), "an indexed sort must not sort in a temp B-tree: \(sortPlan)")
        _ = try db.write { tx in try tx.createIndex(collection: "c", fields: ["b"], name: "by_b") }
        #expect(try used(["b": ["$prefix": "s49"]]) == ["by_b"])
        #expect(try used(["n.x": 2, "b": ["$gte": "a"]]) == ["by_nx_b"])
        // An index on another collection is never used.
        _ = try db.write { tx in try tx.createIndex(collection: "other", fields: ["a"], name: "other_a") }
        _ = try db.write { tx in try tx.dropIndex(name: "by_b") }
        #expect(try used(["b": "s1"]) == [])
        _ = try db.write { tx in try tx.dropIndex(name: "by_a") }
        #expect(try used(["a": 1]) == [])
        #expect(try used(["a": 1]) == [])
        #expect(try db.indexes().map(\.name) == ["by_nx_b", "other_a"])
        expectStoreError("index_not_found") { try db.write { tx in try tx.dropIndex(name: "by_a") } }
        expectStoreError("index_exists") {
            _ = try db.write { tx in try tx.createIndex(collection: "c", fields: ["b"], name: "other_a") }
        }
    }

    @Test func cursorFromAnotherQueryIsRejected() async throws {
        let t = try TempStore()
        let db = try t.store.create("q")
        _ = try db.commit((0..<5).map { .insert(collection: "c", doc: ["_id": .string("\($0)"), "v": .int(Int64($0))]) })
        let first = try db.find(FindQuery(collection: "c", sort: try SortKey.parse("v"), limit: 2))
        #expect(first.docs.count == 2)
        let token = try #require(first.cursor)
        expectStoreError("invalid_cursor") {
            _ = try QueryCursor.decode(token, for: FindQuery(collection: "c", sort: try SortKey.parse("-v")))
        }
        expectStoreError("invalid_cursor") { _ = try QueryCursor.decode("garbage!", for: FindQuery(collection: "c")) }
    }
}
