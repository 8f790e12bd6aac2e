import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeWire
import NIOCore

/// One device's connection to a relay: the peer handshake as its server side (the device proves a served space's
/// capability and its device key), then the peer protocol as a member would speak it, except that entries are stored
/// as they arrive, never opened (Protocol/RELAY.md).
///
/// Everything the device sends is checked before it is stored: frames open under the session cipher, messages decode
/// within their bounds, batches link to what is held and end at a head their origin signed, their origin is a
/// writing member of the space's log. A refusal is told to the device (`ERROR`) and closes the connection.
final class RelayConnection: ChannelInboundHandler {
    typealias InboundIn = PeerMessage
    typealias OutboundOut = [UInt8]

    enum State {
        /// The shared `HandshakeHandler` runs the handshake, asking this connection (its delegate) which space a
        /// proof is for and whether the device gets a place (`RelayConnection+Handshake`).
        case handshake
        /// The sealed-frame handlers carry the session: messages arrive here decoded.
        case established(space: SpaceID)
        case closed
    }

    let relay: RelayServer
    var state = State.handshake
    /// This handler's own context (the handshake's delegate calls come with the handshake handler's).
    var ownContext: ChannelHandlerContext?
    /// The space's log could not be read for the handshake (counted as a store failure, not a refusal).
    var storeFailed = false
    var listener: Int?
    /// What the device holds, as far as the relay knows.
    var peerVector: [NodeID: UInt64]?
    /// Operations the device holds (sent to it or received from it).
    var opsShared: Set<EntryHash> = []
    /// Operations the device sent on this connection that the log did not keep (`SetAsideOps`): it counts them as
    /// held here, so a later operation naming one takes it from here.
    var opsSetAside = SetAsideOps(maxOps: RelayConnection.setAsideOps, maxBytes: RelayConnection.setAsideBytes)
    /// Bounds of `opsSetAside` on a relay, which serves many more connections than a device.
    static let setAsideOps = 256, setAsideBytes = 1 << 20
    /// Per signer, the latest acknowledgement the device holds (sent to it or received from it): only signers the log
    /// lists, so it is bounded by the log.
    var acksShared: [[UInt8]: UInt64] = [:]
    /// Statements of entry formats the device holds, as far as this connection knows: node id → when issued.
    var formatsShared: [[UInt8]: UInt64] = [:]
    var pumping = false
    var pumpAgain = false
    /// Batches and membership operations received and not yet stored, in order: operations a device sends before
    /// its entries must count when those entries are checked.
    var inbox: [Received] = []

    enum Received {
        case batch(EntryBatch)
        case ops([MembershipOp])
        case acks([Acknowledgement])
        case formats([FormatStatement])
        /// The manifest that opens a snapshot the device uploads, then its pieces (`RelayConnection+Snapshots`).
        case snapshotManifest(SnapshotManifest)
        case snapshotPart(SnapshotPart)
        /// An admin's `JOIN_REFUSED`: after the operations sent before it, which may list the joiner.
        case joinRefused(invite: [UInt8], joiner: [UInt8], reason: InviteRefusal)
        /// A blob chunk the relay asked for, and an offer of chunks (`RelayConnection+Chunks`).
        case chunk(ChunkID, [UInt8])
        case offer([ChunkID])
        /// Chunks a member still needs kept (`CHUNK_KEEP`).
        case keep([ChunkID])
    }
    /// Blob chunks (`RelayConnection+Chunks`): whether an offer is being answered, the chunks its answer asked for and
    /// not yet received, those the device asked for and not yet served (and whether one is being served), and those
    /// served whose copies the device may report bad (with the first bytes of each copy), oldest first.
    var answeringOffer = false
    var chunksExpected: Set<ChunkID> = []
    var chunkWants: [ChunkID] = []
    var servingChunk = false
    var chunksServed: [ChunkID: [UInt8]] = [:]
    var servedOrder: [ChunkID] = []
    /// Chunks asked for whose room this connection holds in the relay's `chunkUploads` budget, and when the device
    /// must have sent them by.
    var chunkRoom = 0
    var uploadExpiry: Scheduled<Void>?
    /// The snapshot the device is uploading, from its accepted manifest to its last piece (nil: none under way, and a
    /// piece is refused), and the end of its window.
    var upload: SnapshotUpload?
    var uploadDeadline: Scheduled<Void>?
    /// Whether this connection sent the device the space's snapshot (once per connection).
    var snapshotSent = false
    var storing = false
    /// The device at the other end, once it passed the handshake.
    var device: DevicePublicKeys?
    /// The sync protocol version agreed with the device (SYNC.md §8, "Versions"); 0 before the handshake ends.
    var protocolVersion: UInt8 = 0
    /// Whether the relay's `CLOCK` went to the device (`startServing`).
    var clockSent = false
    /// What it may fetch (`RelayAccess`), as the space's log stands.
    var access = RelayAccess.outsider
    /// Whether this connection asked for a join of its device (one per connection; dropped when it closes), and
    /// the task storing it (the drop waits for it).
    var holdsJoin = false
    var holding: Task<Void, Never>?
    /// The joins passed to this device (invite id and joiner's key), so each goes once; bounded by the space's joins.
    var joinsSent: Set<[UInt8]> = []

