import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

@testable import BlazeStore

/// `query.aggregate`: groups and aggregates, checked against a reference computed in Swift.
@Suite struct Aggregation {
    func aggregates(_ o: [String: JSONValue]) throws -> [(name: String, aggregate: Aggregate)] {
        try o.keys.sorted().map { ($0, try Aggregate.parse($0, o[$0]!)) }
    }

    @Test func groupsAndAggregatesOrders() throws {
        let t = try TempStore()
        let db = try t.store.create("db")
        let orders: [[String: JSONValue]] = [
            ["city": "Oslo", "amount": 10, "status": "paid", "tags": ["a"]],
            ["city": "Oslo", "amount": 20, "status": "paid", "tags": ["b"]],
            ["city": "Oslo", "amount": .double(2.5), "status": "open"],
            ["city": "Bergen", "amount": 7, "status": "paid", "tags": ["a", "b"]],
            ["city": "Bergen", "amount": "n/a", "status": "paid"],
            ["amount": 1, "status": "paid"],
            ["city": .null, "amount": 2, "status": "open"],
        ]
        _ = try db.commit(orders.enumerated().map { .insert(collection: "orders", doc: $1.merging(["_id": .string("o\($0)")]) { $1 }) })
        _ = try db.write { try $0.createIndex(collection: "orders", fields: ["status", "city"], name: nil) }
        let all = try aggregates([
            "n": ["$count": [:]], "total": ["$sum": "amount"], "mean": ["$avg": "amount"], "low": ["$min": "amount"],
            "high": ["$max": "amount"], "firstTag": ["$min": "tags"],
        ])
        let byCity = try db.aggregate(AggregateQuery(collection: "orders", group: [try FieldPath("city")], aggregates: all))
        #expect(!byCity.truncated)
        #expect(byCity.groups.map(\.key) == [["city": .null], ["city": "Bergen"], ["city": "Oslo"]], "missing and null group together, first")
        #expect(byCity.groups[0].values == ["n": 2, "total": 3, "mean": .double(1.5), "low": 1, "high": 2, "firstTag": .null])
        // Strings are not summed, and rank above numbers for min and max.
        #expect(byCity.groups[1].values == ["n": 2, "total": 7, "mean": .double(7), "low": 7, "high": "n/a", "firstTag": ["a", "b"]])
        #expect(byCity.groups[2].values == ["n": 3, "total": .double(32.5), "mean": .double(32.5 / 3), "low": .double(2.5), "high": 20, "firstTag": ["a"]])
        // A filter, two group paths, and an index that covers them.
        let paid = try db.aggregate(AggregateQuery(
            collection: "orders", filter: try Filter.parse(["status": "paid"]),
            group: [try FieldPath("status"), try FieldPath("city")], aggregates: try aggregates(["n": ["$count": true]])))
        #expect(paid.groups.map(\.key) == [["status": "paid", "city": .null], ["status": "paid", "city": "Bergen"], ["status": "paid", "city": "Oslo"]])
        #expect(paid.groups.map { $0.values["n"] } == [1, 2, 2])
        // No group: one group of everything matching, even when nothing matches.
        let none = try db.aggregate(AggregateQuery(collection: "orders", filter: try Filter.parse(["status": "gone"]), aggregates: all))
        #expect(none.groups == [.init(key: [:], values: ["n": 0, "total": 0, "mean": .null, "low": .null, "high": .null, "firstTag": .null])])
        // A collection that does not exist has no groups; limit truncates.
        #expect(try db.aggregate(AggregateQuery(collection: "later", group: [try FieldPath("a")], aggregates: all)).groups.isEmpty)
        let two = try db.aggregate(AggregateQuery(collection: "orders", group: [try FieldPath("city")], aggregates: all, limit: 2))
        #expect(two.truncated && two.groups.count == 2)
    }

    @Test func sumsStayExactIntegersUntilTheyOverflow() throws {
        let t = try TempStore()
        let db = try t.store.create("db")
        _ = try db.commit([
            .insert(collection: "c", doc: ["g": 1, "v": .int(9_007_199_254_740_993)]),
            .insert(collection: "c", doc: ["g": 1, "v": 2]),
            .insert(collection: "c", doc: ["g": 2, "v": .int(.max)]),
            .insert(collection: "c", doc: ["g": 2, "v": 1]),
        ])
        let r = try db.aggregate(AggregateQuery(collection: "c", group: [try FieldPath("g")], aggregates: try aggregates(["s": ["$sum": "v"]])))
        #expect(r.groups[0].values["s"] == .int(9_007_199_254_740_995))
        #expect(r.groups[1].values["s"] == .double(Double(Int64.max) + 1))
    }

