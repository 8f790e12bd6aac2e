import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDB
import Synchronization

/// What a change did to one document, as subscribers see it.
public enum FeedEventType: String, Sendable {
    /// The document did not exist (or was deleted) before the change and does now.
    case insert
    /// The document existed before and after the change, and its content changed.
    case update
    /// The document existed before the change and does not now.
    case delete
}

/// One document's visible change within one applied change.
///
/// The documents are kept as their canonical text (what notifications carry); the parsed forms are built on demand,
/// only for subscriptions that filter, unless the writer already had them.
public struct FeedEvent: Sendable, Equatable {
    /// The collection.
    public let collection: String
    /// The document id.
    public let id: String
    /// Insert, update or delete.
    public let type: FeedEventType
    /// The document after the change (with `_id`) in canonical JSON text; nil when deleted. Spliced into
    /// notifications as is.
    public let afterText: String?
    /// The document before the change in canonical JSON text; nil when it did not exist.
    public let beforeText: String?
    /// The parsed documents, shared by every copy of the event: parsed at most once however many subscriptions
    /// look at them.
    private let parsed: Parsed

    /// Memo of the parsed documents.
    final class Parsed: Sendable {
        let after: Mutex<[String: JSONValue]??>
        let before: Mutex<[String: JSONValue]??>

        init(after: [String: JSONValue]?, before: [String: JSONValue]?) {
            self.after = Mutex(after.map { .some($0) })
            self.before = Mutex(before.map { .some($0) })
        }

        /// The memoized value of `slot`, computed from `text` on first use.
        static func value(_ slot: borrowing Mutex<[String: JSONValue]??>, _ text: String?) -> [String: JSONValue]? {
            slot.withLock { memo in
                if let known = memo { return known }
                let value = text.flatMap { try? JSONParser(maxDepth: 10_000).parse($0).objectValue }
                memo = .some(value)
                return value
            }
        }
    }

    /// Creates an event; `after` and `before` are the parsed texts when the caller has them (else parsed on use).
    init(
        collection: String, id: String, type: FeedEventType, after: [String: JSONValue]? = nil, afterText: String?,
        before: [String: JSONValue]? = nil, beforeText: String?
    ) {
        self.collection = collection
        self.id = id
        self.type = type
        self.afterText = afterText
        self.beforeText = beforeText
        parsed = Parsed(after: afterText == nil ? nil : after, before: beforeText == nil ? nil : before)
    }

    /// The document after the change (with `_id`); nil when deleted.
    public var after: [String: JSONValue]? { Parsed.value(parsed.after, afterText) }

    /// The document before the change; nil when it did not exist. Live queries use it to tell entering from staying.
    public var before: [String: JSONValue]? { Parsed.value(parsed.before, beforeText) }

    /// Events are equal when they say the same: same document, type and texts.
    public static func == (a: FeedEvent, b: FeedEvent) -> Bool {
        a.collection == b.collection && a.id == b.id && a.type == b.type && a.afterText == b.afterText
            && a.beforeText == b.beforeText
    }
}

/// One applied change (local or remote) in the database's local change feed.
public struct FeedEntry: Sendable {
    /// Local sequence number: increases by one with every change this database applies, never reused.
    public let seq: Int64
    /// The replica that authored the change.
    public let origin: NodeID
    /// The documents it visibly changed, in the order the change first touched them.
    public let events: [FeedEvent]
}

/// What a feed listener receives, on the writer's thread, in commit order.
public enum FeedSignal: Sendable {
    /// Newly committed changes, in sequence order.
    case entries([FeedEntry])
    /// The feed ended (its database was dropped or closed); no more signals follow.
    case ended(StoreError)
    /// The database's state was replaced (a snapshot was installed, SYNC.md §11): what a listener derived from the
    /// feed so far no longer holds. The feed goes on after it.
    case reset(StoreError)
}

/// The result of attaching to the live feed.
public enum FeedAttachment: Sendable, Equatable {
    /// Attached: the listener receives every change after the requested sequence.
    case attached(token: Int)
    /// Changes after the requested sequence are already committed; read them with `feedEntries(after:)` first.
    case behind
    /// The feed has ended, for this reason.
    case ended(StoreError)
}

/// The live side of a database's change feed: hands committed changes to listeners in commit order.
///
/// Publication happens on the writer's thread right after each commit, under the same lock that `attach` takes, so
/// a listener attached "after sequence S" sees exactly the changes after S: no gap, no duplicate.
public final class ChangeFeed: Sendable {
    public typealias Listener = @Sendable (FeedSignal) -> Void

