import BlazeCRDT
import BlazeProtocol
import GRDB
import Synchronization

/// The version vector of a database's committed transactions (its `versions` table), kept in memory so that a local
/// write need not read the table. Every write to `versions` advances it once its transaction commits; a snapshot
/// install, the only writer that lowers an entry, forgets it, and the next write reads the table again.
final class CommittedVersions: Sendable {
    private let vector = Mutex<VersionVector?>(nil)

    /// The committed vector, read from `db` (the writer's connection, outside any transaction's writes) when not
    /// known.
    func value(_ db: Database) throws -> VersionVector {
        if let known = vector.withLock({ $0 }) { return known }
        let read = VersionVector(try Self.table(db))
        vector.withLock { $0 = read }
        return read
    }

    /// The `versions` table as `db` sees it.
    static func table(_ db: Database) throws -> [NodeID: UInt64] {
        var e: [NodeID: UInt64] = [:]
        for row in try Row.fetchAll(db.cachedStatement(sql: "SELECT origin, seq FROM versions")) {
            if let id = NodeID(hex: row[0]) { e[id] = UInt64(row[1] as Int64) }
        }
        return e
    }

    /// Raises each origin's entry to at least `versions`'s (nothing while the vector is not known).
    func advance(_ versions: [NodeID: UInt64]) {
        vector.withLock { v in
            guard var known = v else { return }
            for (origin, seq) in versions where seq > known[origin] { known[origin] = seq }
            v = known
        }
    }

    /// The committed vector if known, without reading the table (a reader may use it: it is never behind what any
    /// reader's snapshot sees of a committed transaction, only possibly ahead of it).
    func peek() -> VersionVector? { vector.withLock { $0 } }

    /// Forgets the vector (a snapshot install rewrote the table).
    func forget() { vector.withLock { $0 = nil } }
}

/// A change's identity: its origin and sequence number.
struct ChangeID: Hashable {
    let origin: NodeID
    let seq: UInt64

    init(_ change: Change) {
        origin = change.origin
        seq = change.seq
    }
}

/// Recording applied changes: the `changes` row, the feed row with its events and the per-origin version.
extension SQLStorage {
    /// The versions this database holds, including the changes recorded in this transaction.
    func versionVector() throws -> VersionVector {
        var e: [NodeID: UInt64] = [:]
        if let startVersions {
            e = startVersions.entries
            for (origin, seq) in flushedVersions { e[origin] = max(e[origin] ?? 0, seq) }
        } else {
            e = try CommittedVersions.table(db)
        }
        for (origin, seq) in recordedVersions { e[origin] = max(e[origin] ?? 0, seq) }
        return VersionVector(e)
    }

    /// Records `change` with its feed row and version (its text as received when `receivedTexts` has it).
    func recordApplied(_ change: Change) throws {
        try recordApplied(change, text: receivedTexts.removeValue(forKey: ChangeID(change)) ?? change.jsonValue.jsonBytes)
    }

    /// Records `change`, whose canonical text is `text` (UTF-8), with its feed row and version. `last` says no change
    /// is recorded after it in this transaction (so documents already written need not be kept as the next "before").
    func recordApplied(_ change: Change, text: [UInt8], last: Bool = false) throws {
        let touched = docs.takeTouched()
        var events: [FeedEvent] = []
        events.reserveCapacity(touched.count)
        // Documents the change touched without changing what clients see (kept for `doc.history`).
        var unchanged: [DocKey] = []
        for key in touched {
            let before = docs.visible[key] ?? Visible()
            let after: Visible
            // Only texts are kept: a filtering subscription parses a document if it needs it, and a transaction
            // storing a group of thousands of changes does not hold every document twice.
            if let c = docs.created[key] {
                after = Visible(text: c.text)
            } else if let p = docs.patched[key] {
                after = Visible(text: p.text)
            } else {
                after = Visible(text: docs.states[key]??.visibleText(id: key.id))
            }
            // `flush()` writes dirty documents as they are here.
            if !last || docs.isDirty(key) { docs.visible[key] = after }
            let type: FeedEventType
            switch (before.text, after.text) {
            case (nil, nil):
                unchanged.append(key)
                continue
            case (nil, _): type = .insert
            case (_, nil): type = .delete
            case (let b?, let a?):
                if a == b {
                    unchanged.append(key)
                    continue
                }
                type = .update
            }
            events.append(
                FeedEvent(
                    collection: key.collection, id: key.id, type: type, afterText: after.text, beforeText: before.text))
        }
        feedSequence += 1
        feedTotal += Int64(events.count)
        // The database's home origin (its creator, usually this device) is written as "" (`FeedLog`).
        let origin = change.origin.hex
        let insert = try prepared(
            &insertFeed,
            "INSERT INTO feed(seq, origin, events, total, change_seq, hlc, applied_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)")
        insert.bind(Int64(change.seq), Int64(bitPattern: change.hlc.raw), Int64(BlazeDatabase.nowMilliseconds()), from: 5)
        try insert.run(feedSequence, change.origin == coding.home ? "" : origin, FeedLog.encode(events, touched: unchanged), feedTotal)
        entries.append(FeedEntry(seq: feedSequence, origin: change.origin, events: events))
        // Bound in place: a change of a large transaction is hundreds of kilobytes.
        try prepared(&insertChange, "INSERT INTO changes(origin, seq, hlc, body) VALUES (?, ?, ?, ?)").run(
            origin, Int64(change.seq), Int64(bitPattern: change.hlc.raw), text)
        recordedVersions[change.origin] = max(recordedVersions[change.origin] ?? 0, change.seq)
    }
}
