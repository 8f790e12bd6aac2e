import BlazeCRDT
import BlazeProtocol
import BlazeTestSupport
import GRDB
import Testing

@testable import BlazeStore

/// `FeedPruner` on its own: where a prune puts the floor, what it keeps, and how `trim` publishes the floor.
@Suite struct FeedPrunerTests {
    /// A database keeping `retention` feed events, with `writes` single-document changes (one event each): too few
    /// for the writes themselves to prune (that waits for a `pruneStep` beyond the retention).
    static func database(_ t: TempStore, writes: Int) throws -> BlazeDatabase {
        let db = try t.store.create("f")
        for i in 0..<writes { _ = try db.apply(.put(collection: "c", id: "d\(i)", doc: [:])) }
        #expect(db.feed.floor == 0)
        return db
    }

    /// Limits keeping 10 feed events.
    static var limits: StoreLimits {
        var l = StoreLimits()
        l.feedRetention = 10
        return l
    }

    /// A prune deletes the rows before the last `retention` events and records the floor, in the caller's write.
    @Test func aPruneKeepsTheRetentionAndRecordsTheFloor() throws {
        let t = try TempStore(limits: Self.limits)
        let db = try Self.database(t, writes: 100)
        let pruner = db.feedPruner
        let (floor, floorTotal) = try db.connections.write { try pruner.prune($0, total: 100, floor: 0, floorTotal: 0) }
        #expect(floor == 90 && floorTotal == 90)
        #expect(try db.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM feed") } == 10)
        #expect(try db.read { try String.fetchOne($0, sql: "SELECT value FROM meta WHERE key = 'feed_floor'") } == "90")
        #expect(try db.read { try String.fetchOne($0, sql: "SELECT value FROM meta WHERE key = 'feed_floor_total'") } == "90")
        // The live feed learns of it only through `trim` or a write's publish.
        #expect(db.feed.floor == 0)
    }

    /// Within the retention nothing goes, and the floor stays.
    @Test func nothingBeyondTheRetentionLeavesTheFloor() throws {
        let t = try TempStore(limits: Self.limits)
        let db = try Self.database(t, writes: 8)
        let pruner = db.feedPruner
        let (floor, floorTotal) = try db.connections.write { try pruner.prune($0, total: 8, floor: 0, floorTotal: 0) }
        #expect(floor == 0 && floorTotal == 0)
        #expect(try db.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM feed") } == 8)
    }

    /// The floor moves by whole rows: a bulk change's row stays while any of its events is within the retention.
    @Test func aBulkRowStaysWhileItReachesIntoTheRetention() throws {
        let t = try TempStore(limits: Self.limits)
        let db = try t.store.create("f")
        _ = try db.commit((0..<50).map { i in .insert(collection: "c", doc: ["_id": .string("b\(i)")]) })
        for i in 0..<5 { _ = try db.apply(.put(collection: "c", id: "s\(i)", doc: [:])) }
        let pruner = db.feedPruner
        let kept = try db.connections.write { try pruner.prune($0, total: 55, floor: 0, floorTotal: 0) }
        #expect(kept.0 == 0 && kept.1 == 0)
        for i in 5..<10 { _ = try db.apply(.put(collection: "c", id: "s\(i)", doc: [:])) }
        let moved = try db.connections.write { try pruner.prune($0, total: 60, floor: 0, floorTotal: 0) }
        #expect(moved.0 == 1 && moved.1 == 50)
    }

    /// `trim` prunes to exactly the retention and raises the live feed's floor once it commits.
    @Test func trimRaisesTheLiveFloor() throws {
        let t = try TempStore(limits: Self.limits)
        let db = try Self.database(t, writes: 40)
        try db.feedPruner.trim(db.connections)
        #expect(db.feed.floor == 30 && db.feed.totals.floor == 30)
        #expect(try db.feedEntries(after: 30, limit: 100).count == 10)
    }
}
