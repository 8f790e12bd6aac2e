import BlazeProtocol
import BlazeStore
import BlazeSync
import Foundation
import Metrics
import Prometheus
import Synchronization

/// What blazed counts for Prometheus (`metrics-listen`'s `GET /metrics`, and `daemon.metrics`), through swift-metrics
/// into a registry of its own, so that several daemons in one process (tests, `blazebench`) keep apart.
///
/// Requests are counted as they finish; the store reports its group commits and compactions (`StoreMetrics`); the
/// rest (databases, connections, sync per peer) is read when the metrics are rendered. Label values are bounded: a
/// method is one of the protocol document's or `unknown`, an outcome `ok` or an error kind, a peer one this daemon
/// syncs with.
final class DaemonMetrics: Sendable {
    let registry = PrometheusCollectorRegistry()
    private let factory: PrometheusMetricsFactory
    /// The store's instruments (group commits, commits, compactions).
    let store: StoreMetrics
    /// Per known method: its latency histogram and its `ok` counter.
    private let requests: [String: (duration: Metrics.Timer, ok: Metrics.Counter)]
    /// Failed requests by method and error kind, made on first use.
    private let failures = Mutex<[String: Metrics.Counter]>([:])
    /// Each live delivery's unsent bytes on its connection when it was written (a subscriber's queue depth).
    private let subscriberBacklog: Metrics.Recorder
    /// Subscriptions dropped for falling behind (`subscriber_too_slow`).
    let subscribersDropped: Metrics.Counter
    /// Instruments read from a snapshot when rendering, by family and labels; renders take turns.
    private let snapshot = Mutex(SnapshotInstruments())

    /// The method label of a request naming no known method.
    static let unknownMethod = "unknown"

    init() {
        var f = PrometheusMetricsFactory(registry: registry)
        f.valueHistogramBuckets[StoreMetrics.groupSizeLabel] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
        f.valueHistogramBuckets["blazed_subscriber_backlog_bytes"] = [0, 1024, 16_384, 131_072, 1_048_576, 4_194_304, 8_388_608, 33_554_432]
        f.defaultDurationHistogramBuckets = [
            .microseconds(50), .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1),
            .milliseconds(2.5), .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50),
            .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1), .seconds(2.5), .seconds(10),
        ]
        factory = f
        store = StoreMetrics(factory: f)
        var requests: [String: (Metrics.Timer, Metrics.Counter)] = [:]
        for name in RPCMethod.allCases.map(\.rawValue) + [Self.unknownMethod] {
            requests[name] = (
                Metrics.Timer(label: "blazed_request_seconds", dimensions: [("method", name)], factory: f),
                Metrics.Counter(label: "blazed_requests_total", dimensions: [("method", name), ("outcome", "ok")], factory: f)
            )
        }
        self.requests = requests
        subscriberBacklog = Metrics.Recorder(label: "blazed_subscriber_backlog_bytes", aggregate: true, factory: f)
        subscribersDropped = Metrics.Counter(label: "blazed_subscribers_dropped_total", factory: f)
    }

    /// Counts one finished request to `method`: `kind` nil when it succeeded, else its error's kind.
    func request(_ method: String, kind: String?, started: ContinuousClock.Instant) {
        let elapsed = ContinuousClock.now - started
        let nanoseconds = elapsed.components.seconds * 1_000_000_000 + elapsed.components.attoseconds / 1_000_000_000
        if let instruments = requests[method] {
            instruments.duration.recordNanoseconds(nanoseconds)
            guard let kind else { return instruments.ok.increment() }
            failure(method: method, kind: kind).increment()
        } else {
            // An unknown name always fails (`method_not_found`).
            requests[Self.unknownMethod]!.duration.recordNanoseconds(nanoseconds)
            failure(method: Self.unknownMethod, kind: kind ?? "method_not_found").increment()
        }
    }

    /// Counts a line that was no request (unparsable, invalid, oversize) as a failed request to `unknown`.
    func malformed(kind: String) {
        failure(method: Self.unknownMethod, kind: kind).increment()
    }

    private func failure(method: String, kind: String) -> Metrics.Counter {
        failures.withLock { f in
            let key = method + "\u{0}" + kind
            if let c = f[key] { return c }
            let c = Metrics.Counter(
                label: "blazed_requests_total", dimensions: [("method", method), ("outcome", kind)], factory: factory)
            f[key] = c
            return c
        }
    }

    /// Records a subscriber's queue depth when an event is written to it.
    func subscriberBacklog(bytes: Int) {
        subscriberBacklog.record(bytes)
    }

    /// The last text rendered and when: renders within `renderReuse` of it return it again.
    private let lastRender = Mutex<(text: [UInt8], at: ContinuousClock.Instant)?>(nil)
    /// How long a rendered text is reused: scrapes and Studio pages arriving together cost one render.
    static let renderReuse = Duration.seconds(1)

    /// The exposition text, with the values read from `context` within the last second. It reads the databases open
    /// now (a database no one has used since the start is not opened for it) and each one's sync status in memory.
    func render(_ context: RequestContext) -> [UInt8] {
        if let last = lastRender.withLock({ $0 }), ContinuousClock.now - last.at < Self.renderReuse { return last.text }
        return snapshot.withLock { s in
            // Another thread may have rendered while this one waited for the lock.
            if let last = lastRender.withLock({ $0 }), ContinuousClock.now - last.at < Self.renderReuse { return last.text }
            s.begin()
            s.gauge("blazed_info", [("version", blazeVersion)], 1)
            let uptime = ContinuousClock.now - context.startedAt
            s.gauge("blazed_uptime_seconds", [], Double(uptime.components.seconds))
            s.gauge("blazed_connections", [], context.connections.count)
            s.gauge("blazed_subscriptions", [], context.connections.subscriptions.load(ordering: .relaxed))
            s.gauge("blazed_databases", [], ((try? context.store.list()) ?? []).count)
            for name in context.store.openNames {
                guard let db = try? context.store.database(name) else { continue }
                s.gauge("blazed_database_file_bytes", [("db", name)], context.store.fileBytes(of: name))
                let commits = db.groupCommitCounts
                s.counter("blazed_group_commits_total", [("db", name)], commits.groups)
                s.counter("blazed_group_commit_writes_total", [("db", name)], commits.writes)
                for peer in context.sync.status(db: db) { s.peer(peer, db: name) }
            }
            s.counter("blazed_sync_strangers_refused_total", [], context.sync.strangersRefusedCount)
            s.counter("blazed_sync_refused_over_limit_total", [], context.sync.refusedOverLimitCount)
            s.end(factory: factory)
            let text = registry.emitToBuffer()
            lastRender.withLock { $0 = (text, .now) }
            return text
        }
    }
}

