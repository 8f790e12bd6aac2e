import BlazeCRDT
import BlazeProtocol
import GRDB

/// What a change did to a document, as its history tells.
public enum HistoryChange: String, Sendable {
    /// Created it (or brought it back after a delete).
    case insert
    /// Changed what it holds.
    case update
    /// Deleted it.
    case delete
    /// Touched it without changing what clients see: what it wrote lost to concurrent changes, or was there already.
    case unchanged
}

/// One change that touched a document, as `doc.history` lists it.
public struct HistoryEntry: Sendable, Equatable {
    /// The feed sequence of the change on this replica (`doc.get` with `at` reads the document as of it).
    public var seq: Int64
    /// What it did.
    public var type: HistoryChange
    /// The replica that authored the change.
    public var origin: NodeID
    /// The change's sequence from its origin; nil for changes recorded before it was kept.
    public var change: UInt64?
    /// The change's clock; nil for changes recorded before it was kept.
    public var hlc: HLC?
    /// When this replica applied it (Unix milliseconds); nil for changes recorded before it was kept.
    public var appliedAt: Int64?
    /// The dotted paths whose values differ before and after the change (inside objects present on both sides).
    public var changed: [String]
}

/// A page of a document's history.
public struct DocumentHistory: Sendable, Equatable {
    /// The changes, oldest first (the order this replica applied them: a causal order).
    public var entries: [HistoryEntry]
    /// The `seq` to pass as `after` for the next page; nil on the last one.
    public var next: Int64?
    /// The history starts after this feed sequence: older changes are no longer kept (feed retention, compaction
    /// or a snapshot install).
    public var floor: Int64
}

/// Document history and time travel, read from the durable change feed (its reverse deltas lead from the current
/// document back to any state after the feed's floor).
extension BlazeDatabase {
    /// Most entries of one history page.
    public static let maxHistoryLimit = 1000

    /// The changes that touched a document after feed sequence `after` (0: from the start of what is kept), oldest
    /// first, at most `limit`.
    public func history(collection: String, id: String, after: Int64 = 0, limit: Int = 100) throws -> DocumentHistory {
        try Names.validateCollection(collection)
        try Names.validateID(id)
        guard limit >= 1, limit <= Self.maxHistoryLimit else {
            throw StoreError(
                .limitExceeded, kind: "limit_out_of_range", "limit must be between 1 and \(Self.maxHistoryLimit), got \(limit)")
        }
        guard after >= 0 else { throw StoreError.invalid("invalid_cursor", "a history cursor is a feed sequence ≥ 0") }
        let key = DocKey(collection: collection, id: id)
        return try read { db in
            let floor = try Self.feedFloor(db)
            var newestFirst: [HistoryEntry] = []
            _ = try walkBack(db, key, after: max(after, floor)) { row, type, beforeText, afterText in
                let before = beforeText.flatMap { try? JSONParser(maxDepth: 10_000).parse($0).objectValue }
                let afterDoc = afterText.flatMap { try? JSONParser(maxDepth: 10_000).parse($0).objectValue }
                newestFirst.append(
                    HistoryEntry(
                        seq: row.seq, type: type, origin: row.origin, change: row.change, hlc: row.hlc,
                        appliedAt: row.appliedAt, changed: type == .unchanged ? [] : Self.changedPaths(before, afterDoc)))
            }
            let entries = Array(newestFirst.reversed().prefix(limit))
            return DocumentHistory(
                entries: entries, next: newestFirst.count > limit ? entries.last?.seq : nil, floor: floor)
        }
    }

    /// The document as it was after feed sequence `seq` (`fields` projects it); `document_not_found` when it did not
    /// exist then, `history_expired` when `seq` is before the feed's floor.
    public func get(collection: String, id: String, at seq: Int64, fields: [FieldPath]? = nil) throws -> JSONValue {
        try Names.validateCollection(collection)
        try Names.validateID(id)
        let key = DocKey(collection: collection, id: id)
        let text = try read { db -> String? in
            let (floor, last) = try Self.feedBounds(db)
            guard seq >= floor else { throw Self.historyExpired(floor: floor, last: last, "feed sequence \(seq)") }
            guard seq <= last else {
                throw StoreError(
                    .invalidArgument, kind: "at_in_future", "at \(seq) is beyond the last change \(last)",
                    details: ["last": .int(last)])
            }
            return try walkBack(db, key, after: seq) { _, _, _, _ in }
        }
        guard let text else {
            throw StoreError(
                .notFound, kind: "document_not_found", "no document \(Names.quoted(id)) in collection \(collection) at \(seq)")
        }
        let doc = try Self.decodeBody(text)
        return .object(fields.map { Projection.apply($0, to: doc) } ?? doc)
    }

