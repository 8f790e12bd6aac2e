import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeWire
import Foundation
import NIOCore
import Synchronization

/// The anti-entropy protocol of one established sync connection (SYNC.md §8), whatever carries it.
///
/// Once the link is established both sides send `STATE` (what they hold per origin, and their own signed head), then
/// each sends the other exactly the entries it lacks, per origin in sequence order, in batches that end at signed
/// heads (`SyncSession+Sending`), and keeps pushing new entries as changes commit. Received batches are stored by the
/// `BatchReceiver` before this handler; it only learns that the peer holds them. A refusal of the peer's data is
/// counted, told to the peer (`ERROR`) and closes the connection; a local failure is counted as an error and closes
/// it; a peer silent for the engine's timeout is closed, and a quiet connection sends `PING` so that it is never silent.
final class SyncSession: ChannelInboundHandler {
    typealias InboundIn = PeerMessage
    typealias OutboundOut = [UInt8]

    let engine: SyncEngine
    let report: LinkReport
    /// The database and key, once the handshake succeeded.
    var link: SyncLinkEstablished?
    /// Whether this session sent its `CLOCK` (`sendClock`).
    var clockSent = false
    var closed = false
    /// Whether this connection is counted in the link's report (it is from the end of `establish` to its close).
    var counted = false
    /// What the peer holds, as far as this side knows (its STATE, plus what was sent or received since).
    var peerVector: [NodeID: UInt64]?
    var pumping = false
    var pumpAgain = false
    private var feedToken: Int?
    /// This session's registration with the engine (membership changes reach it through it).
    var registration: Int?
    /// Membership operations the peer holds, as far as this side knows (sent to it, or received from it).
    var opsShared: Set<EntryHash> = []
    /// Acknowledgements the peer holds, as far as this side knows: node id → when issued (SYNC.md §11).
    var acksShared: [[UInt8]: UInt64] = [:]
    /// Statements of entry formats the peer holds, as far as this side knows: node id → when issued.
    var formatsShared: [[UInt8]: UInt64] = [:]
    /// Whether this session said that the peer cannot open entries it lacks (once per session).
    var toldUnopenable = false
    /// True once this session sent a snapshot (one per session: a peer that still lacks entries reconnects).
    var snapshotSent = false
    /// True once this side sent its `STATE` (a joiner waits until it is admitted).
    var stateSent = false
    /// True while the device at the other end is removed in this side's log: it got the proof of its removal and
    /// has until its `STATE` to send operations that change that (a concurrent removal of the remover).
    var peerRemoved = false
    /// Whether this session sent the peer a `JOIN_REFUSED` (an older relay closes on it as malformed).
    var sentJoinRefusal = false
    /// The fewest entry keys this side held when it refused a batch it could not open; nil when it refused none.
    var awaitingKeys: Int?
    /// The end of this session scheduled after a refusal that may clear (`SyncSession.refetchLater`).
    var refetch: Scheduled<Void>?
    /// Whether this session refused a batch for a reason that may clear.
    var refusedForNow = false
    /// This session's token as a chunk source of the engine's fetcher, once established.
    var chunkSource: Int?
    /// Chunks the peer asked for and this side has not started serving.
    var chunkQueue: [ChunkID] = []
    /// Chunks being read, sealed or written for the peer now.
    var chunksServing = 0
    /// Whether this session asked the peer for chunks (an older version closes on it as malformed), and whether the
    /// peer answered any (then it knows the chunk messages).
    var sentChunkWant = false
    var answeredChunks = false
    /// Offering chunks to a relay (`SyncSession+Offers`): the ids still to offer, those offered on this connection,
    /// the offer awaiting its answer, the store's generation when last listed, whether it is being listed, whether
    /// the database had no store when it was (none is opened until a blob is put or fetched), and whether an offer
    /// went (an older relay closes on it as malformed).
    var offerList: [ChunkID] = []
    var offered: Set<ChunkID> = []
    var offerOut: Set<ChunkID>?
    var offeredGeneration: Int?
    var listingOffers = false
    var offerNoStore = false
    /// When the store was last listed for offers, whether a listing is scheduled, the chunks the relay could not take
    /// yet and the pause before they are offered again (doubling while nothing is taken).
    var lastListing: NIODeadline?
    var relistScheduled = false
    var declinedChunks: [ChunkID] = []
    var reofferPause: TimeAmount?
    var sentChunkOffer = false
    /// Whether the relay is to be told every chunk held at the next listing (`keepHeld`): at first, then every 12 h;
    /// the task that makes it due again, and whether a `CHUNK_KEEP` went on this connection.
    var keepDue = true
    var keepTask: Scheduled<Void>?
    var sentChunkKeep = false
    /// Set by the feed listener (on the writer thread) so that a burst of commits schedules one pump.
    private let wake = WakeFlag()

