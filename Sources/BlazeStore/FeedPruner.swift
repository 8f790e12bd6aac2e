import Foundation
import GRDB
import Synchronization

/// The owner of the durable feed's retention: it deletes the `feed` rows before the last `feedRetention` document
/// events (in steps, inside the writes that add rows, and exactly on `trim`), keeps the floor in `meta`, and remembers
/// below which event total no prune can move the floor.
///
/// The live `ChangeFeed` publishes the floor this moves; the rows themselves are written by `SQLStorage`.
final class FeedPruner: Sendable {
    /// Feed events beyond the retention that may accumulate before a prune: one range delete per 256 events rather
    /// than one per commit.
    static let pruneStep: Int64 = 256

    /// The live feed whose floor and totals this moves.
    let feed: ChangeFeed
    /// Document events kept (`StoreLimits.feedRetention`).
    let retention: Int64
    /// The feed event total below which a prune cannot move the floor (0: unknown). A change of a bulk transaction is
    /// one feed row of many events, and the floor only moves by whole rows: until the total passes the first row
    /// after the floor by the retention, every search for a new floor finds none.
    private let notBefore = Mutex<Int64>(0)

    /// A pruner of `feed`, keeping `retention` document events.
    init(feed: ChangeFeed, retention: Int) {
        self.feed = feed
        self.retention = Int64(retention)
    }

    /// The event total below which no prune is tried (0: unknown).
    var pruneNotBefore: Int64 { notBefore.withLock { $0 } }

    /// Inside the write that recorded `storage`'s entries: prunes when the feed is a step past its retention (and a
    /// prune can move the floor), and returns the floor and its event total to publish with those entries.
    func pruneIfDue(_ storage: SQLStorage, _ db: Database) throws -> (floor: Int64, floorTotal: Int64) {
        var (floor, floorTotal) = (feed.floor, feed.totals.floor)
        guard storage.feedTotal - floorTotal > retention + Self.pruneStep, storage.feedTotal >= notBefore.withLock({ $0 })
        else { return (floor, floorTotal) }
        (floor, floorTotal) = try prune(db, total: storage.feedTotal, floor: floor, floorTotal: floorTotal)
        if floor == feed.floor {
            // Nothing to prune yet: not before the first row above the floor is past the retention.
            // (Rows from before totals were kept have none and come first.)
            if let next = try Int64.fetchOne(
                db.cachedStatement(sql: "SELECT total FROM feed WHERE seq > ? AND total IS NOT NULL ORDER BY seq LIMIT 1"),
                arguments: [floor])
            {
                let notBefore = next + retention
                storage.onCommit { [self] in self.notBefore.withLock { $0 = max($0, notBefore) } }
            }
        }
        return (floor, floorTotal)
    }

    /// Deletes the feed rows before the last `retention` document events (the last change is always kept whole) in
    /// the caller's transaction; returns the new floor and its event total.
    func prune(_ db: Database, total: Int64, floor: Int64, floorTotal: Int64) throws -> (Int64, Int64) {
        let target = total - retention
        // `total` grows with `seq` (rows from before it was kept have none and come first): the last row at or below
        // the target is found by binary search over `seq`, a few rowid lookups, with no index on `total`.
        let probe = try db.cachedStatement(sql: "SELECT seq, total FROM feed WHERE seq >= ? ORDER BY seq LIMIT 1")
        var best: (seq: Int64, total: Int64)?
        var (lo, hi) = (floor + 1, try Int64.fetchOne(db.cachedStatement(sql: "SELECT max(seq) FROM feed")) ?? floor)
        while lo <= hi {
            let mid = lo + (hi - lo) / 2
            guard let row = try Row.fetchOne(probe, arguments: [mid]), let seq = row[0] as Int64? else {
                hi = mid - 1
                continue
            }
            if let t = row[1] as Int64?, t > target {
                hi = mid - 1
            } else {
                if let t = row[1] as Int64? { best = (seq, t) }
                lo = seq + 1
            }
        }
        guard let (seq, upTo) = best, seq > floor else { return (floor, floorTotal) }
        try db.cachedStatement(sql: "DELETE FROM feed WHERE seq <= ?").execute(arguments: [seq])
        try db.cachedStatement(
            sql: "INSERT INTO meta(key, value) VALUES ('feed_floor', ?), ('feed_floor_total', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value"
        ).execute(arguments: [String(seq), String(upTo)])
        return (seq, upTo)
    }

    /// Prunes the durable feed to exactly its retention in one write on `connections` (writes prune it in steps), and
    /// raises the live feed's floor once that commits.
    func trim(_ connections: DatabaseConnections) throws {
        let feed = self.feed
        try connections.write { db in
            let (total, floorTotal) = feed.totals
            let (floor, newTotal) = try self.prune(db, total: total, floor: feed.floor, floorTotal: floorTotal)
            guard floor > feed.floor else { return }
            db.afterNextTransaction(onCommit: { _ in feed.raiseFloor(floor, total: newTotal) })
        }
    }
}
