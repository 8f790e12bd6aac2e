import BlazeWire
import Metrics
import NIOCore
import NIOHTTP1
import NIOWebSocket
import Prometheus
import Synchronization

/// The HTTP side of a relay connection before (or instead of) its WebSocket upgrade: `GET /healthz` and
/// `GET /metrics` for operators, a clear status for anything else. Every response closes the connection, and a
/// connection that neither upgrades nor completes a request within the handshake timeout (from its admission) is
/// closed.
final class RelayHTTPFront: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    let relay: RelayServer
    let place: GatePlace
    /// Set when the WebSocket upgrade takes the connection over (with its gate place).
    var handedOver = false
    private var head: HTTPRequestHead?
    private var deadline: Scheduled<Void>?

    init(relay: RelayServer, place: GatePlace) {
        self.relay = relay
        self.place = place
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        let left = place.remaining(of: .milliseconds(relay.gate.limits.handshakeTimeoutMs))
        deadline = context.eventLoop.scheduleTask(in: TimeAmount(left)) {
            bound.value.close(promise: nil)
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline?.cancel()
    }

    func channelInactive(context: ChannelHandlerContext) {
        deadline?.cancel()
        if !handedOver { place.release() }
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let h):
            head = h
        case .body:
            break
        case .end:
            guard let head else { return }
            self.head = nil
            respond(to: head, context: context)
        }
    }

    private func respond(to head: HTTPRequestHead, context: ChannelHandlerContext) {
        let path = head.uri.split(separator: "?", maxSplits: 1).first.map(String.init) ?? head.uri
        let (status, type, body): (HTTPResponseStatus, String, [UInt8])
        switch (head.method, path) {
        case (.GET, "/healthz"):
            let total = relay.gate.current.total
            (status, type, body) = (
                .ok, "application/json",
                Array(#"{"status":"ok","spaces":\#(relay.servedCount),"connections":\#(total)}"#.utf8)
            )
        case (.GET, "/metrics"):
            (status, type, body) = (.ok, "text/plain; version=0.0.4; charset=utf-8", relay.metrics.render(relay: relay))
        case (.GET, relay.syncPath):
            (status, type, body) = (.upgradeRequired, "text/plain", Array("open a WebSocket here to sync\n".utf8))
        case (_, "/healthz"), (_, "/metrics"), (_, relay.syncPath):
            (status, type, body) = (.methodNotAllowed, "text/plain", Array("method not allowed\n".utf8))
        default:
            (status, type, body) = (.notFound, "text/plain", Array("not found\n".utf8))
        }
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: type)
        headers.add(name: "Content-Length", value: "\(body.count)")
        headers.add(name: "Connection", value: "close")
        if status == .upgradeRequired { headers.add(name: "Upgrade", value: "websocket") }
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: status, headers: headers))), promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(bytes: body)))), promise: nil)
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in bound.value.close(promise: nil) }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A WebSocket asked for on another path: the request follows, not upgraded, and is answered 404.
        if error is NIOWebSocketUpgradeError { return }
        context.close(promise: nil)
    }
}

/// What a relay counts for Prometheus (`GET /metrics`), through swift-metrics into its own registry, so that several
/// relays in one process (tests, `blazebench`) keep apart.
final class RelayMetrics: Sendable {
    let registry = PrometheusCollectorRegistry()
    private let factory: PrometheusMetricsFactory
    let entriesStored, bytesStored, entriesForwarded, bytesForwarded: Metrics.Counter
    let handshakesRefused, connectionsRefusedOverLimit, connectionsRefusedRate, connectionsEstablished: Metrics.Counter
    let storeErrors, storeTimeouts, acksKept, snapshotsKept, snapshotsSent, snapshotsDropped: Metrics.Counter
    let chunksStored, chunkBytesStored, chunksServed, chunkBytesServed, chunksOverQuota, chunksDropped: Metrics.Counter
    private let connections, handshaking, spaces: Metrics.Gauge
    private let rejections = Mutex<[String: Metrics.Counter]>([:])

    init() {
        let f = PrometheusMetricsFactory(registry: registry)
        factory = f
        entriesStored = Metrics.Counter(label: "blaze_relay_entries_stored_total", factory: f)
        bytesStored = Metrics.Counter(label: "blaze_relay_bytes_stored_total", factory: f)
        entriesForwarded = Metrics.Counter(label: "blaze_relay_entries_forwarded_total", factory: f)
        bytesForwarded = Metrics.Counter(label: "blaze_relay_bytes_forwarded_total", factory: f)
        handshakesRefused = Metrics.Counter(label: "blaze_relay_handshakes_refused_total", factory: f)
        connectionsRefusedOverLimit = Metrics.Counter(
            label: "blaze_relay_connections_refused_total", dimensions: [("reason", "limit")], factory: f)
        connectionsRefusedRate = Metrics.Counter(
            label: "blaze_relay_connections_refused_total", dimensions: [("reason", "rate")], factory: f)
        connectionsEstablished = Metrics.Counter(label: "blaze_relay_connections_established_total", factory: f)
        acksKept = Metrics.Counter(label: "blaze_relay_acks_kept_total", factory: f)
        snapshotsKept = Metrics.Counter(label: "blaze_relay_snapshots_kept_total", factory: f)
        snapshotsSent = Metrics.Counter(label: "blaze_relay_snapshots_sent_total", factory: f)
        snapshotsDropped = Metrics.Counter(label: "blaze_relay_snapshots_dropped_total", factory: f)
        chunksStored = Metrics.Counter(label: "blaze_relay_chunks_stored_total", factory: f)
        chunkBytesStored = Metrics.Counter(label: "blaze_relay_chunk_bytes_stored_total", factory: f)
        chunksServed = Metrics.Counter(label: "blaze_relay_chunks_served_total", factory: f)
        chunkBytesServed = Metrics.Counter(label: "blaze_relay_chunk_bytes_served_total", factory: f)
        chunksOverQuota = Metrics.Counter(label: "blaze_relay_chunks_over_quota_total", factory: f)
        chunksDropped = Metrics.Counter(label: "blaze_relay_chunks_dropped_total", factory: f)
        storeErrors = Metrics.Counter(label: "blaze_relay_store_failures_total", dimensions: [("reason", "error")], factory: f)
        storeTimeouts = Metrics.Counter(
            label: "blaze_relay_store_failures_total", dimensions: [("reason", "timeout")], factory: f)
        connections = Metrics.Gauge(label: "blaze_relay_connections", factory: f)
        handshaking = Metrics.Gauge(label: "blaze_relay_connections_handshaking", factory: f)
        spaces = Metrics.Gauge(label: "blaze_relay_spaces", factory: f)
    }

    /// Counts a batch or message refused for `reason` (a `SyncRejection` raw value).
    func rejected(_ reason: String) {
        let counter = rejections.withLock { r in
            if let c = r[reason] { return c }
            let c = Metrics.Counter(label: "blaze_relay_rejections_total", dimensions: [("reason", reason)], factory: factory)
            r[reason] = c
            return c
        }
        counter.increment()
    }

    /// The exposition text, with the gauges read now.
    func render(relay: RelayServer) -> [UInt8] {
        let (total, shaking, _) = relay.gate.current
        connections.record(total)
        handshaking.record(shaking)
        spaces.record(relay.servedCount)
        return registry.emitToBuffer()
    }
}
