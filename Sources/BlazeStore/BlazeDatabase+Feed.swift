// Replaying the durable change feed: committed changes after a sequence, their documents resolved from the
// current ones through the rows' reverse deltas (FeedLog.swift).

import BlazeCRDT
import BlazeProtocol
import GRDB

extension BlazeDatabase {
    /// Committed changes after `seq`, oldest first: at most `limit` changes, and fewer once `maxEvents` events are
    /// collected (at least one change is returned when any exists).
    ///
    /// Throws `feed_expired` when `seq` is below the feed's floor (those changes were pruned) and `since_in_future`
    /// when it is beyond the last change.
    public func feedEntries(after seq: Int64, limit: Int = 256, maxEvents: Int = 2_000) throws -> [FeedEntry] {
        try checkFeedPosition(seq)
        return try read { db in
            let change = { (origin: NodeID, seq: UInt64) throws -> Change? in try Self.opLogChange(db, origin, seq) }
            var page: [FeedLog.StoredRow] = []
            var events = 0
            let rows = try Row.fetchCursor(
                db, sql: "SELECT seq, origin, events FROM feed WHERE seq > ? ORDER BY seq LIMIT ?", arguments: [seq, limit])
            while let row = try rows.next() {
                page.append(try FeedLog.decode(seq: row[0], origin: row[1], events: row[2], home: coding.home, change: change))
                events += page.last!.events.count
                if events >= maxEvents { break }
            }
            // The documents after the page's delta events: walk back from the current documents through every
            // later row (they are all in this transaction's snapshot).
            var current: [DocKey: String?] = [:]
            for row in page {
                for case .delta(let key, _, _) in row.events where current[key] == nil {
                    current[key] = .some(
                        try String.fetchOne(
                            db, sql: "SELECT body FROM docs WHERE collection = ? AND id = ?", arguments: [key.collection, key.id]))
                }
            }
            if let end = page.last?.seq, !current.isEmpty {
                let later = try Row.fetchCursor(
                    db, sql: "SELECT seq, origin, events FROM feed WHERE seq > ? ORDER BY seq DESC", arguments: [end])
                while let row = try later.next() {
                    let r = try FeedLog.decode(seq: row[0], origin: row[1], events: row[2], home: coding.home, change: change)
                    for e in r.events.reversed() { _ = try Self.stepBack(e, &current, row: r.seq) }
                }
            }
            var out: [FeedEntry] = []
            out.reserveCapacity(page.count)
            for row in page.reversed() {
                var resolved: [FeedEvent] = []
                resolved.reserveCapacity(row.events.count)
                for e in row.events.reversed() {
                    if let event = try Self.stepBack(e, &current, row: row.seq) { resolved.append(event) }
                }
                out.append(FeedEntry(seq: row.seq, origin: row.origin, events: resolved.reversed()))
            }
            return out.reversed()
        }
    }

    /// Change `seq` of `origin` from the op log (what feed rows of earlier versions point into); nil once pruned.
    static func opLogChange(_ db: Database, _ origin: NodeID, _ seq: UInt64) throws -> Change? {
        try String.fetchOne(
            db, sql: "SELECT body FROM changes WHERE origin = ? AND seq = ?", arguments: [origin.hex, Int64(seq)]
        ).map { try Change(json: try JSONParser(maxDepth: 10_000).parse($0)) }
    }

    /// Resolves stored event `e` of row `row` from the documents after it in `current` (documents not in `current`
    /// are not being followed) and moves `current` to before it; nil for a document touched without a visible change.
    static func stepBack(_ e: FeedLog.Stored, _ current: inout [DocKey: String?], row: Int64) throws -> FeedEvent? {
        switch e {
        case .touched:
            return nil
        case .complete(let event):
            let key = DocKey(collection: event.collection, id: event.id)
            if current[key] != nil { current[key] = .some(event.beforeText) }
            return event
        case .delta(let key, let type, let b):
            guard let after = current[key] else {
                // Not followed (a later row's document the page does not need): nothing to resolve.
                return FeedEvent(collection: key.collection, id: key.id, type: type, afterText: nil, beforeText: nil)
            }
            let before = try FeedLog.before(b, type: type, after: after) {
                StoreError(.internalFailure, kind: "corrupt_feed", "feed entry \(row) is corrupt")
            }
            current[key] = .some(before)
            return FeedEvent(collection: key.collection, id: key.id, type: type, afterText: after, beforeText: before)
        }
    }

    /// Checks that the changes after `seq` can be replayed.
    public func checkFeedPosition(_ seq: Int64) throws {
        let (floor, last) = feed.bounds
        guard seq >= floor else {
            throw StoreError(
                .limitExceeded, kind: "feed_expired",
                "changes after \(seq) are no longer kept (the feed starts after \(floor)); read the current state again",
                details: ["floor": .int(floor), "last": .int(last)])
        }
        guard seq <= last else {
            throw StoreError(
                .invalidArgument, kind: "since_in_future",
                "since \(seq) is beyond the last change \(last) of database \(Names.quoted(name))",
                details: ["last": .int(last)])
        }
    }
}