    struct State {
        var last: Int64
        var floor: Int64
        /// Document events recorded up to `last`, and up to `floor` (what the retention counts).
        var lastTotal: Int64 = 0
        var floorTotal: Int64 = 0
        var listeners: [Int: Listener] = [:]
        var next = 1
        var ended: StoreError?
    }

    private let state: Mutex<State>

    init(last: Int64, floor: Int64, lastTotal: Int64 = 0, floorTotal: Int64 = 0) {
        state = Mutex(State(last: last, floor: floor, lastTotal: lastTotal, floorTotal: floorTotal))
    }

    /// Document events recorded up to the last committed change, and up to the floor.
    var totals: (last: Int64, floor: Int64) { state.withLock { ($0.lastTotal, $0.floorTotal) } }

    /// The sequence of the last committed change (0 before the first).
    public var lastSequence: Int64 { state.withLock { $0.last } }

    /// Changes with a sequence at or below this were pruned from the durable feed and cannot be replayed.
    public var floor: Int64 { state.withLock { $0.floor } }

    /// Floor and last sequence, read together.
    var bounds: (floor: Int64, last: Int64) { state.withLock { ($0.floor, $0.last) } }

    /// Number of attached listeners.
    public var listenerCount: Int { state.withLock { $0.listeners.count } }

    /// Attaches `listener` to receive every change after `seq`, if none is committed yet.
    public func attach(after seq: Int64, _ listener: @escaping Listener) -> FeedAttachment {
        state.withLock { s in
            if let reason = s.ended { return .ended(reason) }
            guard s.last <= seq else { return .behind }
            let token = s.next
            s.next += 1
            s.listeners[token] = listener
            return .attached(token: token)
        }
    }

    /// Detaches a listener; it receives nothing more once this returns.
    public func detach(_ token: Int) {
        _ = state.withLock { $0.listeners.removeValue(forKey: token) }
    }

    func publish(_ entries: [FeedEntry], floor: Int64, total: Int64, floorTotal: Int64) {
        guard let last = entries.last?.seq else { return }
        state.withLock { s in
            s.last = last
            s.floor = floor
            s.lastTotal = total
            s.floorTotal = floorTotal
            for listener in s.listeners.values { listener(.entries(entries)) }
        }
    }

    /// Tells every listener the state was replaced; they stay attached.
    func reset(_ reason: StoreError) {
        state.withLock { s in for listener in s.listeners.values { listener(.reset(reason)) } }
    }

    /// Raises the floor after rows below it were pruned outside a write's publication (compaction).
    func raiseFloor(_ floor: Int64, total: Int64) {
        state.withLock { s in
            s.floor = max(s.floor, floor)
            s.floorTotal = max(s.floorTotal, total)
        }
    }

    /// Ends the feed: every listener gets `.ended(reason)` and is detached.
    func end(_ reason: StoreError) {
        state.withLock { s in
            guard s.ended == nil else { return }
            s.ended = reason
            for listener in s.listeners.values { listener(.ended(reason)) }
            s.listeners = [:]
        }
    }
}

/// The durable side of the change feed: one `feed` row per applied change, written in the change's transaction.
///
/// Rows hold reverse deltas, `{"d": events}`: an event names its document (`c`, `i`) and says how to get the document
/// *before* the change from the one *after* it, which also gives its type — nothing for an insert, the whole document
/// (`b`) for a delete, and for an update the earlier text of each top-level member the change altered (`u`) and the
/// members it added (`n`), or the whole document before (`w`) when its keys cannot be scanned. The row's origin is
/// "" for the database's home origin (`StampCoding.home`, the node that created it). The document after
/// an event is the current document when no later row touches it, else the "before" of the next event on it: a
/// reader walks back from the current documents, in one read transaction. An update costs the bytes it changed,
/// not a copy of the document, and no row needs the op log, which compaction prunes without looking at the feed.
///
/// Rows written by earlier versions are read as they are: an array of self-contained events (`a` after, `b` before)
/// or `{"e": events, "s": seq}` whose events point into change `s` of the row's origin in the op log
/// (`{"t":"insert","x":k}`: document operation `k` created the document; `{"b":before,"t":"update","x":k}`: the
/// `set`/`unset` patch `k` changed it). Compaction keeps those changes while such rows remain.
enum FeedLog {
    /// A stored event whose documents are not all known yet.
    enum Stored {
        /// Self-contained (rows of earlier versions): both documents are known.
        case complete(FeedEvent)
        /// A reverse delta: the document before follows from the one after, which a later event or the current
        /// document gives.
        case delta(DocKey, FeedEventType, Before)
        /// The change touched the document without a visible change (what it wrote lost to concurrent writes, or
        /// was already there): no event for subscribers, an entry for `doc.history`.
        case touched(DocKey)
    }

