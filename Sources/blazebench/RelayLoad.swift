import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeSync
import BlazeTestSupport
import BlazeWire
import Foundation
import NIOCore
import NIOPosix
import Synchronization

/// RELAY load: many simulated devices in many spaces on one `blaze-relay` process (loopback), each writing its own
/// entries and receiving every other device's of its space through the relay's fan-out. Reports the entries stored
/// and forwarded per second and the relay's resident memory per connection, on SQLite and on PostgreSQL.
///
/// A simulated device is one WebSocket connection running the real handshake and session cipher, with entries and a
/// membership log built beforehand (the space's first device is its admin and brings the log), so the relay's side is
/// exactly what real daemons would make it do, without running a thousand daemons.
enum RelayLoad {
    struct Space {
        let key: SpaceKey
        let ops: [MembershipOp]
        /// Per device: identity and its batches, in order.
        let devices: [(identity: DeviceIdentity, batches: [EntryBatch])]
    }

    static func run(devices: Int, spaces: Int, entriesPerDevice: Int, backend: String) async throws -> [Result] {
        let perSpace = max(2, devices / spaces)
        let built = try (0..<spaces).map { _ in try makeSpace(devices: perSpace, entries: entriesPerDevice) }
        let total = built.count * perSpace
        var postgres: PostgresServer?
        if backend == "postgres" { postgres = try PostgresServer() }
        let dir = NSTemporaryDirectory() + "blazebench-relayload-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let relay = try RelayChild(dataDir: dir, postgres: postgres?.url, connections: total + 100)
        defer { relay.stop() }
        try relay.addSpaces(built.map { RelayCapability(key: $0.key).text })
        let rssBefore = relay.rssKiB()

        let group = MultiThreadedEventLoopGroup.singleton
        let expected = (perSpace - 1) * entriesPerDevice
        let progress = LoadProgress(devices: total)
        var handlers: [LoadDevice] = []
        var channels: [any Channel] = []
        let port = relay.port
        let connect = try await seconds {
            for space in built {
                for (i, device) in space.devices.enumerated() {
                    let handler = LoadDevice(
                        key: space.key, identity: device.identity, ops: i == 0 ? space.ops : nil, batches: device.batches,
                        expected: expected, progress: progress)
                    handlers.append(handler)
                    let ch = try await ClientBootstrap(group: group)
                        .channelInitializer { channel in
                            channel.eventLoop.makeCompletedFuture {
                                try WebSocketClient.configure(
                                    channel, host: "127.0.0.1", port: port, path: WebSocketBytes.defaultPath,
                                    refused: { _ in progress.fail() },
                                    upgraded: { channel in try channel.pipeline.syncOperations.addHandlers(handler.handlers()) })
                            }
                        }
                        .connect(host: "127.0.0.1", port: port).get()
                    channels.append(ch)
                }
            }
            try progress.wait(until: { $0.established == total || $0.failed > 0 }, what: "handshakes")
        }
        defer { for ch in channels { ch.close(promise: nil) } }
        let rssConnected = relay.rssKiB()
        let start = ContinuousClock.now
        for (h, ch) in zip(handlers, channels) { ch.eventLoop.execute { h.go() } }
        try progress.wait(until: { $0.done == total || $0.failed > 0 }, what: "fan-out", timeout: .seconds(600))
        let elapsed = (ContinuousClock.now - start) / .seconds(1)
        let stored = Double(total * entriesPerDevice)
        let forwarded = Double(total * expected)
        let perConnection = Double(rssConnected - rssBefore) / Double(total)
        let tag = "RELAY.load.\(backend)"
        let note = String(
            format: "%d devices in %d spaces, %d entries each: %.0f entries stored/s, %.0f forwarded/s (%.2f s); %d connections in %.2f s; relay RSS %.0f MiB connected (+%.1f KiB per connection)",
            total, built.count, entriesPerDevice, stored / elapsed, forwarded / elapsed, elapsed, total, connect,
            Double(rssConnected) / 1024, perConnection)
        return [
            Result(name: tag + ".stored", unit: "entries/s", samples: [stored / elapsed], better: "higher", note: note),
            Result(name: tag + ".forwarded", unit: "entries/s", samples: [forwarded / elapsed], better: "higher"),
            Result(name: tag + ".rssPerConnection", unit: "KiB", samples: [perConnection], better: "lower"),
        ]
    }

