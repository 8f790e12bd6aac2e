// Live queries (subscriptions with a filter): events checked against a model of the collection. The subscription
// helpers and the delivery tests are in SubscriptionTests.swift.

import BlazeProtocol
import BlazeStore
import BlazeTestSupport
import Testing

@Suite struct LiveQuerySubscriptions {
    /// Live queries against a model: 1,200 random writes, several filters at once; every event must be exactly the
    /// transition the model predicts, and the members it implies must equal `query.find` at the end.
    @Test func liveQueriesReportEnterAndLeaveLikeTheReference() throws {
        let seed = testSeed("live query")
        var rng = SeededRandom(seed: seed)
        let d = try DaemonProcess()
        let c = try d.connect()
        let w = try d.connect()
        let filters: [JSONValue] = [
            ["a": ["$gt": 4]], ["b": "x"], ["$or": [["c": true], ["a": ["$lt": 2]]]], ["tags": ["$contains": "red"]],
            ["c": ["$exists": false], "b": ["$in": ["y", "z"]]], [:],
        ]
        var subs: [String] = []
        for f in filters { subs.append(try subscribe(c, ["db": "default", "collection": "t", "where": f]).id) }
        let parsed = try filters.map { try Filter.parse($0) }

        func randomFields() -> [String: JSONValue] {
            var doc: [String: JSONValue] = [:]
            if Bool.random(using: &rng) { doc["a"] = .int(Int64.random(in: 0...9, using: &rng)) }
            if Bool.random(using: &rng) { doc["b"] = .string(["x", "y", "z"].randomElement(using: &rng)!) }
            if Bool.random(using: &rng) { doc["c"] = .bool(Bool.random(using: &rng)) }
            if Bool.random(using: &rng) {
                doc["tags"] = .array((0..<Int.random(in: 0...2, using: &rng)).map { _ in .string(["red", "blue"].randomElement(using: &rng)!) })
            }
            return doc
        }
        var model: [String: [String: JSONValue]] = [:]
        var expected: [[String]] = Array(repeating: [], count: filters.count)
        for step in 0..<1200 {
            let id = "d\(Int.random(in: 0..<40, using: &rng))"
            let before = model[id]
            let kind = Int.random(in: 0..<10, using: &rng)
            var params: [String: JSONValue] = ["db": "default", "collection": "t", "id": .string(id)]
            let method: String
            if before == nil || kind < 4 {
                method = "doc.put"
                let fields = randomFields()
                params["doc"] = .object(fields)
                model[id] = fields.merging(["_id": .string(id)]) { $1 }
            } else if kind < 8 {
                method = "doc.patch"
                var set = randomFields()
                if set.isEmpty { set["a"] = 3 }
                params["set"] = .object(set)
                let unset = ["a", "b", "c", "tags"].filter { set[$0] == nil && Int.random(in: 0..<3, using: &rng) == 0 }
                if !unset.isEmpty { params["unset"] = .array(unset.map(JSONValue.string)) }
                var doc = before!.merging(set) { $1 }
                for f in unset { doc.removeValue(forKey: f) }
                model[id] = doc
            } else {
                method = "doc.delete"
                model[id] = nil
            }
            _ = try w.call(method, params)
            let after = model[id]
            let seq = step + 1
            for (i, f) in parsed.enumerated() {
                let was = before.map(f.matches) ?? false
                let isNow = after.map(f.matches) ?? false
                let type: String
                switch (was, isNow) {
                case (false, true): type = before == nil ? "insert" : "enter"
                case (true, true):
                    if before == after { continue }
                    type = "update"
                case (true, false): type = after == nil ? "delete" : "leave"
                case (false, false): continue
                }
                expected[i].append("\(seq) \(type) t/\(id) \((after ?? [:]).isEmpty ? "-" : JSONValue.object(after!).jsonText)")
            }
        }
        for (i, sub) in subs.enumerated() {
            let events = try readEvents(c, sub, count: expected[i].count)
            let got = events.map { e in
                "\(e["seq"]?.intValue ?? -1) \(e["type"]?.stringValue ?? "?") t/\(e["id"]?.stringValue ?? "?") \(e["type"] == "delete" ? "-" : e["doc"]?.jsonText ?? "missing")"
            }
            #expect(got == expected[i], "filter \(filters[i].jsonText) (seed \(seed), replay with BLAZE_SEED=\(seed))")
            // Members implied by the events equal what the query engine answers now.
            var members = Set<String>()
            for e in events {
                let id = e["id"]?.stringValue ?? ""
                switch e["type"]?.stringValue {
                case "insert", "enter", "update": members.insert(id)
                default: members.remove(id)
                }
            }
            let found = try w.call("query.find", ["db": "default", "collection": "t", "where": filters[i], "limit": 1000])
            let ids = Set((found["docs"]?.arrayValue ?? []).compactMap { $0["_id"]?.stringValue })
            #expect(members == ids, "filter \(filters[i].jsonText) (seed \(seed))")
        }
        d.stop()
    }
}