    /// How the document before a delta event follows from the one after it.
    enum Before {
        /// It did not exist (an insert).
        case absent
        /// This text (a delete, or an update whose keys could not be scanned).
        case whole(String)
        /// The document after with these members set back (raw earlier values) and these removed.
        case members(set: [String: JSONValue], unset: [String])
    }

    /// A decoded row.
    struct StoredRow {
        let seq: Int64
        let origin: NodeID
        let events: [Stored]
    }

    /// The stored form of `events`, and of the documents in `touched` that the change touched without a visible
    /// change (`{"_":1,"c":…,"i":…}`).
    static func encode(_ events: [FeedEvent], touched: [DocKey] = []) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(events.count * 48 + 16)
        out.append(contentsOf: #"{"d":["#.utf8)
        for (i, key) in touched.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out.append(contentsOf: #"{"_":1,"c":"#.utf8)
            JSONValue.writeString(key.collection, to: &out)
            out.append(contentsOf: #","i":"#.utf8)
            JSONValue.writeString(key.id, to: &out)
            out.append(UInt8(ascii: "}"))
        }
        if !touched.isEmpty && !events.isEmpty { out.append(UInt8(ascii: ",")) }
        for (i, e) in events.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out.append(UInt8(ascii: "{"))
            switch e.type {
            case .insert: break
            case .delete:
                out.append(contentsOf: #""b":"#.utf8)
                out.append(contentsOf: (e.beforeText ?? "null").utf8)
                out.append(UInt8(ascii: ","))
            case .update:
                if !appendDelta(before: e.beforeText ?? "", after: e.afterText ?? "", to: &out) {
                    out.append(contentsOf: #""w":"#.utf8)
                    out.append(contentsOf: (e.beforeText ?? "null").utf8)
                    out.append(UInt8(ascii: ","))
                }
            }
            out.append(contentsOf: #""c":"#.utf8)
            JSONValue.writeString(e.collection, to: &out)
            out.append(contentsOf: #","i":"#.utf8)
            JSONValue.writeString(e.id, to: &out)
            out.append(UInt8(ascii: "}"))
        }
        out.append(contentsOf: "]}".utf8)
        return String(decoding: out, as: UTF8.self)
    }

    /// Appends `"n":[…],"u":{…},` — the members `after` added, and the earlier text of those it altered or removed
    /// — when both canonical texts can be scanned (keys in order, none escaped); false (nothing appended) otherwise.
    static func appendDelta(before: String, after: String, to out: inout [UInt8]) -> Bool {
        var (before, after) = (before, after)
        return before.withUTF8 { b in
            after.withUTF8 { a in
                guard let bm = JSONScan.members(b), let am = JSONScan.members(a), sorted(bm), sorted(am) else { return false }
                var added: [String] = []
                var changed: [JSONScan.Member] = []
                var (i, j) = (0, 0)
                while i < bm.count || j < am.count {
                    if j == am.count || (i < bm.count && utf8Less(bm[i].key, am[j].key)) {
                        changed.append(bm[i])  // removed by the change
                        i += 1
                    } else if i == bm.count || utf8Less(am[j].key, bm[i].key) {
                        added.append(am[j].key)
                        j += 1
                    } else {
                        if !b[bm[i].value].elementsEqual(a[am[j].value]) { changed.append(bm[i]) }
                        i += 1
                        j += 1
                    }
                }
                if !added.isEmpty {
                    out.append(contentsOf: #""n":["#.utf8)
                    for (k, key) in added.enumerated() {
                        if k > 0 { out.append(UInt8(ascii: ",")) }
                        JSONValue.writeString(key, to: &out)
                    }
                    out.append(contentsOf: "],".utf8)
                }
                out.append(contentsOf: #""u":{"#.utf8)
                for (k, m) in changed.enumerated() {
                    if k > 0 { out.append(UInt8(ascii: ",")) }
                    JSONValue.writeString(m.key, to: &out)
                    out.append(UInt8(ascii: ":"))
                    out.append(contentsOf: UnsafeBufferPointer(rebasing: b[m.value]))
                }
                out.append(contentsOf: "},".utf8)
                return true
            }
        }
    }

    /// Whether the members' keys are strictly in canonical order.
    private static func sorted(_ members: [JSONScan.Member]) -> Bool {
        zip(members, members.dropFirst()).allSatisfy { utf8Less($0.key, $1.key) }
    }

    /// The document before a delta event of `type`, from the document after it (nil: none); throws `corrupt` when
    /// the two do not fit the type.
    static func before(_ b: Before, type: FeedEventType, after: String?, corrupt: () -> StoreError) throws -> String? {
        switch (type, b) {
        case (.insert, .absent):
            guard after != nil else { throw corrupt() }
            return nil
        case (.delete, .whole(let text)):
            guard after == nil else { throw corrupt() }
            return text
        case (.update, .whole(let text)):
            guard after != nil else { throw corrupt() }
            return text
        case (.update, .members(let set, let unset)):
            guard let after else { throw corrupt() }
            let bytes = Array(after.utf8)
            guard let members = bytes.withUnsafeBufferPointer(JSONScan.members) else { throw corrupt() }
            return String(decoding: JSONScan.splice(bytes, members, set: set, unset: unset), as: UTF8.self)
        default: throw corrupt()
        }
    }

    /// Decodes a stored row; `change` reads change `seq` of the row's origin from the op log (rows of earlier
    /// versions that point into it).
    static func decode(
        seq: Int64, origin: String, events text: String, home: NodeID?, change: (NodeID, UInt64) throws -> Change?
    ) throws -> StoredRow {
        func corrupt() -> StoreError {
            StoreError(.internalFailure, kind: "corrupt_feed", "feed entry \(seq) is corrupt")
        }
        guard let origin = origin.isEmpty ? home : NodeID(hex: origin) else { throw corrupt() }
        let items: [JSONValue]
        var changeSeq: UInt64?
        var deltas = false
        switch try JSONParser(maxDepth: 10_000).parse(text) {
        case .array(let a): items = a
        case .object(let o):
            if case .array(let a)? = o["d"], o.count == 1 {
                items = a
                deltas = true
            } else {
                guard case .array(let a)? = o["e"], case .int(let s)? = o["s"], s > 0 else { throw corrupt() }
                items = a
                changeSeq = UInt64(s)
            }
        default: throw corrupt()
        }
        var ops: [CRDTOp]?
        var events: [Stored] = []
        events.reserveCapacity(items.count)
        for item in items {
            guard case .object(let o) = item else { throw corrupt() }
            if deltas {
                guard case .string(let c)? = o["c"], case .string(let i)? = o["i"], o["t"] == nil else { throw corrupt() }
                if o["_"] != nil {
                    guard o.count == 3 else { throw corrupt() }
                    events.append(.touched(DocKey(collection: c, id: i)))
                    continue
                }
                let before: Before
                let type: FeedEventType
                switch (o["b"], o["w"], o["u"]) {
                case (.object(let doc)?, nil, nil):
                    (type, before) = (.delete, .whole(JSONValue.object(doc).jsonText))
                case (nil, .object(let doc)?, nil):
                    (type, before) = (.update, .whole(JSONValue.object(doc).jsonText))
                case (nil, nil, .object(let u)?):
                    var unset: [String] = []
                    for n in o["n"]?.arrayValue ?? [] {
                        guard case .string(let name) = n else { throw corrupt() }
                        unset.append(name)
                    }
                    (type, before) = (.update, .members(set: u, unset: unset))
                case (nil, nil, nil):
                    guard o["n"] == nil else { throw corrupt() }
                    (type, before) = (.insert, .absent)
                default: throw corrupt()
                }
                events.append(.delta(DocKey(collection: c, id: i), type, before))
                continue
            }
            guard case .string(let t)? = o["t"], let type = FeedEventType(rawValue: t) else { throw corrupt() }
            let before = o["b"]?.objectValue
            if case .int(let k)? = o["x"] {
                if ops == nil {
                    guard let changeSeq, let c = try change(origin, changeSeq) else { throw corrupt() }
                    ops = c.ops
                }
                guard k >= 0, k < ops!.count, case .doc(let op) = ops![Int(k)] else { throw corrupt() }
                var after: [String: JSONValue]
                switch type {
                case .insert:
                    after = op.set
                case .update:
                    guard let before else { throw corrupt() }
                    after = before
                    for (name, value) in op.set { after[name] = value }
                    for name in op.unset { after.removeValue(forKey: name) }
                case .delete: throw corrupt()
                }
                after["_id"] = .string(op.key.id)
                events.append(
                    .complete(
                        FeedEvent(
                            collection: op.key.collection, id: op.key.id, type: type, after: after,
                            afterText: JSONValue.object(after).jsonText, before: before,
                            beforeText: before.map { JSONValue.object($0).jsonText })))
                continue
            }
            guard case .string(let c)? = o["c"], case .string(let i)? = o["i"] else { throw corrupt() }
            let after = o["a"]?.objectValue
            events.append(
                .complete(
                    FeedEvent(
                        collection: c, id: i, type: type, after: after, afterText: after.map { JSONValue.object($0).jsonText },
                        before: before, beforeText: before.map { JSONValue.object($0).jsonText })))
        }
        return StoredRow(seq: seq, origin: origin, events: events)
    }
}

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