    /// Entries and bytes per batch read for sending.
    static let batchEntries = 1000, batchBytes = 4 << 20
    /// Batches waiting to be stored before reading pauses.
    static let maxInbox = 4

    /// The connection's place in the relay's gate (released once, however the connection ends).
    let place: GatePlace

    init(relay: RelayServer, place: GatePlace) {
        self.relay = relay
        self.place = place
        relay.connectionHandlers.add(1, ordering: .relaxed)
    }

    deinit { relay.connectionHandlers.subtract(1, ordering: .relaxed) }

    /// The handlers of a device's connection once its WebSocket is up: the shared handshake (within what is left of
    /// the handshake deadline since the connection's admission: the upgrade counts), then the connection.
    static func handlers(relay: RelayServer, place: GatePlace) -> [any ChannelHandler] {
        let connection = RelayConnection(relay: relay, place: place)
        let left = place.remaining(of: .milliseconds(relay.gate.limits.handshakeTimeoutMs))
        return [HandshakeHandler(server: relay.identity, timeout: TimeAmount(left), delegate: connection), connection]
    }

    func handlerAdded(context: ChannelHandlerContext) { ownContext = context }

    /// Out of the pipeline (the channel closed, however it ended): nothing stays held, and the context it kept is let
    /// go (it refers back to this handler).
    func handlerRemoved(context: ChannelHandlerContext) {
        release()
        ownContext = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        close(context: context)
        context.fireChannelInactive()
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        switch event {
        case IdleStateHandler.IdleStateEvent.read:
            close(context: context)
        case IdleStateHandler.IdleStateEvent.write:
            if case .established = state { send(.ping, context: context) }
        default:
            context.fireUserInboundEventTriggered(event)
        }
    }

    /// A frame that does not open or a message that does not decode (the shared decoders' errors) is told to the
    /// device; anything else closes the connection.
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let rejection = error as? SyncRejection, case .established = state {
            refuse(rejection, context: context)
        } else {
            close(context: context)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .established(let space) = state else { return }
        do {
            try handle(unwrapInboundIn(data), space: space, context: context)
        } catch let rejection as SyncRejection {
            refuse(rejection, context: context)
        } catch {
            close(context: context)
        }
    }

    /// Seals and writes `message`; the future completes once it is written (nil when the connection is closed).
    @discardableResult
    func send(_ message: PeerMessage, context: ChannelHandlerContext) -> EventLoopFuture<Void>? {
        if case .entries(let batch) = message, let tamper = relay.tamper.withLock({ $0 }) {
            var last: EventLoopFuture<Void>?
            for altered in tamper(batch) { last = sendSealed(.entries(altered), context: context) }
            return last ?? context.eventLoop.makeSucceededVoidFuture()
        }
        return sendSealed(message, context: context)
    }

    /// Writes `message` for the sealed-frame encoder to seal.
    func sendSealed(_ message: PeerMessage, context: ChannelHandlerContext) -> EventLoopFuture<Void>? {
        guard case .established = state, let bytes = try? message.encoded() else { return nil }
        return context.writeAndFlush(wrapOutboundOut(bytes))
    }

    // MARK: Protocol

    /// The session starts: the device hears what the space's log lets it, and is sent what it may fetch.
    func startSession(space: SpaceID, context: ChannelHandlerContext) {
        relay.record(.established)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let loop = context.eventLoop
        listener = relay.listen(space: space) { what in
            loop.execute {
                let (connection, context) = bound.value
                guard case .established = connection.state else { return }
                switch what {
                case .batch(let batch):
                    connection.forward(batch, space: space, context: context)
                case .entries:
                    connection.pump(space: space, context: context)
                case .members:
                    // Pumps once the device's access is known again (it may have been admitted, or removed).
                    connection.sendMembers(space: space, context: context)
                case .joins(let joins, let membership):
                    connection.passOn(joins, membership: membership, context: context)
                case .acks(let acks):
                    connection.sendAcks(acks, context: context)
                case .acksChanged:
                    connection.sendHeldAcks(space: space, context: context)
                case .formats(let statements):
                    connection.sendFormats(statements, context: context)
                case .formatsChanged:
                    connection.sendHeldFormats(space: space, context: context)
                case .expired:
                    connection.close(context: context)
                }
            }
        }
        sendMembers(space: space, context: context)
        if access == .member { startServing(space: space, context: context) }
        run(context: context, { relay in
            (try await relay.store.joins(space: space, nowMs: RelayServer.nowMs()), try await relay.membership(space))
        }) { connection, held, context in
            connection.passOn(held.0, membership: held.1, context: context)
        }
    }

