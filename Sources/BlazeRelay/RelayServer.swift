import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeSettings
import BlazeWire
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOWebSocket
import Synchronization

/// A relay: it accepts devices over the peer protocol (Protocol/SYNC.md §8), carried by a WebSocket
/// (`WebSocketBytes`) so it runs behind HTTPS reverse proxies, for every space it serves; it stores the sealed entries
/// and membership operations they send and serves them to the space's other devices — at once to those connected,
/// later to the others. It holds each space's capability, never a key that opens an entry.
public final class RelayServer: Sendable {
    /// Where the relay keeps what it serves.
    public let store: any RelayBackend
    let identity: DeviceIdentity
    let group: any EventLoopGroup
    let logger: Logger
    /// How long a device may stay silent before its connection is closed (a quiet one is pinged a third of that).
    let timeout: TimeAmount
    /// How long one store operation of a connection may take before the connection is closed (`RelayConnection.run`).
    let storeTimeout: TimeAmount
    /// Every open connection by space (hex), to tell each about what another one stored.
    private let listeners = Mutex<[String: [Int: @Sendable (Announcement) -> Void]]>([:])
    private let listenerCounter = Atomic<Int>(0)
    /// Each space's membership log as this process holds it (`HeldLog`), and how many times one was forgotten: a
    /// log read or merged while one was forgotten is not kept (it may be older than what another process stored).
    let logs = Mutex<(held: [String: HeldLog], forgotten: UInt64)>(([:], 0))
    /// Numbers the held logs, so a merge replaces only the log it started from.
    let logVersions = Atomic<UInt64>(0)
    private let channel = Mutex<(any Channel)?>(nil)
    /// Counters for operators (`RelayServer.counters`).
    let stats = Mutex<RelayCounters>(RelayCounters())
    /// The same counts for Prometheus (`GET /metrics`).
    let metrics = RelayMetrics()
    /// The HTTP path devices open their WebSocket on.
    let syncPath = WebSocketBytes.defaultPath
    /// The capabilities of the spaces served, read at start and after each `add`, so a handshake reads nothing.
    private let served = Mutex<[SpaceKey]>([])
    /// This process, in the holder of every join its connections hold.
    let instance = String(UInt64.random(in: 0 ... .max), radix: 16)
    /// The task following other relay processes' changes (`RelayBackend.watch`).
    private let watcher = Mutex<Task<Void, Never>?>(nil)

    /// Admits connections within the listener limits.
    let gate: ConnectionGate
    /// Where the relay's tasks run: its event loops.
    let executor: EventLoopTaskExecutor
    /// New connections per second per source address.
    let handshakeRate: HandshakeRate
    /// Addresses listed devices proved their keys from (the handshake places reserved for them).
    let knownAddresses = KnownAddresses()
    /// The reserved connection places each listed device holds.
    let listedPlaces = DevicePlaces()
    /// Proxies whose connections count for the client they forward (`forwardedClient`).
    let trustedProxies: [AddressRange]
    /// Bounds on snapshot uploads, and the store room their manifests declared, reserved while they are staged: within
    /// `stagedBytes` across connections and `maxBytes` per space (so the members of one space cannot take it all).
    let snapshotUploads: SnapshotUploadLimits
    let snapshotStaging: MemoryBudget
    /// Bytes of blob chunks the relay's connections have asked devices for and not yet stored: the most that uploads
    /// hold in memory at once, whatever the number of connections (`RelayConnection+Chunks`).
    /// One space's connections together hold at most `maxChunksInFlightPerSpace` of it.
    let chunkUploads = MemoryBudget(
        limit: RelayServer.chunkUploadBytes, perKey: RelayServer.maxChunksInFlightPerSpace * PeerMessage.maxSealedChunkBytes)
    /// Bytes of blob chunks being read and sent to devices (one per connection at a time): the most that serving them
    /// holds in memory at once.
    let chunkServing = MemoryBudget(limit: RelayServer.chunkUploadBytes)
    /// The size of `chunkUploads` and `chunkServing`: 64 chunks of the largest size each.
    public static let chunkUploadBytes = 64 * PeerMessage.maxSealedChunkBytes
    /// The most chunks one space's uploads have room for at once.
    public static let maxChunksInFlightPerSpace = 16

    /// Connection handlers alive (made and not yet freed): back to what it was once connections end, or they leak.
    let connectionHandlers = Atomic<Int>(0)

    /// Tests only (`@testable`): rewrites every batch as it is about to be sent, to play a relay that tampers with,
    /// drops, reorders, replays or withholds entries. Nil (always, outside tests) sends batches as stored.
    let tamper = Mutex<(@Sendable (EntryBatch) -> [EntryBatch])?>(nil)