    /// Whether the peer is served even when the log does not list it: a relay this device dialed.
    let servesUnlisted: Bool

    /// A session for one connection, reporting on `report`; `servesUnlisted` for a relay this device dialed.
    init(engine: SyncEngine, report: LinkReport, servesUnlisted: Bool = false) {
        self.engine = engine
        self.report = report
        self.servesUnlisted = servesUnlisted
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        switch event {
        case let established as SyncLinkEstablished:
            establish(established, context: context)
        case let holds as PeerHoldsBatch:
            peerHolds(origin: holds.origin, seq: holds.seq)
        case let ops as MergedOps:
            merged(ops)
        case let refused as RefusedForNow:
            refetchLater(refused.reason, context: context)
        case let awaiting as AwaitingKeys:
            awaitingKeys = min(awaitingKeys ?? .max, awaiting.held)
            reconnectForNewKeys(context: context)
        case IdleStateHandler.IdleStateEvent.read:
            if link != nil { timedOut(context: context) }
        case IdleStateHandler.IdleStateEvent.write:
            if link != nil {
                send(.ping, context: context)
                report.flush()
            }
        default:
            break
        }
        context.fireUserInboundEventTriggered(event)
    }

    private func timedOut(context: ChannelHandlerContext) {
        guard !closed else { return }
        report.update { $0.errors += 1; $0.lastError = "timed out: peer silent for \(self.engine.timeout.nanoseconds / 1_000_000) ms" }
        engine.logger.info("Sync connection timed out", metadata: ["db": "\(report.db ?? "-")", "peer": "\(report.peer)"])
        close(context: context)
    }

