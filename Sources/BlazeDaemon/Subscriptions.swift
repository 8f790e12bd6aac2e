import BlazeCRDT
import BlazeProtocol
import BlazeStore
import Synchronization

/// One `subscribe` call: which changes of which database it reports, and its link to the live feed.
///
/// Created by the `subscribe` handler (on any thread); delivered to by the connection's `RPCHandler` on its event loop.
final class Subscription: Sendable {
    /// Daemon-unique id, sent with every notification.
    let id: String
    let database: BlazeDatabase
    /// Only this collection's documents, when set.
    let collection: String?
    /// A live query: documents matching it enter and leave; nil reports every change.
    let filter: Filter?
    /// Events after this feed sequence are delivered.
    let start: Int64
    /// Where blob fetch progress comes from, when the subscription asked for it (`blobs: true`).
    let blobEvents: BlobEvents?

    private struct Link {
        var token: Int?
        var blobToken: Int?
        var cancelled = false
    }

    private let link = Mutex(Link())
    private static let counter = Atomic<Int>(0)

    init(database: BlazeDatabase, collection: String?, filter: Filter?, start: Int64, blobEvents: BlobEvents? = nil) {
        let n = Self.counter.wrappingAdd(1, ordering: .relaxed).newValue
        self.id = "sub-\(n)"
        self.database = database
        self.collection = collection
        self.filter = filter
        self.start = start
        self.blobEvents = blobEvents
    }

    /// True once unsubscribed, dropped or closed; nothing more may be written for it.
    var isCancelled: Bool { link.withLock { $0.cancelled } }

    /// Records the live-feed token; detaches at once if the subscription was cancelled meanwhile.
    func attached(_ token: Int) {
        let detach = link.withLock { l -> Bool in
            if l.cancelled { return true }
            l.token = token
            return false
        }
        if detach { database.feed.detach(token) }
    }

    /// Starts passing the database's blob fetch progress to `sink` (a subscription with `blobs: true`), unless
    /// cancelled meanwhile.
    func listenForBlobs(_ sink: @escaping BlobEvents.Sink) {
        guard let blobEvents else { return }
        let token = blobEvents.listen(db: database.name, sink)
        let stop = link.withLock { l -> Bool in
            if l.cancelled { return true }
            l.blobToken = token
            return false
        }
        if stop { blobEvents.stop(token, db: database.name) }
    }

    /// Stops delivery for good (idempotent).
    func cancel() {
        let (token, blobToken) = link.withLock { l -> (Int?, Int?) in
            l.cancelled = true
            defer { (l.token, l.blobToken) = (nil, nil) }
            return (l.token, l.blobToken)
        }
        if let token { database.feed.detach(token) }
        if let blobToken { blobEvents?.stop(blobToken, db: database.name) }
    }

    /// The notification carrying blob fetch progress `event`.
    func blobNotification(_ event: RPCSchema.BlobProgress) -> [UInt8] {
        let params = RPCNotification.Subscription(subscription: id, blobs: [event])
        return RPCCodec.notification(method: RPCNotification.Subscription.method, params: params.json).jsonBytes + [0x0A]
    }

    /// Appends this subscription's events for `entry` to `out` as JSON objects; returns how many.
    func render(_ entry: FeedEntry, into out: inout String) -> Int {
        var count = 0
        for e in entry.events {
            if let collection, e.collection != collection { continue }
            let type: String
            if let filter {
                // Parsed once here: events keep their documents as text.
                let before = e.before
                let after = e.after
                let was = before.map(filter.matches) ?? false
                let isNow = after.map(filter.matches) ?? false
                switch (was, isNow) {
                case (false, true): type = before == nil ? "insert" : "enter"
                case (true, true): type = "update"
                case (true, false): type = after == nil ? "delete" : "leave"
                case (false, false): continue
                }
            } else {
                type = e.type.rawValue
            }
            if out.utf8.last != UInt8(ascii: "[") { out += "," }
            out += "{\"collection\":" + JSONValue.string(e.collection).jsonText
            if let doc = e.afterText { out += ",\"doc\":" + doc }
            out += ",\"id\":" + JSONValue.string(e.id).jsonText + ",\"origin\":\"" + entry.origin.hex
            out += "\",\"seq\":" + String(entry.seq) + ",\"type\":\"" + type + "\"}"
            count += 1
        }
        return count
    }

