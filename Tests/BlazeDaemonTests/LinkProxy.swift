import BlazeTestSupport
import Foundation
import NIOCore
import NIOPosix
import Synchronization
import Testing

/// A loopback TCP proxy in front of one daemon's sync port, standing for the network path of one link: the test opens
/// it, cuts it (a partition: its port refuses connections and the open ones close) or stalls it (connections stay open
/// and new ones are accepted, but no byte moves until it opens again: TCP flow control holds the senders back, as on
/// a path that silently stopped delivering). With several targets it is a failover load balancer: each connection goes
/// to the first target that accepts it.
final class LinkProxy: Sendable {
    /// The state of the path.
    enum Mode: String, Sendable {
        case open, stalled, partitioned
    }

    /// The proxy's own loopback port (the same across partitions).
    let port: Int
    private let targetPorts: [Int]
    private let state: Mutex<(mode: Mode, listener: (any Channel)?, open: [ObjectIdentifier: [any Channel]], budget: Int?)>

    /// Starts forwarding from a free loopback port to `127.0.0.1:targetPort`.
    convenience init(targetPort: Int) throws { try self.init(targetPorts: [targetPort]) }

    /// Starts forwarding from a free loopback port to the first of `127.0.0.1:targetPorts` that accepts.
    init(targetPorts: [Int]) throws {
        self.targetPorts = targetPorts
        state = Mutex((.open, nil, [:], nil))
        let box = Box()
        // A port outside the ephemeral range (`StablePorts`): after a partition the proxy listens on it again, and no
        // outbound connection of another test takes it meanwhile.
        var bound: (any Channel)?
        for attempt in 1...20 {
            do {
                bound = try Self.bind(port: StablePorts.next(), box: box)
                break
            } catch where attempt < 20 {
                continue
            }
        }
        let listener = try #require(bound)
        port = listener.localAddress?.port ?? 0
        self.box = box
        state.withLock { $0.listener = listener }
        box.value = self
    }

    private let box: Box

    /// The current mode.
    var mode: Mode { state.withLock { $0.mode } }

    /// Lets `bytes` more bytes through (both directions counted), then stalls the path: a transfer that would
    /// otherwise finish before the test acts on it stops in the middle, however fast the machine.
    func stall(after bytes: Int) {
        state.withLock { $0.budget = bytes }
    }

    /// Counts `bytes` forwarded against the budget, stalling the path once it is spent.
    fileprivate func forwarded(_ bytes: Int) {
        let spent = state.withLock { s -> Bool in
            guard let budget = s.budget else { return false }
            s.budget = budget - bytes
            return budget - bytes <= 0
        }
        if spent { try? set(.stalled) }
    }

    /// Opens, stalls or cuts the path (and forgets any budget `stall(after:)` set).
    func set(_ mode: Mode) throws {
        let (old, listener, connections) = state.withLock { s in
            defer { (s.mode, s.budget) = (mode, nil) }
            return (s.mode, s.listener, Array(s.open.values.joined()))
        }
        guard old != mode else { return }
        switch mode {
        case .partitioned:
            state.withLock { $0.listener = nil }
            try? listener?.close().wait()
            for c in connections { c.close(promise: nil) }
        case .stalled:
            for c in connections { c.setOption(.autoRead, value: false).whenFailure { _ in } }
        case .open:
            if old == .partitioned {
                // The port was free a moment ago; another process may take it meanwhile (rare): a few tries.
                var attempt = 0
                while true {
                    do {
                        let bound = try Self.bind(port: port, box: box)
                        state.withLock { $0.listener = bound }
                        break
                    } catch where attempt < 20 {
                        attempt += 1
                        usleep(50_000)
                    }
                }
            }
            for c in connections { c.setOption(.autoRead, value: true).whenFailure { _ in } }
        }
    }

    /// Stops listening and closes every connection.
    func shutdown() {
        let (listener, connections) = state.withLock { s in
            defer { (s.mode, s.listener, s.open, s.budget) = (.partitioned, nil, [:], nil) }
            return (s.listener, Array(s.open.values.joined()))
        }
        try? listener?.close().wait()
        for c in connections { try? c.close().wait() }
    }

    private static func bind(port: Int, box: Box) throws -> any Channel {
        try ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelOption(.autoRead, value: false)
            .childChannelInitializer { inbound in
                guard let proxy = box.value else { return inbound.close() }
                return proxy.splice(inbound)
            }
            .bind(host: "127.0.0.1", port: port).wait()
    }

    /// Connects `inbound` to the target; both read only while the path is open.
    private func splice(_ inbound: any Channel) -> EventLoopFuture<Void> {
        let key = ObjectIdentifier(inbound)
        let proxy = self
        return Self.connect(targetPorts[...], on: inbound.eventLoop)
            .flatMap { outbound in
                inbound.eventLoop.makeCompletedFuture {
                    try inbound.pipeline.syncOperations.addHandler(Glue(partner: outbound, proxy: proxy))
                    try outbound.pipeline.syncOperations.addHandler(Glue(partner: inbound, proxy: proxy))
                    let mode = proxy.state.withLock { s -> Mode in
                        if s.mode != .partitioned { s.open[key] = [inbound, outbound] }
                        return s.mode
                    }
                    guard mode != .partitioned else {
                        inbound.close(promise: nil)
                        outbound.close(promise: nil)
                        return
                    }
                    inbound.closeFuture.whenComplete { _ in _ = proxy.state.withLock { $0.open.removeValue(forKey: key) } }
                    if mode == .open {
                        inbound.setOption(.autoRead, value: true).whenFailure { _ in }
                        outbound.setOption(.autoRead, value: true).whenFailure { _ in }
                    }
                }
            }
            .flatMapError { _ in inbound.close() }
    }

    /// A connection to the first of `ports` that accepts one.
    private static func connect(_ ports: ArraySlice<Int>, on loop: any EventLoop) -> EventLoopFuture<any Channel> {
        guard let port = ports.first else { return loop.makeFailedFuture(ChannelError.connectPending) }
        return ClientBootstrap(group: loop)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelOption(.autoRead, value: false)
            .connect(host: "127.0.0.1", port: port)
            .flatMapError { error in ports.count > 1 ? connect(ports.dropFirst(), on: loop) : loop.makeFailedFuture(error) }
    }

    /// A box filled in once the proxy exists (the child initializer runs later, on connections).
    private final class Box: @unchecked Sendable {
        // @unchecked: written once before the first connection can arrive, read only afterwards.
        var value: LinkProxy?
    }
}

/// Writes what one side reads to the other, and closes the other when this side closes.
private final class Glue: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    let partner: any Channel
    let proxy: LinkProxy

    init(partner: any Channel, proxy: LinkProxy) {
        self.partner = partner
        self.proxy = proxy
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        partner.writeAndFlush(buffer, promise: nil)
        proxy.forwarded(buffer.readableBytes)
    }

    func channelInactive(context: ChannelHandlerContext) {
        partner.close(promise: nil)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