    /// A space whose first device created the log and added the others as writers; each device's entries sealed and
    /// signed in batches of at most 50.
    static func makeSpace(devices: Int, entries: Int) throws -> Space {
        let identities = (0..<devices).map { _ in DeviceIdentity() }
        let log = try AbuseWorkloads.makeLog(admin: identities[0], members: identities.dropFirst().map { ($0, .writer) })
        let (ops, key) = (log.ops, log.key)
        let payload = [UInt8](repeating: 0x7B, count: 200)
        let built = identities.map { identity -> (DeviceIdentity, [EntryBatch]) in
            var batches: [EntryBatch] = []
            var prev = SealedEntry.genesis
            var seq: UInt64 = 1
            while seq <= UInt64(entries) {
                var run: [SealedEntry] = []
                while run.count < 50, seq <= UInt64(entries) {
                    let e = SealedEntry.seal(payload, space: key, origin: identity.nodeID, seq: seq, prev: prev)
                    run.append(e)
                    prev = e.hash
                    seq += 1
                }
                batches.append(
                    EntryBatch(origin: NodeID(bytes: identity.nodeID), entries: run, head: SignedHead(signing: run.last!, identity: identity)))
            }
            return (identity, batches)
        }
        return Space(key: key, ops: ops, devices: built)
    }
}

/// Counts, across every simulated device, handshakes done, devices that received all they expected, and failures.
final class LoadProgress: Sendable {
    struct Counts {
        var established = 0, done = 0, failed = 0
    }
    private let counts = Mutex(Counts())
    let devices: Int

    init(devices: Int) { self.devices = devices }

    func established() { counts.withLock { $0.established += 1 } }
    func finished() { counts.withLock { $0.done += 1 } }
    func fail() { counts.withLock { $0.failed += 1 } }

    /// Waits (polling, bounded by `timeout`) until `condition` holds; throws on failure or timeout.
    func wait(until condition: (Counts) -> Bool, what: String, timeout: Duration = .seconds(120)) throws {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            let c = counts.withLock { $0 }
            if c.failed > 0 { throw BenchFailure("RELAY load: \(c.failed) devices failed during \(what)") }
            if condition(c) { return }
            usleep(2_000)
        }
        throw BenchFailure("RELAY load: \(what) did not finish within \(timeout): \(counts.withLock { $0 })")
    }
}

/// One simulated device on its WebSocket: the handshake's client side (`HandshakeHandler`, as a daemon's links run it),
/// then, on `go`, its log operations if it is the admin, its state and its batches through the same sealed-frame
/// handlers; it counts the entries of others the relay forwards to it.
final class LoadDevice: ChannelInboundHandler, DialingDevice, @unchecked Sendable {
    // @unchecked Sendable: every member is touched on the channel's event loop only (`go` is sent there).
    typealias InboundIn = PeerMessage
    typealias OutboundOut = [UInt8]

    let key: SpaceKey
    let identity: DeviceIdentity
    private var established = false
    private var context: ChannelHandlerContext?
    private let ops: [MembershipOp]?
    private let batches: [EntryBatch]
    private let expected: Int
    private let progress: LoadProgress
    private var received = 0
    private var sent = false
    private var membersSeen = false
    private var started = false
    private var finished = false

    init(key: SpaceKey, identity: DeviceIdentity, ops: [MembershipOp]?, batches: [EntryBatch], expected: Int, progress: LoadProgress) {
        self.key = key
        self.identity = identity
        self.ops = ops
        self.batches = batches
        self.expected = expected
        self.progress = progress
    }

    /// The handlers of its connection once the WebSocket is up: the handshake, then this device.
    func handlers() -> [any ChannelHandler] {
        [HandshakeHandler(client: key, identity: identity, timeout: .seconds(60), delegate: self), self]
    }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func channelInactive(context: ChannelHandlerContext) {
        // The relay closed a connection it should have served to the end.
        if !finished { progress.fail() }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        progress.fail()
        context.close(promise: nil)
    }

    // MARK: Handshake

    func started(_ link: EstablishedLink, context: ChannelHandlerContext) {
        established = true
        progress.established()
        if started { go() }
    }

    func failed(_ failure: HandshakeFailure, context: ChannelHandlerContext) { progress.fail() }

    // MARK: Session