    private func establish(_ established: SyncLinkEstablished, context: ChannelHandlerContext) {
        link = established
        // Wake the sender whenever a change commits (local writes and entries received from other peers alike).
        let db = established.db
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let wake = self.wake
        let loop = context.eventLoop
        while true {
            switch db.feed.attach(after: db.feed.lastSequence, { signal in
                switch signal {
                case .entries, .reset:
                    guard wake.set() else { return }
                    loop.execute {
                        let (session, context) = bound.value
                        session.wake.clear()
                        session.pump(context: context)
                    }
                case .ended:
                    loop.execute { bound.value.1.close(promise: nil) }
                }
            }) {
            case .attached(let token): feedToken = token
            case .behind: continue
            case .ended: context.close(promise: nil)
            }
            break
        }
        // A reading is of this connection: none until its peer's CLOCK (a protocol 4 peer never sends one).
        report.update { $0.clockSkewMs = nil }
        startMembership(context: context)
        if report.direction == .outbound, report.peer.hasPrefix("ws"), established.protocolVersion < Self.formatsFrom {
            // A relay of an older protocol cannot carry entries of format 3: recorded, this device's statement says so
            // from now on (so it seals format 2 itself), and every session passes it on (`receivableFormats`).
            let (engine, space, relay, version) = (self.engine, established.space, report.peer, Int(established.protocolVersion))
            _ = engine.pool.runIfActive(eventLoop: context.eventLoop) {
                try db.recordRelayProtocol(relay, version: version)
                if try engine.issueFormatStatement(db: db, space: space) { engine.membershipChanged(db: db.name) }
            }
        }
        attachChunkSource(context: context)
        offerChunks(context: context)
        // Counted last: a caller that sees the link connected finds it a chunk source already (a `blob.get` right
        // after `sync.status` says connected asks this peer rather than failing with no source).
        guard !closed else { return }
        counted = true
        let device = established.device.nodeIDHex
        report.update { $0.connect(device: device); $0.lastError = nil }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !closed else { return }
        switch unwrapInboundIn(data) {
        case .state(let vector, let ownHead):
            // The peer sends its log before its STATE: a removal of it that still holds now is final.
            if peerRemoved, stillRemoved(context: context) { return }
            var known = peerVector ?? [:]
            for (o, s) in vector { known[o] = max(known[o] ?? 0, s) }
            peerVector = known
            report.update { $0.lastSyncMs = nowMs() }
            if let ownHead { check(ownHead: ownHead, context: context) }
            pump(context: context)
        case .entries:
            break  // stored by the BatchReceiver before this handler
        case .error(let reason):
            report.update { $0.lastError = "peer closed: \(reason)" }
            if sentJoinRefusal, reason == SyncRejection.malformed.rawValue {
                // A relay of an older version, which does not know `JOIN_REFUSED`: it is not sent one again.
                engine.withoutJoinRefusal.withLock { _ = $0.insert(report.peer) }
                engine.logger.warning(
                    "Sync peer does not take join refusals (an older relay): its joiners will wait out their time",
                    metadata: ["peer": "\(report.peer)"])
            }
            if sentChunkKeep, answeredChunks, reason == SyncRejection.malformed.rawValue, let device = link?.device.nodeIDHex {
                // A relay of an older version, which serves chunks but does not know `CHUNK_KEEP`: it is sent none
                // again (its chunks stay until its retention).
                engine.withoutChunkKeep.withLock { _ = $0.insert(device) }
                engine.logger.warning(
                    "Relay does not take chunk keeps (an older version): it is sent none again",
                    metadata: ["peer": "\(report.peer)", "device": "\(device)"])
            }
            if sentChunkWant || sentChunkOffer || sentChunkKeep, !answeredChunks, reason == SyncRejection.malformed.rawValue, let device = link?.device.nodeIDHex {
                // A device or relay of an older version, which does not know `CHUNK_WANT`, `CHUNK_OFFER` or
                // `CHUNK_KEEP`: no chunk message goes to it again.
                engine.withoutChunks.withLock { _ = $0.insert(device) }
                engine.logger.warning(
                    "Sync peer does not serve blob chunks (an older version): it is not asked for them again",
                    metadata: ["peer": "\(report.peer)", "device": "\(device)"])
            }
            if let space = link?.space, space.joining.withLock({ $0 != nil }) { engine.failJoin(space, reason: reason) }
            close(context: context)
        case .ping:
            break
        case .clock(let ms):
            let skew = Int64(ms) - Int64(Self.clockMs())
            report.update { $0.clockSkewMs = Int(skew) }
        case .members:
            break  // merged by the BatchReceiver before this handler (`MergedOps`)
        case .join(let id, let device, let proof):
            redeem(inviteID: id, device: device, proof: proof, context: context)
        case .acks(let acks):
            received(acks: acks, context: context)
        case .formats(let statements):
            received(formats: statements, context: context)
        case .snapshotPart, .snapshot:
            break  // installed by the BatchReceiver before this handler
        case .joinRefused(let id, let device, let reason):
            refusedJoin(inviteID: id, device: device, reason: reason, context: context)
        case .chunkWant(let ids):
            wanted(ids, context: context)
        case .chunk(let id, let sealed):
            received(chunk: id, sealed: sealed, context: context)
        case .chunkMissing(let ids):
            peerLacks(ids, context: context)
        case .chunkOffer, .chunkBad, .chunkKeep:
            // Only a relay takes offers, bad-copy reports and keeps; a device never sends them to another device.
            errorCaught(context: context, error: SyncRejection.malformed)
        }
    }

