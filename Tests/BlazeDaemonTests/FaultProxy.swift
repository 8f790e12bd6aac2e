import BlazeTestSupport
import NIOCore
import NIOPosix
import Synchronization

/// A loopback TCP proxy that forwards to `target` and, while `faulty` is on, damages the traffic of every connection
/// with faults drawn from a seeded generator: one at a time per connection, at a random byte offset, in a random
/// direction. `flip`, `drop`, `duplicate` and `reorder` corrupt the stream; `truncate` closes both sides mid-stream;
/// `delay` holds the traffic back for a moment (and the next fault is drawn after it).
final class FaultProxy: Sendable {
    enum Fault: String, CaseIterable, Sendable {
        case flip, drop, duplicate, reorder, truncate, delay

        /// True for faults that put bytes on the wire that the sender never sent (the receiver must refuse them).
        var corrupts: Bool { self != .truncate && self != .delay }
    }

    /// The proxy's own loopback port.
    let port: Int
    private let channel: any Channel
    private let faulty = Atomic<Bool>(true)
    private let rng: Mutex<SeededRandom>
    private let appliedFaults = Mutex<[Fault: Int]>([:])
    private let open = Mutex<[ObjectIdentifier: any Channel]>([:])

    /// Starts forwarding from a free loopback port to `127.0.0.1:targetPort`.
    init(targetPort: Int, seed: UInt64) throws {
        rng = Mutex(SeededRandom(seed: seed))
        let group = MultiThreadedEventLoopGroup.singleton
        let proxy = Box()
        channel = try ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { inbound in
                guard let proxy = proxy.value else { return inbound.close() }
                return proxy.splice(inbound, targetPort: targetPort)
            }
            .bind(host: "127.0.0.1", port: 0).wait()
        port = channel.localAddress?.port ?? 0
        proxy.value = self
    }

    /// Turns fault injection on or off (off also disarms faults drawn for open connections).
    func setFaulty(_ on: Bool) { faulty.store(on, ordering: .sequentiallyConsistent) }

    var isFaulty: Bool { faulty.load(ordering: .sequentiallyConsistent) }

    /// Faults applied so far, by kind.
    var applied: [Fault: Int] { appliedFaults.withLock { $0 } }

    /// Stops listening and closes every open connection.
    func shutdown() {
        try? channel.close().wait()
        for c in open.withLock({ Array($0.values) }) { try? c.close().wait() }
    }

    fileprivate func note(_ fault: Fault) { appliedFaults.withLock { $0[fault, default: 0] += 1 } }

    /// The next fault for a connection, `after` bytes into one of its directions (0: client to server).
    fileprivate func draw(after: [Int]) -> Plan? {
        guard isFaulty else { return nil }
        return rng.withLock { r in
            let fault = Fault.allCases.randomElement(using: &r)!
            let direction = Int.random(in: 0...1, using: &r)
            return Plan(
                fault: fault, direction: direction, offset: after[direction] + Int.random(in: 0..<6000, using: &r),
                size: Int.random(in: 1...64, using: &r), bit: UInt8(Int.random(in: 0...7, using: &r)),
                delayMs: Int64.random(in: 50...300, using: &r))
        }
    }

    private func splice(_ inbound: any Channel, targetPort: Int) -> EventLoopFuture<Void> {
        let connection = Connection(proxy: self)
        let key = ObjectIdentifier(connection)
        open.withLock { $0[key] = inbound }
        inbound.closeFuture.whenComplete { [self] _ in _ = open.withLock { $0.removeValue(forKey: key) } }
        connection.plan = draw(after: [0, 0])
        // The server side speaks first: its handler must be in place before the connection completes.
        return ClientBootstrap(group: inbound.eventLoop)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelInitializer { outbound in
                outbound.eventLoop.makeCompletedFuture {
                    try outbound.pipeline.syncOperations.addHandler(Forwarder(connection: connection, direction: 1))
                }
            }
            .connect(host: "127.0.0.1", port: targetPort)
            .flatMap { outbound in
                inbound.eventLoop.makeCompletedFuture {
                    connection.attach(inbound: inbound, outbound: outbound)
                    try inbound.pipeline.syncOperations.addHandler(Forwarder(connection: connection, direction: 0))
                }
            }
            .flatMapError { _ in inbound.close() }
    }

    /// A box filled in once the server channel exists (the initializer runs later, on connections).
    private final class Box: @unchecked Sendable {
        // @unchecked: written once before the first connection can arrive, read only afterwards.
        var value: FaultProxy?
    }
}

