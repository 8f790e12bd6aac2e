import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeWire
import Foundation
import Logging
import NIOCore
import NIOPosix
import Synchronization

/// Runs sync for every shared database of a store: accepts peers on the sync port, keeps a reconnecting link to every
/// configured peer, and keeps the counters `sync.status` reports.
public final class SyncEngine: Sendable {
    let store: Store
    let identity: DeviceIdentity
    /// Where space keys live (one 0600 file per space).
    public let keysDirectory: String
    let group: any EventLoopGroup
    let pool: NIOThreadPool
    let logger: Logger
    /// How long an established peer may stay silent before its connection is closed.
    public let timeout: TimeAmount
    /// Most milliseconds an outbound link waits between attempts (`OutboundLink`).
    public let retryMaxMs: Int
    let status = StatusBook()
    /// Inbound connections refused because the peer proved no key served here (or none in time).
    let strangersRefused = Atomic<Int>(0)
    let links = Mutex<[LinkKey: OutboundLink]>([:])
    /// The running folder links, by database and folder path.
    let folderLinks = Mutex<[LinkKey: FolderLink]>([:])
    /// How folder links read and write.
    public let folderOptions: FolderOptions
    let paused = Mutex<Set<String>>([])
    /// Every shared database by name, with its space: what inbound handshakes are checked against, kept in memory so
    /// that accepting a peer lists no directory and opens no database on the event loop.
    let served = Mutex<[String: SharedSpace]>([:])
    /// Every established session, so that a membership change reaches each connection of its database.
    let sessions = Mutex<[Int: SessionHandle]>([:])
    let sessionCounter = Atomic<Int>(0)
    /// Invites refused since start, by reason (`InviteRefusal`).
    let invitesRefused = Mutex<[String: Int]>([:])
    /// Every database's chunk store, shared with the blob methods.
    public let chunkStores: ChunkStores
    /// Fetches the blob chunks databases lack from their sessions.
    let chunks: ChunkFetcher
    /// Where chunks are read, sealed, opened and stored for sessions (the daemon's transfer pool).
    let chunkPool: NIOThreadPool
    /// Where received batches are opened and verified: never behind them in a queue, a batch ready to store starts at
    /// once (a session queues up to `BatchReceiver.maxInbox` verifications whenever reading resumes).
    let verifyPool: NIOThreadPool
    /// Snapshots built for peers, reused for a minute per database.
    let snapshots = SnapshotCache()
    /// Held while this device computes and records a `grant` of keys: two computed at once would seal a key twice.
    let grantLock = Mutex(())
    /// Memory the snapshot pieces sessions are opening and staging may take together (a staged piece is on disk).
    let snapshotBudget = MemoryBudget(limit: BatchReceiver.maxSnapshotBytesInFlight)
    /// Disk the snapshots sessions are staging may take together (their declared sizes), and per database.
    let stagingBudget = MemoryBudget(limit: BatchReceiver.maxStagedBytes, perKey: BatchReceiver.maxSnapshotBytes)
    /// Relays (by address) that closed a link on `JOIN_REFUSED` as a message they do not know (an older version):
    /// they are not sent it again while this process runs, so the joins they hold do not close the link each time.
    let withoutJoinRefusal = Mutex<Set<String>>([])
    /// Devices (node id hex) that closed a session on `CHUNK_WANT` as a message they do not know (an older version):
    /// they are not asked for chunks again while this process runs.
    let withoutChunks = Mutex<Set<String>>([])
    /// Relays (device node ids) of an older version that refused a `CHUNK_KEEP`: they are sent none again.
    let withoutChunkKeep = Mutex<Set<String>>([])
    /// For each link (database, peer, device), how many sessions in a row ended to fetch again what they refused for a
    /// reason that may clear (`SyncSession.refetchLater`).
    let refetchBackoff = Mutex<[String: Int]>([:])
    /// Held while this device works out and issues a statement of entry formats (`issueFormatStatement(db:space:)`).
    let statementIssuing = Mutex<Void>(())
    /// Most links `refetchBackoff` remembers; past it the map starts over (only waits get shorter).
    static let maxRefetchLinks = 4_096
    private let listener = Mutex<(any Channel)?>(nil)
    /// The open inbound connections, so that `shutdown` closes them (closing the listener leaves them open); nil once
    /// shutting down, when a connection accepted meanwhile is closed at once.
    private let inbound = Mutex<[ObjectIdentifier: any Channel]?>([:])
    /// Set once `loadSpaces` ran.
    private let spacesLoaded = Atomic<Bool>(false)
    /// Admits inbound connections within the listener limits.
    let gate: ConnectionGate
    /// TLS for `wss://` links.
    let tls: TLSClient
    /// The timer that seals local changes in the background (`SyncEngine+Sealing`).
    let sealing = BackgroundSealing()

