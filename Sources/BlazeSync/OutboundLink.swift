import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeWire
import NIOCore
import NIOPosix
import Synchronization

/// A reconnecting outbound connection to one peer for one database, with exponential backoff (0.1 s doubling to the
/// engine's `retryMaxMs`, 5 s by default; reset when a session that lasted a second ends, so a peer that accepts the
/// handshake and then closes at once, as a member does with a device it removed, is not redialed ten times a
/// second). While the peer's host refuses the
/// connection (it is up and nothing listens on the port: the usual sign of a daemon restarting) the delay stops growing
/// at 1 s, so the link is back within a second of the peer's return.
final class OutboundLink: Sendable {
    /// The longest delay while the peer's host refuses connections, in milliseconds.
    static let maxDelayRefusedMs = 1_000

    let engine: SyncEngine
    let space: SharedSpace
    let address: PeerAddress
    var db: BlazeDatabase { space.db }

    private struct State {
        var stopped = false
        var channel: (any Channel)?
        var retry: Scheduled<Void>?
        var failures = 0
        var connecting = false
        /// When the current connection's handshake succeeded.
        var established: ContinuousClock.Instant?
    }

    /// How long a session must last for its end to reset the backoff.
    static let steadySession: Duration = .seconds(1)

    private let state = Mutex(State())
    private let loop: any EventLoop

    init(engine: SyncEngine, space: SharedSpace, address: PeerAddress) {
        self.engine = engine
        self.space = space
        self.address = address
        self.loop = engine.group.next()
    }

    /// Dials the peer unless stopped, already connected or connecting.
    func connect() {
        let go = state.withLock { s -> Bool in
            guard !s.stopped, !s.connecting, s.channel == nil else { return false }
            s.connecting = true
            s.retry?.cancel()
            s.retry = nil
            return true
        }
        guard go else { return }
        let peer = address.description
        // Relays speak only WebSocket; a daemon's sync port only TCP.
        let relay = if case .webSocket = address.transport { true } else { false }
        let link = self
        ClientBootstrap(group: loop)
            .connectTimeout(.seconds(5))
            .channelOption(.socketOption(.so_keepalive), value: 1)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync: @Sendable (any Channel) throws -> Void = { channel in
                        try channel.pipeline.syncOperations.addHandlers(
                            SyncPipeline.outbound(engine: link.engine, space: link.space, peer: peer, relay: relay) {
                                link.state.withLock { $0.established = .now }
                            })
                    }
                    switch link.address.transport {
                    case .tcp:
                        try sync(channel)
                    case .webSocket(let tls, let path):
                        if tls { try link.engine.tls.configure(channel, host: link.address.host) }
                        try WebSocketClient.configure(
                            channel, host: link.address.host, port: link.address.port, path: path,
                            refused: { link.failed($0) }, upgraded: sync)
                    }
                }
            }
            .connect(host: address.host, port: address.port)
            .whenComplete { result in
                switch result {
                case .success(let channel):
                    let keep = link.state.withLock { s -> Bool in
                        s.connecting = false
                        guard !s.stopped else { return false }
                        s.channel = channel
                        return true
                    }
                    guard keep else {
                        channel.close(promise: nil)
                        return
                    }
                    channel.closeFuture.whenComplete { _ in
                        link.state.withLock { s in
                            if let since = s.established, ContinuousClock.now - since >= Self.steadySession { s.failures = 0 }
                            s.established = nil
                            s.channel = nil
                        }
                        link.scheduleRetry()
                    }
                case .failure(let error):
                    link.state.withLock { $0.connecting = false }
                    link.failed("connect: \(error)")
                    link.scheduleRetry(refused: Self.isRefused(error))
                }
            }
    }

    /// Counts a failed attempt in the link's status.
    private func failed(_ reason: String) {
        engine.status.update(db: db.name, peer: address.description, direction: .outbound) {
            $0.errors += 1
            $0.lastError = reason
        }
    }

    /// True when every address of the peer actively refused the connection (`ECONNREFUSED`).
    static func isRefused(_ error: any Error) -> Bool {
        if let io = error as? IOError { return io.errnoCode == ECONNREFUSED }
        guard let failed = error as? NIOConnectionError, !failed.connectionErrors.isEmpty else { return false }
        return failed.connectionErrors.allSatisfy { ($0.error as? IOError)?.errnoCode == ECONNREFUSED }
    }

    /// Schedules the next attempt after the backoff delay (shorter when the peer's host `refused` the connection).
    private func scheduleRetry(refused: Bool = false) {
        let link = self
        let most = refused ? min(Self.maxDelayRefusedMs, engine.retryMaxMs) : engine.retryMaxMs
        state.withLock { s in
            guard !s.stopped, s.retry == nil else { return }
            let delay = min(most, 100 << min(s.failures, 16))
            s.failures += 1
            s.retry = loop.scheduleTask(in: .milliseconds(Int64(delay))) {
                link.state.withLock { $0.retry = nil }
                link.connect()
            }
        }
    }

    /// Connects now if waiting for a retry.
    func retryNow() {
        state.withLock { s in
            s.failures = 0
            s.retry?.cancel()
            s.retry = nil
        }
        connect()
    }

    /// Stops retrying and closes the connection, if any.
    func stop() {
        let channel = state.withLock { s -> (any Channel)? in
            s.stopped = true
            s.retry?.cancel()
            s.retry = nil
            return s.channel
        }
        channel?.close(promise: nil)
    }
}