/// The instruments `DaemonMetrics.render` sets from a snapshot: made on first sight of their labels, set to what the
/// snapshot says, and destroyed once a render no longer sees them (a peer removed, a database dropped).
struct SnapshotInstruments {
    private struct Key: Hashable {
        let name: String
        let labels: [String]
    }
    private enum Instrument {
        case counter(Metrics.Counter)
        case gauge(Metrics.Gauge)
    }
    private var instruments: [Key: Instrument] = [:]
    private var pending: [(Key, [(String, String)], Double, counter: Bool)] = []

    mutating func begin() { pending.removeAll(keepingCapacity: true) }

    /// Sets gauge `name` with `labels` to `value`.
    mutating func gauge(_ name: String, _ labels: [(String, String)], _ value: Double) {
        pending.append((Key(name: name, labels: labels.flatMap { [$0.0, $0.1] }), labels, value, false))
    }

    /// Sets gauge `name` with `labels` to `value`.
    mutating func gauge(_ name: String, _ labels: [(String, String)], _ value: Int) { gauge(name, labels, Double(value)) }

    /// Sets counter `name` with `labels` to `value`, a total kept elsewhere.
    mutating func counter(_ name: String, _ labels: [(String, String)], _ value: Int) {
        pending.append((Key(name: name, labels: labels.flatMap { [$0.0, $0.1] }), labels, Double(value), true))
    }

    /// One sync peer's counts: entries, bytes and chunks each way, connections, lag, errors, rejections by reason.
    mutating func peer(_ p: PeerStatus, db: String) {
        let l = [("db", db), ("peer", p.peer), ("direction", p.direction.rawValue)]
        gauge("blazed_sync_connections", l, p.connections)
        counter("blazed_sync_entries_sent_total", l, p.sentEntries)
        counter("blazed_sync_entries_received_total", l, p.receivedEntries)
        counter("blazed_sync_bytes_sent_total", l, p.sentBytes)
        counter("blazed_sync_bytes_received_total", l, p.receivedBytes)
        counter("blazed_sync_chunks_sent_total", l, p.chunksSent)
        counter("blazed_sync_chunks_received_total", l, p.chunksReceived)
        counter("blazed_sync_errors_total", l, p.errors)
        gauge("blazed_sync_peer_behind_entries", l, p.peerBehind)
        gauge("blazed_sync_self_behind_entries", l, p.selfBehind)
        for (reason, count) in p.rejected { counter("blazed_sync_rejections_total", l + [("reason", reason)], count) }
    }

    /// Makes what is new, sets everything pending, destroys what the snapshot no longer has.
    mutating func end(factory: PrometheusMetricsFactory) {
        var seen = Set<Key>()
        for (key, labels, value, isCounter) in pending {
            seen.insert(key)
            switch instruments[key] {
            case .counter(let c)?:
                c.reset()
                c.increment(by: Int64(value))
            case .gauge(let g)?:
                g.record(value)
            case nil where isCounter:
                let c = Metrics.Counter(label: key.name, dimensions: labels, factory: factory)
                c.increment(by: Int64(value))
                instruments[key] = .counter(c)
            case nil:
                let g = Metrics.Gauge(label: key.name, dimensions: labels, factory: factory)
                g.record(value)
                instruments[key] = .gauge(g)
            }
        }
        for (key, instrument) in instruments where !seen.contains(key) {
            switch instrument {
            case .counter(let c): c.destroy()
            case .gauge(let g): g.destroy()
            }
            instruments[key] = nil
        }
    }
}