    struct LinkKey: Hashable {
        let db: String
        let address: String
    }

    /// Creates an engine; nothing runs until `listen` or `start`. `retryMaxMs` bounds the delay between attempts to
    /// reach a peer; `tlsTrustRoots` is a PEM file of certificates to trust for `wss://` relays besides the system's;
    /// `chunkPool` is where blob chunks are sealed, opened and stored for sessions, and `verifyPool` where received
    /// batches are opened and verified (nil: `pool`).
    public init(
        store: Store, identity: DeviceIdentity, keysDirectory: String, group: any EventLoopGroup, pool: NIOThreadPool,
        logger: Logger, timeout: TimeAmount = .seconds(30), retryMaxMs: Int = 5_000,
        listenerLimits: SyncListenerLimits = SyncListenerLimits(), tlsTrustRoots: String? = nil,
        folderOptions: FolderOptions = FolderOptions(), chunkPool: NIOThreadPool? = nil, verifyPool: NIOThreadPool? = nil
    ) {
        self.chunkStores = ChunkStores(isCurrent: { [store] in store.isCurrent($0) })
        self.chunks = ChunkFetcher(group: group, askTimeout: timeout)
        self.chunkPool = chunkPool ?? pool
        self.verifyPool = verifyPool ?? pool
        self.retryMaxMs = max(100, retryMaxMs)
        self.folderOptions = folderOptions
        self.tls = TLSClient(extraTrustRoots: tlsTrustRoots)
        self.timeout = timeout
        self.gate = ConnectionGate(limits: listenerLimits)
        self.store = store
        self.identity = identity
        self.keysDirectory = keysDirectory
        self.group = group
        self.pool = pool
        self.logger = logger
    }

    /// The address peers connect to (`host:port`), nil when not listening.
    public var listeningAddress: String? {
        listener.withLock { $0 }.flatMap { ch in ch.localAddress.map { "\($0.ipAddress ?? "?"):\($0.port ?? 0)" } }
    }

    /// Inbound connections refused since start because the peer proved no key served here (or none in time).
    public var strangersRefusedCount: Int { strangersRefused.load(ordering: .relaxed) }

    /// Inbound connections closed at once since start because a listener limit was reached.
    public var refusedOverLimitCount: Int { gate.refused.load(ordering: .relaxed) }

    /// Inbound connections now open, and how many of them have not finished their handshake.
    public var inboundConnections: (total: Int, handshaking: Int) {
        let c = gate.current
        return (c.total, c.handshaking)
    }

    /// How long a handshake may take.
    var handshakeTimeout: TimeAmount { .milliseconds(Int64(gate.limits.handshakeTimeoutMs)) }