    /// Checks the peer's own signed head against what this side holds of its log.
    private func check(ownHead: SignedHead, context: ChannelHandlerContext) {
        guard let link else { return }
        let (db, key) = (link.db, link.key)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        engine.pool.runIfActive(eventLoop: context.eventLoop) { () throws -> SyncRejection? in
            do {
                try db.checkOwnHead(ownHead, key: key)
                return nil
            } catch SyncRejection.fork {
                // The peer's own log forked: keep the evidence (which quarantines its origin) and go on syncing every
                // other origin with it.
                try db.recordFork(head: ownHead, seq: ownHead.seq, hash: ownHead.hash, key: key)
                return .fork
            } catch let reason as SyncRejection where reason == .rollback {
                return reason
            }
        }
        .whenComplete { result in
            let (session, context) = bound.value
            switch result {
            case .success(nil):
                break
            case .success(let reason?):
                // A fork is kept as evidence; a rollback means the peer lost entries it had published, and it gets
                // them back from here like any missing entries. Both are counted and sync goes on.
                session.report.update { $0.rejected[reason.rawValue, default: 0] += 1 }
            case .failure(let error):
                session.errorCaught(context: context, error: error)
            }
        }
    }

    /// Notes that the peer holds `origin`'s entries up to `seq` (it sent them, or they were sent to it).
    func peerHolds(origin: NodeID, seq: UInt64) {
        guard var v = peerVector else { return }
        v[origin] = max(v[origin] ?? 0, seq)
        peerVector = v
    }

    /// This device's clock as `CLOCK` says it and compares the peer's with: its wall clock, moved by
    /// `BLAZE_CLOCK_SKEW_MS` (ms, may be negative) when that is set, which tests use to play a device whose clock is
    /// off.
    static func clockMs() -> UInt64 { UInt64(max(0, nowMs() + clockSkewForTests)) }

    private static let clockSkewForTests: Int64 = ProcessInfo.processInfo.environment["BLAZE_CLOCK_SKEW_MS"]
        .flatMap { Int64($0) }.map { min(max($0, -(1 << 40)), 1 << 40) } ?? 0

    /// Sends a control message.
    @discardableResult
    func send(_ message: PeerMessage, context: ChannelHandlerContext) -> EventLoopFuture<Void> {
        // Entries are encoded on the I/O pool by `pump` and sent with `send(bytes:)`; control messages always encode.
        guard let bytes = try? message.encoded() else {
            return context.eventLoop.makeFailedFuture(SyncRejection.malformed)
        }
        return send(bytes: bytes, context: context)
    }

    /// Writes one encoded message (the frame encoder seals it).
    func send(bytes: [UInt8], context: ChannelHandlerContext) -> EventLoopFuture<Void> {
        context.writeAndFlush(wrapOutboundOut(bytes))
    }

    /// A refusal of the peer's data counts its reason, tells the peer why and closes; any other error is a local
    /// failure (storage, shutdown), counted as an error.
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard !closed else { return }
        if let reason = error as? SyncRejection {
            report.reject(reason)
            engine.logger.warning(
                "Sync rejected", metadata: ["db": "\(report.db ?? "-")", "peer": "\(report.peer)", "reason": "\(reason.rawValue)"])
            if link != nil { send(.error(reason.rawValue), context: context) }
        } else {
            report.update { $0.errors += 1; $0.lastError = "\(error)" }
        }
        close(context: context)
    }

    func close(context: ChannelHandlerContext) {
        closed = true
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        closed = true
        refetch?.cancel()
        refetch = nil
        // A session that refused nothing for now ends the link's run of such ends: the next one waits the least.
        if !refusedForNow { engine.refetchBackoff.withLock { $0[refetchKey] = nil } }
        if let feedToken, let link { link.db.feed.detach(feedToken) }
        feedToken = nil
        if let registration { engine.unregister(registration) }
        registration = nil
        detachChunkSource()
        // What was offered and listed goes with the connection (a store of a million chunks lists that many ids).
        keepTask?.cancel()
        keepTask = nil
        (offered, offerList, declinedChunks) = ([], [], [])
        if counted, let device = link?.device.nodeIDHex { report.update { $0.disconnect(device: device) } }
        counted = false
        link = nil
        context.fireChannelInactive()
    }
}

/// A flag the feed listener sets without locks; true from `set()` means "first since the last clear".
final class WakeFlag: Sendable {
    private let flag = Atomic<Bool>(false)
    func set() -> Bool { !flag.exchange(true, ordering: .acquiringAndReleasing) }
    func clear() { flag.store(false, ordering: .releasing) }
}