    /// The notification carrying events of `entries`, or nil when none concerns this subscription.
    func notification(_ entries: some Sequence<FeedEntry>) -> [UInt8]? {
        // Spliced, not built as `RPCNotification.Subscription`: a document's stored text goes out as it is, never
        // parsed for a notification (SubscriptionWireTests decode these lines as the generated type).
        var out = "{\"jsonrpc\":\"2.0\",\"method\":\"" + RPCNotification.Subscription.method + "\",\"params\":{\"events\":["
        var count = 0
        for entry in entries { count += render(entry, into: &out) }
        guard count > 0 else { return nil }
        out += "],\"subscription\":\"" + id + "\"}}\n"
        return Array(out.utf8)
    }

    /// The last notification of a subscription that ends because of `error`.
    func finalNotification(_ error: RPCError) -> [UInt8] {
        let params = RPCNotification.Subscription(
            subscription: id,
            error: .init(code: error.code, message: error.message, data: error.jsonValue["data"] ?? .object(["kind": .string(error.kind)])))
        return RPCCodec.notification(method: RPCNotification.Subscription.method, params: params.json).jsonBytes + [0x0A]
    }
}

/// What one connection shares between its request handlers (any thread) and its event loop: its subscriptions.
final class ConnectionHandle: Sendable {
    /// Connection id (for logs).
    let id: Int
    let maxSubscriptions: Int
    /// The daemon's connection table, which counts live subscriptions.
    let table: ConnectionTable

    private struct State {
        var subscriptions: [String: Subscription] = [:]
        /// Created by a request whose response is not written yet; they start once it is.
        var pending: [Subscription] = []
        var closed = false
    }

    private let state = Mutex(State())

    init(id: Int, maxSubscriptions: Int, table: ConnectionTable) {
        self.id = id
        self.maxSubscriptions = maxSubscriptions
        self.table = table
    }

    /// Registers a new subscription; it starts delivering after the current response is written.
    func add(_ sub: Subscription) throws(RPCError) {
        try state.withLock { (s: inout State) throws(RPCError) in
            guard !s.closed else {
                throw RPCError(code: RPCErrorCode.unavailable, kind: "connection_closing", message: "the connection is closing")
            }
            guard s.subscriptions.count < maxSubscriptions else {
                throw RPCError(
                    code: RPCErrorCode.limitExceeded, kind: "too_many_subscriptions",
                    message: "a connection may hold at most \(maxSubscriptions) subscriptions",
                    details: ["limit": .int(Int64(maxSubscriptions))])
            }
            s.subscriptions[sub.id] = sub
            s.pending.append(sub)
        }
        table.subscriptions.add(1, ordering: .relaxed)
    }

    /// Cancels and forgets a subscription; nil if this connection has none by that id.
    func remove(_ id: String) -> Subscription? {
        guard let sub = state.withLock({ $0.subscriptions.removeValue(forKey: id) }) else { return nil }
        table.subscriptions.subtract(1, ordering: .relaxed)
        sub.cancel()
        return sub
    }

    /// True while the subscription belongs to this connection.
    func contains(_ sub: Subscription) -> Bool {
        state.withLock { $0.subscriptions[sub.id] === sub }
    }

    /// Subscriptions waiting for their response to be written.
    func takePending() -> [Subscription] {
        state.withLock { s in
            defer { s.pending = [] }
            return s.pending
        }
    }

    /// Number of live subscriptions.
    var count: Int { state.withLock { $0.subscriptions.count } }

    /// Cancels everything; the connection is gone.
    func close() {
        let subs = state.withLock { s in
            s.closed = true
            defer { s.subscriptions = [:]; s.pending = [] }
            return Array(s.subscriptions.values)
        }
        table.subscriptions.subtract(subs.count, ordering: .relaxed)
        for sub in subs { sub.cancel() }
    }
}
