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
/// A row's `events` is either an array of self-contained events (`a` after, `b` before, `c` collection, `i` id, `t`
/// type), or `{"e": events, "s": seq}` when some events point into the change (origin, `s`) in the op log instead
/// of repeating a document it already holds: `{"t":"insert","x":k}` is the document operation `k` of the change
/// created (its `set` with `_id`), and `{"b":before,"t":"update","x":k}` the document before operation `k`, a patch
/// of `set`/`unset` only, changed it. The op log is never pruned, so the change is there whenever the row is.
enum FeedLog {
    /// Where a recorded event's "after" document can be found again.
    enum Source {
        /// Only in the event itself.
        case none
        /// Operation `op` of the change created the document: its `set` with `_id`.
        case inserted(op: Int)
        /// Operation `op` of the change, a `set`/`unset` patch, made it from the event's "before".
        case patched(op: Int)
    }

    /// The stored form of `events`, the changes of change `changeSeq` (of the row's origin); `sources` gives, per
    /// event, what it may point to instead of holding its "after".
    static func encode(_ events: [FeedEvent], sources: [Source], changeSeq: UInt64) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(events.reduce(16) { $0 + ($1.afterText?.utf8.count ?? 0) + ($1.beforeText?.utf8.count ?? 0) + 64 })
        let pointing = sources.contains { if case .none = $0 { false } else { true } }
        if pointing { out.append(contentsOf: #"{"e":"#.utf8) }
        out.append(UInt8(ascii: "["))
        for (i, e) in events.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            out.append(UInt8(ascii: "{"))
            switch (i < sources.count ? sources[i] : .none, e.type) {
            case (.inserted(let op), .insert):
                out.append(contentsOf: #""t":"insert","x":"#.utf8)
                out.append(contentsOf: String(op).utf8)
            case (.patched(let op), .update) where e.beforeText != nil:
                out.append(contentsOf: #""b":"#.utf8)
                out.append(contentsOf: e.beforeText!.utf8)
                out.append(contentsOf: #","t":"update","x":"#.utf8)
                out.append(contentsOf: String(op).utf8)
            default:
                if let a = e.afterText {
                    out.append(contentsOf: #""a":"#.utf8)
                    out.append(contentsOf: a.utf8)
                    out.append(UInt8(ascii: ","))
                }
                if let b = e.beforeText {
                    out.append(contentsOf: #""b":"#.utf8)
                    out.append(contentsOf: b.utf8)
                    out.append(UInt8(ascii: ","))
                }
                out.append(contentsOf: #""c":"#.utf8)
                JSONValue.writeString(e.collection, to: &out)
                out.append(contentsOf: #","i":"#.utf8)
                JSONValue.writeString(e.id, to: &out)
                out.append(contentsOf: #","t":""#.utf8)
                out.append(contentsOf: e.type.rawValue.utf8)
                out.append(UInt8(ascii: "\""))
            }
            out.append(UInt8(ascii: "}"))
        }
        out.append(UInt8(ascii: "]"))
        if pointing {
            out.append(contentsOf: #","s":"#.utf8)
            out.append(contentsOf: String(changeSeq).utf8)
            out.append(UInt8(ascii: "}"))
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Decodes a stored row; `change` reads change `seq` of the row's origin from the op log (for pointing events).
    static func decode(
        seq: Int64, origin: String, events text: String, change: (NodeID, UInt64) throws -> Change?
    ) throws -> FeedEntry {
        func corrupt() -> StoreError {
            StoreError(.internalFailure, kind: "corrupt_feed", "feed entry \(seq) is corrupt")
        }
        guard let origin = NodeID(hex: origin) else { throw corrupt() }
        let items: [JSONValue]
        var changeSeq: UInt64?
        switch try JSONParser(maxDepth: 10_000).parse(text) {
        case .array(let a): items = a
        case .object(let o):
            guard case .array(let a)? = o["e"], case .int(let s)? = o["s"], s > 0 else { throw corrupt() }
            items = a
            changeSeq = UInt64(s)
        default: throw corrupt()
        }
        var ops: [CRDTOp]?
        var events: [FeedEvent] = []
        events.reserveCapacity(items.count)
        for item in items {
            guard case .object(let o) = item, case .string(let t)? = o["t"], let type = FeedEventType(rawValue: t) else {
                throw corrupt()
            }
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
                    FeedEvent(
                        collection: op.key.collection, id: op.key.id, type: type, after: after,
                        afterText: JSONValue.object(after).jsonText, before: before,
                        beforeText: before.map { JSONValue.object($0).jsonText }))
                continue
            }
            guard case .string(let c)? = o["c"], case .string(let i)? = o["i"] else { throw corrupt() }
            let after = o["a"]?.objectValue
            events.append(
                FeedEvent(
                    collection: c, id: i, type: type, after: after, afterText: after.map { JSONValue.object($0).jsonText },
                    before: before, beforeText: before.map { JSONValue.object($0).jsonText }))
        }
        return FeedEntry(seq: seq, origin: origin, events: events)
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
            let rows = try Row.fetchCursor(
                db, sql: "SELECT seq, origin, events FROM feed WHERE seq > ? ORDER BY seq LIMIT ?",
                arguments: [seq, limit])
            var out: [FeedEntry] = []
            var events = 0
            while let row = try rows.next() {
                let entry = try FeedLog.decode(seq: row[0], origin: row[1], events: row[2]) { origin, seq in
                    try String.fetchOne(
                        db, sql: "SELECT body FROM changes WHERE origin = ? AND seq = ?", arguments: [origin.hex, Int64(seq)]
                    ).map { try Change(json: try JSONParser(maxDepth: 10_000).parse($0)) }
                }
                out.append(entry)
                events += entry.events.count
                if events >= maxEvents { break }
            }
            return out
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