    /// Accepts peers on `host:port`; returns the bound port (useful with port 0).
    public func listen(host: String, port: Int) async throws -> Int {
        let engine = self
        let channel = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.so_keepalive), value: 1)
            // Small frames (one live change) must leave at once: Nagle plus delayed ACKs would add 40 ms.
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                // Limits hold before anything else: a connection over them (or arriving while shutting down) is closed
                // before a byte is read.
                let address = SourceAddress.bucket(channel.remoteAddress?.ipAddress ?? "?")
                let key = ObjectIdentifier(channel)
                let open = engine.inbound.withLock { inbound in
                    inbound?[key] = channel
                    return inbound != nil
                }
                guard open, engine.gate.admit(address: address) else {
                    engine.inbound.withLock { _ = $0?.removeValue(forKey: key) }
                    channel.close(promise: nil)
                    return channel.eventLoop.makeSucceededVoidFuture()
                }
                channel.closeFuture.whenComplete { _ in _ = engine.inbound.withLock { $0?.removeValue(forKey: key) } }
                return channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandlers(SyncPipeline.inbound(engine: engine, address: address))
                }
            }
            .bind(host: host, port: port).get()
        listener.withLock { $0 = channel }
        logger.info("Sync listening", metadata: ["address": "\(host):\(channel.localAddress?.port ?? port)"])
        return channel.localAddress?.port ?? port
    }

    /// Loads every shared database's space (its membership log and keys) into memory, where inbound handshakes find
    /// them. Call it before `listen`: a peer that connects first would otherwise be refused as a stranger. A database
    /// whose space cannot be loaded (its key file unreadable, or missing after a join that never finished) is left
    /// unserved with a warning, and its RPCs say why; the others are served. Runs once; later calls do nothing.
    public func loadSpaces() {
        guard !spacesLoaded.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let names: [String]
        do { names = try store.list() } catch {
            logger.error("Cannot list the databases to serve", metadata: ["error": "\(error)"])
            return
        }
        for name in names {
            do {
                _ = try space(db: try store.database(name))
            } catch {
                logger.warning("Cannot load a shared database's space", metadata: ["db": "\(name)", "error": "\(error)"])
            }
        }
    }

    /// Loads the spaces if `loadSpaces` has not, starts links to the configured peers and folders, and the background
    /// sealing.
    public func start() {
        loadSpaces()
        for name in served.withLock({ $0.keys.sorted() }) { refreshLinks(db: name) }
        startSealing()
    }

    /// Stops accepting, closes every link and session (inbound ones too).
    public func shutdown() async {
        stopSealing()
        let all = links.withLock { l in
            defer { l = [:] }
            return Array(l.values)
        }
        for link in all { link.stop() }
        stopFolders(db: nil)
        // Reads and gets waiting for chunks end now instead of at their deadlines.
        chunks.endAll(StoreError(.unavailable, kind: "shutting_down", "the daemon is shutting down"))
        if let channel = listener.withLock({ $0 }) { try? await channel.close() }
        let open = inbound.withLock { inbound in
            defer { inbound = nil }
            return Array((inbound ?? [:]).values)
        }
        for channel in open { try? await channel.close() }
    }

    // MARK: Spaces

    /// The space of `db`, nil when the database is not shared; loaded from its log and keystore on first use.
    public func space(db: BlazeDatabase) throws -> SharedSpace? {
        if let cached = served.withLock({ $0[db.name] }), cached.db === db { return cached }
        guard let idHex = try db.spaceID() else { return nil }
        guard let id = SpaceID(hex: idHex) else {
            throw StoreError(.syncFailure, kind: "space_key_unusable", "database \(db.name) names a malformed space id \(idHex)")
        }
        let ops: [MembershipOp]
        let stored: SpaceKey?
        do {
            ops = try db.membershipOps().map { bytes throws(MembershipError) in try MembershipOp(bytes: bytes) }
            stored = try SpaceKey.load(directory: keysDirectory, idHex: idHex)
        } catch {
            throw StoreError(
                .syncFailure, kind: "space_key_unusable", "the key of space \(idHex) (database \(db.name)): \(error)")
        }
        guard !ops.isEmpty || stored != nil else {
            throw StoreError(
                .syncFailure, kind: "space_key_missing", "the key of space \(idHex) (database \(db.name)) is missing")
        }
        let loaded = SharedSpace(db: db, id: id, identity: identity, ops: ops, stored: stored, capability: nil)
        // Kept, so that every caller (inbound handshakes, links, sessions, RPCs) shares one space and its membership.
        // A space another caller stored first for the same database wins: it may already hold operations merged
        // since. A database dropped meanwhile (or made anew under its name) is not served again from a stale handle.
        return try served.withLock { served in
            if let first = served[db.name], first.db === db { return first }
            guard store.isCurrent(db) else {
                throw StoreError(.notFound, kind: "database_not_found", "database \(db.name) was dropped")
            }
            served[db.name] = loaded
            return loaded
        }
    }

    /// The current key of `db`'s space, nil when the database is not shared.
    public func spaceKey(db: BlazeDatabase) throws -> SpaceKey? {
        try space(db: db)?.key
    }

    /// Shares `db`: on first use creates its space with a membership log that makes this device its first admin
    /// (members then join with `invite`). Returns the space id, and for a space shared before membership its secret
    /// token, which still lets another device join it.
    public func share(db: BlazeDatabase) throws -> (space: String, token: String?) {
        try choosingSpace { try shareChosen(db: db) }
    }

    /// `share`, with blob keys not being chosen meanwhile.
    private func shareChosen(db: BlazeDatabase) throws -> (space: String, token: String?) {
        if let space = try space(db: db) {
            return (space.id.hex, space.snapshot.membership == nil ? space.snapshot.stored?.token : nil)
        }
        guard try !db.holdsChangesOfOtherDevices() else {
            throw StoreError(
                .syncFailure, kind: "restored_copy",
                "database \(db.name) holds changes made on other devices (it was restored from a backup of a shared "
                    + "database); only those devices can sign them, so it cannot start a new space: join the original "
                    + "space with db.join instead")
        }
        // The secret blobs were named under when some were put before sharing (`blobKeys(db:)`), else fresh ones.
        let (salt, genesis) = try spaceSecrets(db: db)
        let id = MembershipOp.spaceID(creator: identity.publicKeys, salt: salt)
        let create = try MembershipOp(
            space: id, author: identity, timeMs: nowMsUnsigned(), parents: [], action: .create(salt: salt),
            envelopes: [
                KeyEnvelope(sealing: genesis, space: id, epoch: 1, keyOp: KeyEnvelope.thisOp, to: identity.publicKeys)
            ], commitment: KeyEnvelope.commitment(secret: genesis, space: id, epoch: 1))
        try db.addMembershipOps([create])
        try db.setSpaceID(id.hex)
        let space = SharedSpace(db: db, id: id, identity: identity, ops: [create], stored: nil, capability: nil)
        served.withLock { $0[db.name] = space }
        PendingSpace.remove(directory: keysDirectory, db: db.name)
        return (id.hex, nil)
    }

    /// Shares `db` the way databases were shared before membership: a space whose secret token anyone holding it
    /// joins with, and no membership log. Returns the token. Such spaces keep working; new ones are made by `share`.
    /// Kept for the tests of legacy spaces.
    func shareWithSecret(db: BlazeDatabase) throws -> String {
        let key = SpaceKey.generate()
        try key.save(directory: keysDirectory)
        try db.setSpaceID(key.idHex)
        served.withLock { $0[db.name] = SharedSpace(db: db, id: key.id, identity: identity, ops: [], stored: key, capability: nil) }
        return key.token!
    }

    /// Joins the space of `token` as the new database `name` (default: `shared-` and the space id's first 8 hex
    /// digits); fails if a database here already syncs in that space.
    public func join(token: String, name: String?, timeout: TimeAmount = .seconds(20)) throws -> BlazeDatabase {
        if InviteToken.isInvite(token) {
            let invite: InviteToken
            do { invite = try InviteToken(text: token) } catch {
                throw StoreError(.invalidArgument, kind: "invalid_token", error.description)
            }
            return try join(invite: invite, name: name, timeout: timeout)
        }
        let key: SpaceKey
        do { key = try SpaceKey(token: token) } catch {
            throw StoreError(
                .invalidArgument, kind: "invalid_token",
                "\(error.description), or an invite (it must start with \(InviteToken.prefix))")
        }
        let name = name ?? "shared-" + key.idHex.prefix(8)
        if let existing = served.withLock({ $0.values.first { $0.id == key.id } }) {
            throw StoreError(
                .alreadyExists, kind: "already_joined", "database \(existing.db.name) already syncs in this space")
        }
        let db = try store.create(name)
        do {
            try key.save(directory: keysDirectory)
            try db.setSpaceID(key.idHex)
        } catch {
            try? store.drop(name)
            SpaceKey.remove(directory: keysDirectory, idHex: key.idHex)
            throw error
        }
        served.withLock { $0[name] = SharedSpace(db: db, id: key.id, identity: identity, ops: [], stored: key, capability: nil) }
        return db
    }

    /// Every shared, unpaused database's space (from memory: no I/O); a space this device is still joining takes no
    /// inbound peers.
    func servedSpaces() -> [SharedSpace] {
        let paused = self.paused.withLock { $0 }
        return served.withLock {
            $0.filter { !paused.contains($0.key) && $0.value.joining.withLock { $0 == nil } }.sorted { $0.key < $1.key }
                .map(\.value)
        }
    }

    /// Forgets a dropped database: stops its links, its counters and removes its key.
    public func forget(db name: String, spaceID: String?) {
        stopLinks(db: name)
        stopFolders(db: name)
        status.forget(db: name)
        served.withLock { $0[name] = nil }
        snapshots.forget(db: name)
        SyncSession.forgetReferred(path: store.path(name))
        if let spaceID {
            SpaceKey.remove(directory: keysDirectory, idHex: spaceID)
            if let space = SpaceID(hex: spaceID) { Self.forgetBlobKeys(space: space) }
        }
        forgetPendingSpace(db: name)
    }

    // MARK: Control

    /// Entries of `db` that received changes depend on and no peer has delivered, by origin.
    public func missing(db: BlazeDatabase) -> [MissingEntries] { status.missing(db: db.name) }

    /// Per-peer status of `db`.
    public func status(db: BlazeDatabase) -> [PeerStatus] {
        status.peers(db: db.name)
    }

    /// True when sync of `db` is paused.
    public func isPaused(db name: String) -> Bool { paused.withLock { $0.contains(name) } }

    /// Pauses sync of `db`: closes its links and refuses its inbound peers until `resume`.
    public func pause(db name: String) {
        paused.withLock { _ = $0.insert(name) }
        refreshLinks(db: name)
    }

    /// Resumes sync of `db`.
    public func resume(db name: String) {
        paused.withLock { _ = $0.remove(name) }
        refreshLinks(db: name)
    }

    /// Connects every link of `db` that is waiting to retry, now.
    public func syncNow(db name: String) {
        refreshLinks(db: name)
        for link in links.withLock({ $0.filter { $0.key.db == name }.map(\.value) }) { link.retryNow() }
        for link in folderLinks.withLock({ $0.filter { $0.key.db == name }.map(\.value) }) { link.wake() }
    }
}