    /// The feed sequence of the state at wall time `milliseconds` (Unix): the last change this replica applied by
    /// then; `history_expired` when that is before what the feed keeps.
    public func feedSequence(atTime milliseconds: Int64) throws -> Int64 {
        try read { db in
            let (floor, last) = try Self.feedBounds(db)
            if let seq = try Int64.fetchOne(
                db, sql: "SELECT max(seq) FROM feed WHERE applied_at <= ?", arguments: [milliseconds])
            {
                return seq
            }
            // Every kept change came later (or has no time): before all of them, if nothing was ever pruned.
            let first = try Row.fetchOne(db, sql: "SELECT seq, applied_at FROM feed ORDER BY seq LIMIT 1")
            if floor == 0, let first, (first[1] as Int64?) != nil { return 0 }
            if first == nil, floor == 0, last == 0 { return 0 }
            throw Self.historyExpired(floor: floor, last: last, "time \(milliseconds)")
        }
    }

    static func historyExpired(floor: Int64, last: Int64, _ what: String) -> StoreError {
        StoreError(
            .limitExceeded, kind: "history_expired",
            "the history before \(what) is no longer kept: it starts after feed sequence \(floor) (feed retention, compaction or a snapshot install)",
            details: ["floor": .int(floor), "last": .int(last)])
    }

    /// The feed's floor as of this read.
    static func feedFloor(_ db: Database) throws -> Int64 {
        try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'feed_floor'").flatMap { Int64($0) } ?? 0
    }

    /// The feed's floor and last sequence as of this read.
    static func feedBounds(_ db: Database) throws -> (floor: Int64, last: Int64) {
        let floor = try feedFloor(db)
        return (floor, max(floor, try Int64.fetchOne(db, sql: "SELECT max(seq) FROM feed") ?? 0))
    }

    /// A feed row's facts about its change.
    struct HistoryRow {
        let seq: Int64
        let origin: NodeID
        let change: UInt64?
        let hlc: HLC?
        let appliedAt: Int64?
    }

    /// Walks back from `key`'s current document through every feed row after `after` that touched it, newest first,
    /// calling `visit` with what each did and the document's texts before and after it; returns the document's text
    /// as of `after` (nil: it did not exist).
    func walkBack(
        _ db: Database, _ key: DocKey, after: Int64, _ visit: (HistoryRow, HistoryChange, String?, String?) throws -> Void
    ) throws -> String? {
        let body = try String.fetchOne(
            db, sql: "SELECT body FROM docs WHERE collection = ? AND id = ?", arguments: [key.collection, key.id])
        var current: [DocKey: String?] = [:]
        current[key] = .some(body)
        let change = { (origin: NodeID, seq: UInt64) throws -> Change? in try Self.opLogChange(db, origin, seq) }
        // A stored event ends with its document's names (`FeedLog.encode`): rows without them are skipped unread.
        // Rows of earlier formats are read whole.
        var marker = Array(#""c":"#.utf8)
        JSONValue.writeString(key.collection, to: &marker)
        marker += Array(#","i":"#.utf8)
        JSONValue.writeString(key.id, to: &marker)
        marker.append(UInt8(ascii: "}"))
        let rows = try Row.fetchCursor(
            db,
            sql: """
                SELECT seq, origin, events, change_seq, hlc, applied_at FROM feed
                WHERE seq > ? AND (instr(events, ?) > 0 OR substr(events, 1, 6) <> '{"d":[') ORDER BY seq DESC
                """,
            arguments: [after, String(decoding: marker, as: UTF8.self)])
        while let row = try rows.next() {
            let r = try FeedLog.decode(seq: row[0], origin: row[1], events: row[2], home: coding.home, change: change)
            let info = HistoryRow(
                seq: r.seq, origin: r.origin, change: (row[3] as Int64?).map { UInt64($0) },
                hlc: (row[4] as Int64?).map { HLC(raw: UInt64(bitPattern: $0)) }, appliedAt: row[5])
            for e in r.events.reversed() {
                if case .touched(let k) = e {
                    if k == key { try visit(info, .unchanged, current[key] ?? nil, current[key] ?? nil) }
                    continue
                }
                guard let event = try Self.stepBack(e, &current, row: r.seq),
                    DocKey(collection: event.collection, id: event.id) == key
                else { continue }
                let type: HistoryChange =
                    switch event.type {
                    case .insert: .insert
                    case .update: .update
                    case .delete: .delete
                    }
                try visit(info, type, event.beforeText, event.afterText)
            }
        }
        return current[key] ?? nil
    }

    /// The dotted paths whose values differ between two documents (`_id` aside), recursing into members that are
    /// objects on both sides, in UTF-8 order.
    static func changedPaths(_ a: [String: JSONValue]?, _ b: [String: JSONValue]?, prefix: String = "") -> [String] {
        var keys = Set(a?.keys ?? [:].keys)
        keys.formUnion(b?.keys ?? [:].keys)
        if prefix.isEmpty { keys.remove("_id") }
        var out: [String] = []
        for k in keys.sorted(by: utf8Less) {
            let (x, y) = (a?[k], b?[k])
            if x == y { continue }
            if case .object(let ox)? = x, case .object(let oy)? = y {
                out += changedPaths(ox, oy, prefix: prefix + k + ".")
            } else {
                out.append(prefix + k)
            }
        }
        return out
    }
}