    /// The defaults of a relay's listener limits (`RelaySettings`): far more devices than one daemon's peers.
    public static var defaultLimits: SyncListenerLimits {
        var limits = SyncListenerLimits()
        limits.maxConnections = RelaySettings.maxConnections.defaultValue
        limits.maxHandshakes = RelaySettings.maxHandshakes.defaultValue
        limits.maxConnectionsPerAddress = RelaySettings.maxConnectionsPerAddress.defaultValue
        limits.handshakeTimeoutMs = RelaySettings.handshakeTimeout.defaultValue
        reserveDefaultShares(&limits)
        return limits
    }

    /// Sets the reserved places of `limits` to their default shares of the maxima: a quarter of the handshakes, a fifth
    /// of the connections (`reserved-handshakes` and `reserved-connections` left unset).
    public static func reserveDefaultShares(_ limits: inout SyncListenerLimits) {
        limits.reservedHandshakes = limits.maxHandshakes / 4
        limits.reservedConnections = limits.maxConnections / 5
    }

    /// The default of new connections per second per source address (bursts of twice that).
    public static let defaultHandshakeRate = RelaySettings.handshakeRate.defaultValue

    /// A relay over `store`, proving `identity` to devices, admitting connections within `limits` and at most
    /// `handshakesPerSecondPerAddress` new ones per second from one address (0: no such limit), closing a connection whose
    /// store operation takes longer than `storeTimeout`; connections from `trustedProxies` count for the client they
    /// forward; snapshot uploads are held to `snapshotUploads`.
    public init(
        store: any RelayBackend, identity: DeviceIdentity, group: any EventLoopGroup, logger: Logger,
        timeout: TimeAmount = .seconds(30), limits: SyncListenerLimits = RelayServer.defaultLimits,
        handshakesPerSecondPerAddress: Int = RelayServer.defaultHandshakeRate, storeTimeout: TimeAmount = .seconds(30),
        trustedProxies: [AddressRange] = [], snapshotUploads: SnapshotUploadLimits = SnapshotUploadLimits()
    ) {
        self.snapshotUploads = snapshotUploads
        snapshotStaging = MemoryBudget(limit: snapshotUploads.stagedBytes, perKey: snapshotUploads.maxBytes)
        self.trustedProxies = trustedProxies
        self.storeTimeout = storeTimeout
        self.gate = ConnectionGate(limits: limits)
        self.handshakeRate = HandshakeRate(perSecond: handshakesPerSecondPerAddress)
        self.executor = EventLoopTaskExecutor(group: group)
        self.store = store
        self.identity = identity
        self.group = group
        self.logger = logger
        self.timeout = timeout
    }

    /// Serves `capability`'s space from now on (`RelayBackend.add`); false when it was served already.
    @discardableResult
    public func add(_ capability: RelayCapability) async throws -> Bool {
        let added = try await store.add(capability)
        let keys = try await store.spaces()
        served.withLock { $0 = keys }
        return added
    }

    /// How many spaces are served.
    public var servedCount: Int { served.withLock { $0.count } }

    /// The handshake keys of every space served.
    func servedKeys() -> [SpaceKey] { served.withLock { $0 } }

    /// When the handshake keys were last re-read for a handshake, and the re-read under way (`rereadForHandshake`).
    private let lastReload = Mutex<(began: ContinuousClock.Instant?, running: Task<Void, Never>?)>((nil, nil))

    /// The re-read a handshake naming no space held should wait for (another process — `blaze-relay add-space` — may
    /// have added one): the one under way, else a new one unless the last began less than a second ago (so refused
    /// handshakes cannot make the relay read in a loop); nil when the proof is to be refused now.
    func rereadForHandshake() -> Task<Void, Never>? {
        let now = ContinuousClock.now
        let relay = self
        return lastReload.withLock { state -> Task<Void, Never>? in
            if let running = state.running { return running }
            guard state.began.map({ now - $0 >= .seconds(1) }) ?? true else { return nil }
            state.began = now
            let task = Task(executorPreference: relay.executor) {
                await relay.rereadSpaces()
                relay.lastReload.withLock { $0.running = nil }
            }
            state.running = task
            return task
        }
    }

    /// Re-reads the spaces served.
    func rereadSpaces() async {
        do {
            let keys = try await store.spaces()
            served.withLock { $0 = keys }
        } catch {
            logger.warning("Relay could not re-read its spaces", metadata: ["error": "\(error)"])
        }
    }

