import BlazeCRDT
import BlazeProtocol
import Foundation
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
    /// What `attach` calls with each signal, on the writer's thread: it must return quickly.
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