    @Test func badAggregationsAreRefused() throws {
        let t = try TempStore()
        let db = try t.store.create("db")
        for bad: JSONValue in [["$sum": 1], ["$avg": ["a"]], ["$median": "a"], [:], ["$sum": "a", "$max": "b"], "$count", ["$count": 1], ["$min": "a..b"]] {
            #expect(throws: StoreError.self) { _ = try Aggregate.parse("x", bad) }
        }
        let count = try aggregates(["n": ["$count": [:]]])
        expectStoreError("invalid_aggregate") { _ = try db.aggregate(AggregateQuery(collection: "c", aggregates: [])) }
        expectStoreError("invalid_aggregate") {
            _ = try db.aggregate(AggregateQuery(collection: "c", group: [try FieldPath("a"), try FieldPath("a")], aggregates: count))
        }
        expectStoreError("invalid_aggregate") {
            _ = try db.aggregate(AggregateQuery(collection: "c", group: try (0...8).map { try FieldPath("f\($0)") }, aggregates: count))
        }
        expectStoreError("limit_out_of_range") { _ = try db.aggregate(AggregateQuery(collection: "c", aggregates: count, limit: 0)) }
        expectStoreError("invalid_name") { _ = try db.aggregate(AggregateQuery(collection: "a b", aggregates: count)) }
    }

    /// Random documents, every value type at the group and aggregated paths: SQLite's answer equals the reference.
    @Test func randomGroupsMatchTheReference() throws {
        let groupValues: [JSONValue?] = [nil, .null, true, false, 1, 2, -3, .double(0.5), .double(2.5), "a", "b", "é", [1], [1, 2], ["k": 1]]
        let values: [JSONValue?] = [nil, .null, true, false, 1, 7, -2, .double(0.25), .double(1e10), "x", "y", [0], ["a": 1]]
        let base = testSeed("aggregation")
        for round in 0..<UInt64(20) {
            var rng = SeededRandom(seed: base &+ round)
            let t = try TempStore()
            let db = try t.store.create("db")
            var docs: [[String: JSONValue]] = []
            for i in 0..<Int.random(in: 1...200, using: &rng) {
                var d: [String: JSONValue] = ["_id": .string("d\(i)")]
                if let g = groupValues.randomElement(using: &rng)! { d["g"] = g }
                if let v = values.randomElement(using: &rng)! { d["v"] = v }
                docs.append(d)
            }
            _ = try db.commit(docs.map { .insert(collection: "c", doc: $0) })
            let q = AggregateQuery(
                collection: "c", group: [try FieldPath("g")],
                aggregates: try aggregates(["n": ["$count": [:]], "s": ["$sum": "v"], "a": ["$avg": "v"], "lo": ["$min": "v"], "hi": ["$max": "v"]]))
            let got = try db.aggregate(q)
            // The reference: groups by value (missing as null) in the type order.
            var keys: [JSONValue] = []
            for d in docs where !keys.contains(where: { TypeRank.compare($0, d["g"] ?? .null) == 0 }) { keys.append(d["g"] ?? .null) }
            keys.sort { TypeRank.compare($0, $1) < 0 }
            let expected = keys.map { key -> AggregateResult.Group in
                let members = docs.filter { TypeRank.compare($0["g"] ?? .null, key) == 0 }
                let present = members.compactMap { $0["v"] }.filter { $0 != .null }
                var intSum: Int64 = 0
                var doubleSum = 0.0
                var numbers = 0
                var anyDouble = false
                for v in present {
                    switch v {
                    case .int(let i): intSum += i; doubleSum += Double(i); numbers += 1
                    case .double(let x): doubleSum += x; anyDouble = true; numbers += 1
                    default: break
                    }
                }
                let sorted = present.sorted { TypeRank.compare($0, $1) < 0 }
                return .init(key: ["g": key], values: [
                    "n": .int(Int64(members.count)), "s": anyDouble ? .double(doubleSum) : .int(intSum),
                    "a": numbers == 0 ? .null : .double(doubleSum / Double(numbers)),
                    "lo": sorted.first ?? .null, "hi": sorted.last ?? .null,
                ])
            }
            #expect(got.groups == expected, "seed \(base &+ round)")
        }
    }
}