/// One fault waiting to happen on a connection.
struct Plan {
    let fault: FaultProxy.Fault
    let direction: Int
    let offset: Int
    let size: Int
    let bit: UInt8
    let delayMs: Int64
}

/// The state of one proxied connection; touched only on its event loop.
private final class Connection: @unchecked Sendable {
    // @unchecked: both channels of a connection share one event loop, and only handlers on it touch this.
    let proxy: FaultProxy
    var channels: [any Channel] = []
    var plan: Plan?
    /// Bytes forwarded so far per direction (0: client to server, 1: server to client).
    var forwarded = [0, 0]
    /// A chunk held back to be sent after the next one (reorder), per direction.
    var held: [ByteBuffer?] = [nil, nil]
    /// Chunks queued behind a delay, per direction, and when the delay ends.
    var delayed: [[ByteBuffer]] = [[], []]
    var closing = false
    /// Chunks read from the server before the client side was attached.
    var early: [ByteBuffer] = []

    init(proxy: FaultProxy) { self.proxy = proxy }

    func attach(inbound: any Channel, outbound: any Channel) {
        channels = [inbound, outbound]
        for chunk in early { forward(chunk, direction: 1) }
        early = []
    }

    /// Forwards a chunk read in `direction`, applying the current fault when its offset falls inside it.
    func forward(_ chunk: ByteBuffer, direction: Int) {
        guard channels.count == 2 else {
            early.append(chunk)
            return
        }
        var chunk = chunk
        let start = forwarded[direction]
        forwarded[direction] += chunk.readableBytes
        if !proxy.isFaulty { plan = nil }
        guard let plan, plan.direction == direction, start + chunk.readableBytes > plan.offset else {
            emit(chunk, direction: direction)
            return
        }
        let at = plan.offset - start
        proxy.note(plan.fault)
        self.plan = nil
        switch plan.fault {
        case .flip:
            let index = chunk.readerIndex + at
            chunk.setInteger(chunk.getInteger(at: index, as: UInt8.self)! ^ (1 << plan.bit), at: index)
            emit(chunk, direction: direction)
        case .drop:
            let head = chunk.getSlice(at: chunk.readerIndex, length: at)!
            let skip = min(plan.size, chunk.readableBytes - at)
            emit(head, direction: direction)
            emit(chunk.getSlice(at: chunk.readerIndex + at + skip, length: chunk.readableBytes - at - skip)!, direction: direction)
        case .duplicate:
            emit(chunk, direction: direction)
            emit(chunk.getSlice(at: chunk.readerIndex + at, length: chunk.readableBytes - at)!, direction: direction)
        case .reorder:
            emit(chunk.getSlice(at: chunk.readerIndex, length: at)!, direction: direction)
            held[direction] = chunk.getSlice(at: chunk.readerIndex + at, length: chunk.readableBytes - at)!
            return  // the next chunk goes first; no new fault until then
        case .truncate:
            emit(chunk.getSlice(at: chunk.readerIndex, length: at)!, direction: direction)
            closing = true
            for c in channels { c.close(promise: nil) }
            return
        case .delay:
            delayed[direction].append(chunk)
            channels[0].eventLoop.scheduleTask(in: .milliseconds(plan.delayMs)) { [self] in
                let queued = delayed[direction]
                delayed[direction] = []
                for b in queued { write(b, direction: direction) }
            }
            self.plan = proxy.draw(after: forwarded)
        }
        // After a corrupting fault no other is drawn: the receiver must refuse it and end the connection.
    }

    private func emit(_ chunk: ByteBuffer, direction: Int) {
        if !delayed[direction].isEmpty {
            delayed[direction].append(chunk)
            return
        }
        write(chunk, direction: direction)
        if let h = held[direction], chunk.readableBytes > 0 {
            held[direction] = nil
            write(h, direction: direction)
        }
    }

    private func write(_ chunk: ByteBuffer, direction: Int) {
        guard !closing, chunk.readableBytes > 0 else { return }
        channels[1 - direction].writeAndFlush(chunk, promise: nil)
    }

    func closed() {
        guard !closing else { return }
        closing = true
        for c in channels { c.close(promise: nil) }
    }
}

/// Reads one side of a proxied connection and hands the bytes to the connection.
private final class Forwarder: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    let connection: Connection
    let direction: Int

    init(connection: Connection, direction: Int) {
        self.connection = connection
        self.direction = direction
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        connection.forward(unwrapInboundIn(data), direction: direction)
    }

    func channelInactive(context: ChannelHandlerContext) {
        connection.closed()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