    /// Accepts devices on `host:port` (HTTP/1.1: the WebSocket on `syncPath`, `/healthz`, `/metrics`), under TLS when
    /// `tls` is given; returns the bound port.
    public func listen(host: String, port: Int, tls: NIOSSLContext? = nil) async throws -> Int {
        let relay = self
        let keys = try await store.spaces()
        served.withLock { $0 = keys }
        // What uploads of a process that stopped mid-way staged (by age: other processes may share the store).
        _ = try await store.dropSnapshotUploads(startedBefore: Self.nowMs() - snapshotUploads.staleAfterMs)
        startWatching()
        let ch = try await ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                // Limits hold before a byte is read: a flood of connections costs the relay no parsing. A trusted
                // proxy's connection counts in the totals only until its request names the client (`configure`).
                let ip = channel.remoteAddress?.ipAddress ?? "?"
                let proxy = relay.trustedProxies.contains { $0.contains(ip) } ? ip : nil
                let address = proxy == nil ? SourceAddress.bucket(ip) : nil
                guard relay.admit(address: address) else { return channel.close() }
                return channel.eventLoop.makeCompletedFuture {
                    try relay.configure(channel, place: GatePlace(gate: relay.gate, address: address), proxy: proxy, tls: tls)
                }
            }
            .bind(host: host, port: port).get()
        channel.withLock { $0 = ch }
        return ch.localAddress?.port ?? port
    }

    /// The handlers of an accepted connection: TLS when configured, HTTP with the WebSocket upgrade on `syncPath`,
    /// then (once upgraded) the stream adapter, keepalive and silence, and the device's `RelayConnection`. A
    /// connection from the trusted `proxy` is counted for the client its upgrade request names, or closed when that
    /// client is over its limits.
    private func configure(_ channel: any Channel, place: GatePlace, proxy: String?, tls: NIOSSLContext?) throws {
        let relay = self
        let ops = channel.pipeline.syncOperations
        if let tls { try ops.addHandler(NIOSSLServerHandler(context: tls)) }
        let bound = NIOLoopBound(place, eventLoop: channel.eventLoop)
        let upgrader = NIOWebSocketServerUpgrader(
            maxFrameSize: WebSocketBytes.maxFrameSize,
            shouldUpgrade: { channel, head in
                let path = head.uri.split(separator: "?", maxSplits: 1).first.map(String.init) ?? head.uri
                guard path == relay.syncPath else { return channel.eventLoop.makeSucceededFuture(nil) }
                if let proxy, !relay.admit(forwarded: relay.forwardedClient(head.headers, proxy: proxy), place: bound.value) {
                    channel.close(promise: nil)
                    return channel.eventLoop.makeSucceededFuture(nil)
                }
                return channel.eventLoop.makeSucceededFuture(HTTPHeaders())
            },
            upgradePipelineHandler: { channel, _ in
                channel.eventLoop.makeCompletedFuture {
                    do {
                        try channel.pipeline.syncOperations.addHandlers([
                            WebSocketBytes(role: .server),
                            IdleStateHandler(
                                readTimeout: relay.timeout, writeTimeout: .nanoseconds(relay.timeout.nanoseconds / 3)),
                        ] + RelayConnection.handlers(relay: relay, place: bound.value))
                    } catch {
                        bound.value.release()
                        throw error
                    }
                }
            })
        try ops.configureHTTPServerPipeline(
            withServerUpgrade: (
                upgraders: [upgrader],
                completionHandler: { context in
                    guard let front = try? context.pipeline.syncOperations.handler(type: RelayHTTPFront.self) else { return }
                    front.handedOver = true
                    context.pipeline.syncOperations.removeHandler(front, promise: nil)
                }
            ))
        try ops.addHandler(RelayHTTPFront(relay: relay, place: place))
    }

    /// Follows the changes other relay processes make to a shared store: their devices' entries and operations reach
    /// this process's devices as its own do.
    private func startWatching() {
        let relay = self
        let task = Task(executorPreference: executor) {
            await relay.store.watch { change in
                switch change {
                case .entries(let space):
                    relay.announce(space: space, except: nil, .entries)
                case .ops(let space):
                    relay.forgetLog(space)
                    relay.announce(space: space, except: nil, .members)
                    Task(executorPreference: relay.executor) { await relay.joinsChanged(space: space) }
                case .acks(let space):
                    relay.announce(space: space, except: nil, .acksChanged)
                case .formats(let space):
                    relay.announce(space: space, except: nil, .formatsChanged)
                case .joins(let space):
                    Task(executorPreference: relay.executor) { await relay.joinsChanged(space: space) }
                case .spaces:
                    Task(executorPreference: relay.executor) { await relay.rereadSpaces() }
                case .expired(let space):
                    relay.dropped(space: space)
                case .resync:
                    relay.logs.withLock { $0 = ([:], $0.forgotten + 1) }
                    Task(executorPreference: relay.executor) { await relay.rereadSpaces() }
                    for space in relay.listeners.withLock({ Array($0.keys) }) {
                        guard let id = SpaceID(hex: space) else { continue }
                        relay.announce(space: id, except: nil, .members)
                        relay.announce(space: id, except: nil, .acksChanged)
                        relay.announce(space: id, except: nil, .formatsChanged)
                        Task(executorPreference: relay.executor) { await relay.joinsChanged(space: id) }
                    }
                }
            }
        }
        watcher.withLock { $0 = task }
    }

    /// Drops the data of spaces idle for longer than `retention`, checking every hour (or every `retention`, if
    /// shorter), from now until shutdown.
    public func keep(for retention: Duration) {
        let relay = self
        let every = min(retention, .seconds(3600))
        let task = Task(executorPreference: executor) {
            while !Task.isCancelled {
                try? await Task.sleep(for: every)
                if Task.isCancelled { return }
                await relay.expireIdle(olderThan: retention)
            }
        }
        retainer.withLock { $0 = task }
    }

    /// Drops the data of every space not written to for `age`; returns how many spaces were dropped.
    @discardableResult
    public func expireIdle(olderThan age: Duration) async -> Int {
        let cutoff = Int64(Date().timeIntervalSince1970 * 1000) - Int64(age.components.seconds * 1000)
        do {
            let spaces = try await store.expire(idleBefore: cutoff)
            for space in spaces {
                logger.info("Relay dropped an idle space's data (retention)", metadata: ["space": "\(space.hex)"])
                dropped(space: space)
            }
            return spaces.count
        } catch {
            logger.error("Relay retention failed", metadata: ["error": "\(error)"])
            return 0
        }
    }

    /// A space's data was dropped: its resolved log is forgotten and its devices reconnect, handing back what they hold.
    func dropped(space: SpaceID) {
        forgetLog(space)
        announce(space: space, except: nil, .expired)
    }

    /// The retention task (`keep(for:)`).
    private let retainer = Mutex<Task<Void, Never>?>(nil)
    /// The chunk lease task (`leaseChunks(for:)`).
    let leaser = Mutex<Task<Void, Never>?>(nil)

    /// Stops accepting devices and closes the listener.
    public func shutdown() async {
        watcher.withLock { $0 }?.cancel()
        retainer.withLock { $0 }?.cancel()
        leaser.withLock { $0 }?.cancel()
        let ch = channel.withLock { c in
            defer { c = nil }
            return c
        }
        try? await ch?.close()
    }

    // MARK: Spaces

    /// What a connection is told another one (of this process or another) stored in its space.
    enum Announcement: Sendable {
        /// The space's joins as held now, and its log: admins get those they were not sent, a joiner its refusal.
        case joins([HeldJoin], MembershipState?)
        /// This batch, just stored by a connection of this process.
        case batch(EntryBatch)
        /// Entries, stored by another process.
        case entries
        /// Membership operations.
        case members
        /// These acknowledgements, just kept by a connection of this process.
        case acks([Acknowledgement])
        /// Acknowledgements, kept by another process.
        case acksChanged
        /// These statements of entry formats, just kept by a connection of this process.
        case formats([FormatStatement])
        /// Statements of entry formats, kept by another process.
        case formatsChanged
        /// The space's data was dropped for retention: the device reconnects and hands back what it holds.
        case expired
    }

    /// Registers a connection of `space`; `notify` runs whenever another connection stored something.
    func listen(space: SpaceID, notify: @escaping @Sendable (Announcement) -> Void) -> Int {
        let id = listenerCounter.add(1, ordering: .relaxed).newValue
        listeners.withLock { $0[space.hex, default: [:]][id] = notify }
        return id
    }

    /// Forgets a closed connection.
    func unlisten(space: SpaceID, id: Int) {
        listeners.withLock { $0[space.hex]?[id] = nil }
    }

    /// Whether any connection of `space` is open in this process.
    func isListened(space: SpaceID) -> Bool { listeners.withLock { !($0[space.hex] ?? [:]).isEmpty } }

    /// Tells every connection of `space` but `except` that something new is stored.
    func announce(space: SpaceID, except: Int?, _ what: Announcement) {
        let all = listeners.withLock { ($0[space.hex] ?? [:]).filter { $0.key != except }.map(\.value) }
        for notify in all { notify(what) }
    }
}