    /// Starts writing: the admin sends the log and its entries at once, the others once the log reached them.
    func go() {
        started = true
        guard let context, established else { return }
        if let ops { send(.members(ops), context: context) }
        send(.state(vector: [:], ownHead: nil), context: context)
        if ops != nil || membersSeen { sendEntries(context: context) }
    }

    private func sendEntries(context: ChannelHandlerContext) {
        guard !sent else { return }
        sent = true
        for batch in batches { send(.entries(batch), context: context) }
        checkDone()
    }

    private func send(_ message: PeerMessage, context: ChannelHandlerContext) {
        guard let bytes = try? message.encoded() else { return }
        context.writeAndFlush(wrapOutboundOut(bytes), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .entries(let batch):
            received += batch.entries.count
            checkDone()
        case .members(let ops) where !ops.isEmpty:
            membersSeen = true
            if started { sendEntries(context: context) }
        case .error:
            // The relay refused this device's data.
            progress.fail()
            context.close(promise: nil)
        default:
            break
        }
    }

    private func checkDone() {
        guard !finished, sent, received >= expected else { return }
        finished = true
        progress.finished()
    }
}

/// A `blaze-relay serve` process next to this executable, on loopback, with limits for a load test.
final class RelayChild {
    let process = Process()
    let port: Int
    let dataDir: String
    let postgres: String?

    /// Starts the relay; with `connections`, its limits let that many devices connect from loopback at once,
    /// else it keeps its defaults. `arguments` are added to `serve`'s.
    init(dataDir: String, postgres: String?, connections: Int? = nil, arguments: [String] = []) throws {
        self.dataDir = dataDir
        self.postgres = postgres
        let binary = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("blaze-relay")
        process.executableURL = binary
        let limits =
            connections.map { connections in
                [
                    "--max-connections", "\(connections)", "--max-handshakes", "\(connections)",
                    "--max-connections-per-address", "\(connections)", "--handshake-rate", "0",
                    // Every simulated device is on loopback: nothing is reserved for members.
                    "--reserved-handshakes", "0", "--reserved-connections", "0",
                ]
            } ?? []
        process.arguments =
            ["serve", "--data-dir", dataDir, "--listen", "127.0.0.1:0", "--log-level", "error"] + limits + arguments
            + (postgres.map { ["--postgres", $0] } ?? [])
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        // The first line names the URL (and the port picked).
        var line = Data()
        while !line.contains(UInt8(ascii: "\n")) {
            let chunk = out.fileHandleForReading.availableData
            guard !chunk.isEmpty else { throw BenchFailure("blaze-relay did not start") }
            line += chunk
        }
        guard let text = String(data: line, encoding: .utf8)?.split(separator: "\n").first,
            let url = PeerAddress(String(text.dropFirst("listening ".count)))
        else { throw BenchFailure("blaze-relay printed no URL") }
        port = url.port
    }

    /// Serves every capability given (`add-space -`, one per line).
    func addSpaces(_ capabilities: [String]) throws {
        let p = Process()
        p.executableURL = process.executableURL
        p.arguments = ["add-space", "--data-dir", dataDir] + (postgres.map { ["--postgres", $0] } ?? []) + ["-"]
        let input = Pipe()
        p.standardInput = input
        p.standardOutput = FileHandle.nullDevice
        try p.run()
        input.fileHandleForWriting.write(Data(capabilities.joined(separator: "\n").utf8 + [10]))
        try input.fileHandleForWriting.close()
        p.waitUntilExit()
        guard p.terminationStatus == 0 else { throw BenchFailure("blaze-relay add-space failed") }
    }

    /// The value of the unlabelled metric `name` on the relay's `GET /metrics`; nil when it cannot be read.
    func metric(_ name: String) -> Double? {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        let request = Array("GET /metrics HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n".utf8)
        guard connected == 0, request.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == request.count
        else { return nil }
        var page: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while page.count < 1 << 22 {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { break }
            page += buffer[..<n]
        }
        let line = String(decoding: page, as: UTF8.self).split(separator: "\n").first { $0.hasPrefix(name + " ") }
        return line.flatMap { Double($0.split(separator: " ").last ?? "") }
    }

    /// The relay's resident memory (VmRSS), KiB.
    func rssKiB() -> Int {
        guard let status = try? String(contentsOfFile: "/proc/\(process.processIdentifier)/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") })
        else { return 0 }
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0
    }

    func stop() {
        guard process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
    }
}

/// A benchmark that could not run to the end.
struct BenchFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
