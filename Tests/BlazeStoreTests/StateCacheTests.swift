import BlazeCRDT
import BlazeProtocol
import BlazeTestSupport
import GRDB
import Testing

@testable import BlazeStore

/// `StateCache`: decoded states reused only while a row holds exactly the texts they were written as.
@Suite struct StateCacheTests {
    @Test func aDecodedStateIsReusedOnlyWhileItsRowIsUnchanged() throws {
        let replicas = try StoreReplicas(2)
        let (a, b) = (replicas.dbs[0], replicas.dbs[1])
        _ = try a.apply(.insert(collection: "c", doc: ["_id": "d", "n": 0]))
        try replicas.send(0, 1)
        // B's row of the new document, written without a decoded state: nothing cached yet.
        let created = try b.read { try Row.fetchOne($0, sql: "SELECT body, state FROM docs WHERE id = 'd'")! }
        #expect(b.stateCache.usage.count == 0)
        _ = try a.apply(.patch(collection: "c", id: "d", set: ["n": 1]))
        try replicas.send(0, 1)
        #expect(b.stateCache.usage.count == 1)
        _ = try a.apply(.patch(collection: "c", id: "d", set: ["m": 2]))
        try replicas.send(0, 1)
        #expect(b.stateCache.hits.load(ordering: .relaxed) == 1, "the second patch found the state the first wrote")
        #expect(try b.get(collection: "c", id: "d") == ["_id": "d", "m": 2, "n": 1])
        // Something else rewrites the row (here: back to the created texts): the entry no longer matches, and the
        // next change applies to what the row holds.
        try b.connections.write { db in
            try db.execute(
                sql: "UPDATE docs SET body = ?, state = ? WHERE id = 'd'", arguments: [created["body"], created["state"]] as StatementArguments)
        }
        _ = try a.apply(.patch(collection: "c", id: "d", set: ["k": 3]))
        try replicas.send(0, 1)
        #expect(b.stateCache.hits.load(ordering: .relaxed) == 1)
        #expect(try b.get(collection: "c", id: "d") == ["_id": "d", "k": 3, "n": 0])
    }

    @Test func aTransactionWritingMoreThanHalfTheCacheFillsNothing() throws {
        #expect(StateCache(budget: 64 << 10).admits(leastCost: 32 << 10) && !StateCache(budget: 64 << 10).admits(leastCost: (32 << 10) + 1))
        #expect(!StateCache(budget: 0).admits(leastCost: 0))
        // 8 KiB: a document's entry here costs about 500 bytes, so 40 of them are more than half of it, and 3 are not.
        var limits = StoreLimits()
        limits.stateCacheBytes = 8 << 10
        let replicas = try StoreReplicas(2, limits: limits)
        let (a, b) = (replicas.dbs[0], replicas.dbs[1])
        _ = try a.commit((0..<40).map { .insert(collection: "c", doc: ["_id": .string("d\($0)"), "n": 0]) })
        try replicas.send(0, 1)
        // One received transaction rewriting 40 documents: more than half the cache would hold, so none enters.
        _ = try a.commit((0..<40).map { .patch(collection: "c", id: "d\($0)", set: ["n": 1]) })
        try replicas.send(0, 1)
        #expect(b.stateCache.usage.count == 0)
        // One of 3 enters, and the next change to those documents finds them.
        _ = try a.commit((0..<3).map { .patch(collection: "c", id: "d\($0)", set: ["n": 2]) })
        try replicas.send(0, 1)
        #expect(b.stateCache.usage.count == 3)
        _ = try a.commit((0..<3).map { .patch(collection: "c", id: "d\($0)", set: ["m": 3]) })
        try replicas.send(0, 1)
        #expect(b.stateCache.hits.load(ordering: .relaxed) == 3)
        #expect(try b.get(collection: "c", id: "d1") == ["_id": "d1", "n": 2, "m": 3])
        #expect(try b.stateHash() == a.stateHash())
    }

    @Test func entriesStayWithinTheBudget() {
        let cache = StateCache(budget: 64 << 10)
        let state = DocumentState(cl: 1)
        let body = String(repeating: "b", count: 900)
        for round in 0..<10 {
            cache.insert((0..<100).map { i in
                (DocKey(collection: "c", id: "d\(round)-\(i)"), StateCache.Entry(stateText: "{\"l\":1}", bodyText: body, state: state))
            })
            #expect(cache.usage.cost <= cache.budget)
        }
        #expect(cache.usage.count > 0)
        // An entry is used only for the exact texts.
        let key = DocKey(collection: "c", id: "x")
        cache.insert([(key, StateCache.Entry(stateText: "{\"l\":1}", bodyText: "{}", state: state))])
        #expect(cache.entry(key, state: "{\"l\":1}", body: "{}")?.state == state)
        #expect(cache.entry(key, state: "{\"l\":3}", body: "{}") == nil)
        #expect(cache.entry(key, state: "{\"l\":1}", body: "{ }") == nil)
        // A cache of no budget keeps nothing.
        let none = StateCache(budget: 0)
        none.insert([(key, StateCache.Entry(stateText: "{}", bodyText: "{}", state: state))])
        #expect(none.usage.count == 0 && none.entry(key, state: "{}", body: "{}") == nil)
    }
}
