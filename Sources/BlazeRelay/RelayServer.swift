import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeSync
import Logging
import NIOCore
import NIOPosix
import Synchronization

/// A relay: it accepts devices over the peer protocol (Protocol/SYNC.md §8) for every space it serves, stores the
/// sealed entries and membership operations they send, and serves them to the space's other devices — at once to
/// those connected, later to the others. It holds each space's capability, never a key that opens an entry.
public final class RelayServer: Sendable {
    /// Where the relay keeps what it serves.
    public let store: RelayStore
    let identity: DeviceIdentity
    let group: any EventLoopGroup
    let pool: NIOThreadPool
    let logger: Logger
    /// How long a device may stay silent before its connection is closed (a quiet one is pinged a third of that).
    let timeout: TimeAmount
    /// Every open connection by space (hex), to tell each about what another one stored.
    private let listeners = Mutex<[String: [Int: @Sendable (EntryBatch?) -> Void]]>([:])
    private let listenerCounter = Atomic<Int>(0)
    /// Each space's resolved membership log, rebuilt when it grows.
    private let memberships = Mutex<[String: MembershipState]>([:])
    private let channel = Mutex<(any Channel)?>(nil)
    /// Counters for operators (`RelayServer.counters`).
    let stats = Mutex<RelayCounters>(RelayCounters())
    /// The capabilities of the spaces served, read once and after each `add`, so a handshake reads no file.
    private let served: Mutex<[SpaceKey]>

    /// Admits connections within the listener limits.
    let gate: ConnectionGate

    /// The defaults of a relay's listener limits: far more devices than one daemon's peers.
    public static var defaultLimits: SyncListenerLimits {
        var limits = SyncListenerLimits()
        limits.maxConnections = 10_000
        limits.maxHandshakes = 512
        limits.maxConnectionsPerAddress = 64
        limits.handshakeTimeoutMs = 10_000
        return limits
    }

    /// A relay over `store`, proving `identity` to devices, admitting connections within `limits`.
    public init(
        store: RelayStore, identity: DeviceIdentity, group: any EventLoopGroup, pool: NIOThreadPool, logger: Logger,
        timeout: TimeAmount = .seconds(30), limits: SyncListenerLimits = RelayServer.defaultLimits
    ) {
        self.gate = ConnectionGate(limits: limits)
        self.store = store
        self.identity = identity
        self.group = group
        self.pool = pool
        self.logger = logger
        self.timeout = timeout
        self.served = Mutex((try? store.spaces()) ?? [])
    }

    /// Serves `capability`'s space from now on (`RelayStore.add`); false when it was served already.
    @discardableResult
    public func add(_ capability: RelayCapability) throws -> Bool {
        let added = try store.add(capability)
        let keys = try store.spaces()
        served.withLock { $0 = keys }
        return added
    }

    /// How many spaces are served.
    public var servedCount: Int { served.withLock { $0.count } }

    /// The handshake keys of every space served.
    func servedKeys() -> [SpaceKey] { served.withLock { $0 } }

    /// When the handshake keys were last re-read (`reloadServed`).
    private let lastReload = Mutex<ContinuousClock.Instant?>(nil)

    /// Re-reads the spaces served (another process — `blaze-relay add-space` — may have added one) and returns
    /// whether the list changed; at most once a second, so refused handshakes cannot make the relay read in a loop.
    func reloadServed() -> Bool {
        let now = ContinuousClock.now
        let due = lastReload.withLock { last in
            guard last.map({ now - $0 >= .seconds(1) }) ?? true else { return false }
            last = now
            return true
        }
        guard due, let keys = try? store.spaces() else { return false }
        return served.withLock { s in
            defer { s = keys }
            return s.count != keys.count
        }
    }

    /// Accepts devices on `host:port`; returns the bound port.
    public func listen(host: String, port: Int) async throws -> Int {
        let relay = self
        let ch = try await ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                // Limits hold before a byte is read: a flood of connections costs the relay no parsing.
                let address = channel.remoteAddress?.ipAddress ?? "?"
                guard relay.gate.admit(address: address) else {
                    relay.logger.debug("Relay refused a connection over its limits", metadata: ["address": "\(address)"])
                    return channel.close()
                }
                return channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandlers([
                        IdleStateHandler(readTimeout: relay.timeout, writeTimeout: .nanoseconds(relay.timeout.nanoseconds / 3)),
                        RelayConnection(relay: relay, address: address),
                    ])
                }
            }
            .bind(host: host, port: port).get()
        channel.withLock { $0 = ch }
        return ch.localAddress?.port ?? port
    }

    /// Stops accepting devices and closes the listener.
    public func shutdown() async {
        let ch = channel.withLock { c in
            defer { c = nil }
            return c
        }
        try? await ch?.close()
    }

    /// What the relay counted since start.
    public var counters: RelayCounters {
        var c = stats.withLock { $0 }
        c.refusedOverLimit = gate.refused.load(ordering: .relaxed)
        return c
    }

    // MARK: Spaces

    /// The resolved log of `space`, nil while it holds none.
    func membership(_ space: [UInt8]) throws -> MembershipState? {
        let id = hexString(space)
        if let m = memberships.withLock({ $0[id] }) { return m }
        let ops = try store.ops(space: space)
        guard !ops.isEmpty else { return nil }
        let m = MembershipState(space: space, ops: ops)
        memberships.withLock { $0[id] = m }
        return m
    }

    /// Stores the operations of `ops` that take part in `space`'s log: those whose author the log, with them, makes
    /// a member (as members do, SYNC.md §9: anyone holding the capability could send others, which could never take
    /// effect). Returns whether the log grew.
    func merge(_ ops: [MembershipOp], space: [UInt8]) throws -> Bool {
        let held = try store.ops(space: space)
        let resolved = MembershipState(space: space, ops: held + ops)
        let kept = ops.filter { resolved.member($0.author.nodeID) != nil }
        let fresh = try store.addOps(kept, space: space)
        guard !fresh.isEmpty else { return false }
        memberships.withLock { $0[hexString(space)] = nil }
        return true
    }

    /// Registers a connection of `space`; `notify` runs whenever another connection stored something, with the batch
    /// it stored (nil for membership operations).
    func listen(space: [UInt8], notify: @escaping @Sendable (EntryBatch?) -> Void) -> Int {
        let id = listenerCounter.add(1, ordering: .relaxed).newValue
        listeners.withLock { $0[hexString(space), default: [:]][id] = notify }
        return id
    }

    /// Forgets a closed connection.
    func unlisten(space: [UInt8], id: Int) {
        listeners.withLock { $0[hexString(space)]?[id] = nil }
    }

    /// Tells every connection of `space` but `except` that something new is stored (`batch`, when it is entries).
    func announce(space: [UInt8], except: Int?, batch: EntryBatch? = nil) {
        let all = listeners.withLock { ($0[hexString(space)] ?? [:]).filter { $0.key != except }.map(\.value) }
        for notify in all { notify(batch) }
    }
}

/// What a relay counted since start.
public struct RelayCounters: Sendable {
    /// Connections that passed the handshake.
    public var connections = 0
    /// Connections refused at the handshake (no served capability proven, or none in time).
    public var refused = 0
    /// Connections closed at once because a listener limit was reached.
    public var refusedOverLimit = 0
    /// Entries stored, and sent to devices.
    public var entriesStored = 0, entriesSent = 0
    /// Batches refused, by reason.
    public var rejected: [String: Int] = [:]
}