    func handle(_ message: PeerMessage, space: SpaceID, context: ChannelHandlerContext) throws {
        switch message {
        case .state(let vector, _):
            var known = peerVector ?? [:]
            for (o, s) in vector { known[o] = max(known[o] ?? 0, s) }
            peerVector = known
            pump(space: space, context: context)
        case .entries(let batch):
            // The device holds what it sends: no round sends it back, even one read before this batch is stored.
            if var v = peerVector { v[batch.origin] = max(v[batch.origin] ?? 0, batch.head.seq); peerVector = v }
            receive(.batch(batch), space: space, context: context)
        case .members(let ops):
            for op in ops { opsShared.insert(op.hash) }
            receive(.ops(ops), space: space, context: context)
        case .ping, .clock:
            break
        case .formats(let statements):
            // Only protocol 6 carries them; in order with operations, which may list the signers.
            guard protocolVersion >= Self.formatsFrom else { throw SyncRejection.malformed }
            receive(.formats(statements), space: space, context: context)
        case .acks(let acks):
            // In order with operations: those sent before may list the signers.
            receive(.acks(acks), space: space, context: context)
        case .snapshotPart(let part):
            // A member fills the relay with a snapshot when the relay lacks entries it compacted away (SYNC.md §11).
            receive(.snapshotPart(part), space: space, context: context)
        case .snapshot(let manifest):
            // Its manifest comes first (SYNC.md §11).
            receive(.snapshotManifest(manifest), space: space, context: context)
        case .error:
            close(context: context)
        case .join(let id, let joiner, let proof):
            hold(invite: id, joiner: joiner, proof: proof, space: space, context: context)
        case .joinRefused(let id, let joiner, let reason):
            receive(.joinRefused(invite: id, joiner: joiner, reason: reason), space: space, context: context)
        case .chunkOffer(let ids):
            try offered(ids, space: space, context: context)
        case .chunk(let id, let sealed):
            // Copied out of the message: the relay keeps it.
            try receivedChunk(id, sealed: Array(sealed), space: space, context: context)
        case .chunkMissing(let ids):
            notHeld(ids, space: space)
        case .chunkWant(let ids):
            try wantedChunks(ids, space: space, context: context)
        case .chunkBad(let ids):
            badChunks(ids, space: space, context: context)
        case .chunkKeep(let ids):
            // In order with the operations before it, which may list the device.
            receive(.keep(ids), space: space, context: context)
        }
    }

    /// Runs `work` against the relay's store (off the event loop), then `done` on the event loop unless the
    /// connection closed meanwhile; a `SyncRejection` is told to the device, any other failure closes the connection.
    /// Work that has not finished within the relay's `storeTimeout` (a store that stopped answering: a PostgreSQL server
    /// going away mid-query can leave a query waiting for good) is cancelled and closes the connection too, so the
    /// device reconnects and starts afresh instead of waiting on a connection that sends it nothing.
    func run<T: Sendable>(
        context: ChannelHandlerContext, _ work: @escaping @Sendable (RelayServer) async throws -> T,
        _ done: @escaping (RelayConnection, T, ChannelHandlerContext) -> Void
    ) {
        let relay = self.relay
        let bound = NIOLoopBound((self, context, done), eventLoop: context.eventLoop)
        let promise = context.eventLoop.makePromise(of: T.self)
        let task = Task(executorPreference: relay.executor) {
            do {
                promise.succeed(try await work(relay))
            } catch {
                promise.fail(error)
            }
        }
        let expiry = context.eventLoop.scheduleTask(in: relay.storeTimeout) {
            let (connection, context, _) = bound.value
            task.cancel()
            guard case .established = connection.state else { return }
            connection.relay.record(.storeFailed(timedOut: true))
            connection.relay.logger.error(
                "Relay storage did not answer in time; closing the connection",
                metadata: ["timeoutMs": "\(relay.storeTimeout.nanoseconds / 1_000_000)"])
            connection.close(context: context)
        }
        promise.futureResult.whenComplete { result in
            expiry.cancel()
            let (connection, context, done) = bound.value
            guard case .established = connection.state else { return }
            switch result {
            case .success(let value): done(connection, value, context)
            case .failure(let rejection as SyncRejection): connection.refuse(rejection, context: context)
            case .failure(let error):
                connection.relay.record(.storeFailed(timedOut: false))
                connection.relay.logger.error("Relay storage failed", metadata: ["error": "\(String(reflecting: error))"])
                connection.close(context: context)
            }
        }
    }

    func refuse(_ rejection: SyncRejection, context: ChannelHandlerContext) {
        relay.record(.rejected(rejection.rawValue))
        relay.logger.info("Relay refused a device's data", metadata: ["reason": "\(rejection.rawValue)"])
        send(.error(rejection.rawValue), context: context)
        close(context: context)
    }

    /// Releases what the connection holds (its gate place, upload reservation, held join, listener), once.
    func release() {
        if case .closed = state { return }
        relay.released(place, device: device)
        place.release()
        if case .established(let space) = state { releaseUpload(space: space) }
        if case .established(let space) = state { dropHeldJoin(space: space) }
        if case .established(let space) = state, let listener { relay.unlisten(space: space, id: listener) }
        if case .established(let space) = state { releaseChunkRoom(chunkRoom, space: space) }
        uploadExpiry?.cancel()
        state = .closed
        inbox = []
    }

    func close(context: ChannelHandlerContext) {
        release()
        context.close(promise: nil)
    }
}
