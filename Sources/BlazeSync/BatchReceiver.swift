import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeWire
import NIOCore

/// Stores the batches a peer sends, strictly in arrival order, and keeps memory bounded while it does.
///
/// Membership operations are merged in the same order, on the I/O pool: a batch that arrives after them verifies
/// once they count, and any other message that arrives while they wait is passed on after them.
///
/// Verifying a batch (signatures, AEAD, decoding) needs no database, so it starts as soon as the batch arrives, on the
/// engine's `verifyPool` (so that a group ready to store never waits in the I/O pool's queue behind verifications),
/// and overlaps with storing the batches before it; the batches waiting behind the next one (up to
/// `VerifiedBatch.maxGroup` in all, `maxGroupWhileOthersWait` while other writes wait for the database) are stored with
/// it in one transaction. Reading pauses while `maxInbox` batches or `maxInboxBytes` of them wait, so a fast sender
/// cannot make memory grow; while it is paused or storing, a read-idle event is not the peer's silence and is not
/// passed on. A batch refused for what its origin signed
/// (`SyncRejection.blamesOrigin`) is counted and that origin skipped for the rest of the session (a fork is also kept
/// as evidence; a refusal that may clear ends the session a while later, `RefusedForNow`); any other refusal fails the
/// connection. Every other message passes through.
final class BatchReceiver: ChannelInboundHandler {
    typealias InboundIn = PeerMessage
    typealias InboundOut = PeerMessage

    let engine: SyncEngine
    let report: LinkReport
    private var link: SyncLinkEstablished?
    /// What waits to be stored, in arrival order: batches (each already being verified, with how
    /// many entry keys the space held when that began) and the pieces and manifest of a snapshot.
    private enum Item {
        /// A batch, with its verification once started (nil: it starts when the batch's turn comes, after the
        /// membership operations received before it are merged).
        case batch(EntryBatch, verified: EventLoopFuture<VerifiedBatch>?, keys: Int)
        case part(SnapshotPart)
        case manifest(SnapshotManifest)
        /// Membership operations, merged on the I/O pool.
        case ops([MembershipOp])
        /// Any other message received while operations wait to be merged: passed on in its turn, so the session sees
        /// it after the log those operations make (a `STATE` after the operations that undo a removal).
        case passOn(PeerMessage)

        var byteCount: Int {
            switch self {
            case .batch(let b, _, _): return b.byteCount
            case .part(let p): return p.bytes.count
            case .manifest(let m): return m.bytes.count
            case .ops(let ops): return ops.reduce(0) { $0 + $1.bytes.count }
            case .passOn: return 0
            }
        }
    }
    /// Operations messages queued or being merged: while any are, batches verify in their turn and other messages
    /// wait in the inbox.
    private var opsPending = 0
    /// Membership operations the peer sent in this session that the log did not keep: the peer counts them as held
    /// here and never sends them again on this connection, so a later operation naming one takes it from here.
    private var opsSetAside = SetAsideOps()
    private var inbox: [Item] = []
    /// The snapshot being received: its manifest, accepted before any piece, and the pieces so far, on disk
    /// (`BatchReceiver+Snapshot`).
    var staging: SnapshotStaging?
    /// The largest snapshot a session takes (the pieces' bytes its manifest declares, staged on disk).
    static let maxSnapshotBytes = 1 << 30
    /// The most bytes of snapshot pieces being opened and staged at once, across sessions (the engine's
    /// `snapshotBudget`): only pieces in flight are in memory.
    static let maxSnapshotBytesInFlight = 1 << 30
    /// The most bytes of snapshots sessions stage on disk at once (their manifests' declared sizes; at most
    /// `maxSnapshotBytes` per database).
    static let maxStagedBytes = 4 << 30
    /// Entry bytes of the batches in `inbox`.
    private var inboxBytes = 0
    var applying = false
    private var readPaused = false
    /// Set once the connection failed or closed: nothing more is stored.
    var stopped = false
    /// Origins whose batches this session refuses: later batches of theirs could not link to anything stored here.
    private var refusedOrigins: Set<NodeID> = []

    /// Batches waiting to be applied (or being stored beyond the first of a group) before reading pauses: a group of
    /// `VerifiedBatch.maxGroup` (24) and some of the next, so groups alternate between long and short unless the
    /// store is slower than the sender.
    static let maxInbox = 28
    /// Batches of a group being stored beyond its first: counted with the inbox in its limits.
    private var groupExtra = (count: 0, bytes: 0)
    /// Batches to store one at a time before grouping again (after a group refused as a whole).
    private var singly = 0
    /// Bytes of received batches waiting to be applied before reading pauses: a peer holds at most this plus the
    /// batch that crossed it, the first batch of the group being stored and one frame being read (each at most
    /// `SessionCipher.maxBody`) of the receiver's memory, and their decoded changes.
    static let maxInboxBytes = 12 << 20

    /// A receiver storing through `engine`'s I/O pool and counting on `report`.
    init(engine: SyncEngine, report: LinkReport, relay: Bool = false) {
        self.engine = engine
        self.report = report
        self.relay = relay
    }

    /// Whether the peer is a relay this device dialed: the only peer the log does not list that may pass on a
    /// writer's snapshot.
    let relay: Bool

    /// True while nothing received waits: reading is on and no batch is queued or being stored.
    private var idle: Bool { !readPaused && !applying && inbox.isEmpty }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let item: Item
        switch unwrapInboundIn(data) {
        case .entries(let batch):
            guard let link, !stopped else { return }
            if opsPending > 0 {
                item = .batch(batch, verified: nil, keys: 0)
            } else {
                let (verified, keys) = verify(batch, link: link, context: context)
                item = .batch(batch, verified: verified, keys: keys)
            }
        case .members(let ops):
            guard link != nil, !stopped else { return }
            opsPending += 1
            item = .ops(ops)
        case .snapshotPart(let part):
            guard link != nil, !stopped else { return }
            item = .part(part)
        case .snapshot(let manifest):
            guard link != nil, !stopped else { return }
            item = .manifest(manifest)
        case let other where opsPending > 0:
            guard !stopped else { return }
            item = .passOn(other)
        default:
            context.fireChannelRead(data)
            return
        }
        inbox.append(item)
        inboxBytes += item.byteCount
        if isFull && !readPaused {
            readPaused = true
            context.channel.setOption(ChannelOptions.autoRead, value: false).whenFailure { _ in }
        }
        applyNext(context: context)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let established = event as? SyncLinkEstablished { link = established }
        // A peer is not silent while this side is not reading (a backlog being stored).
        if case .read? = event as? IdleStateHandler.IdleStateEvent, !idle { return }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        stop()
        context.fireErrorCaught(error)
    }

    func channelInactive(context: ChannelHandlerContext) {
        stop()
        context.fireChannelInactive()
    }

    /// Drops what waits: batches received after a refused one are not stored; the snapshot being staged is deleted.
    func stop() {
        stopped = true
        opsPending = 0
        inbox = []
        inboxBytes = 0
        dropStaging()
    }

    /// Stores the next waiting batch once it has verified, then the one after it.
    func applyNext(context: ChannelHandlerContext) {
        guard !applying, !stopped, !inbox.isEmpty, let link else { return }
        let item = inbox.removeFirst()
        inboxBytes -= item.byteCount
        let batch: EntryBatch, verified: EventLoopFuture<VerifiedBatch>, keys: Int
        switch item {
        case .batch(let b, let v?, let k): (batch, verified, keys) = (b, v, k)
        case .batch(let b, nil, _):
            batch = b
            (verified, keys) = verify(b, link: link, context: context)
        case .part(let part): return applySnapshotPart(part, link: link, context: context)
        case .manifest(let manifest): return accept(manifest, link: link, context: context)
        case .ops(let ops): return merge(ops, link: link, context: context)
        case .passOn(let message):
            context.fireChannelRead(wrapInboundOut(message))
            resumeReading(context: context)
            return applyNext(context: context)
        }
        guard !refusedOrigins.contains(batch.origin) else {
            resumeReading(context: context)
            applyNext(context: context)
            return
        }
        if singly > 0 {
            singly -= 1
        } else {
            // The verified batches waiting right behind it are stored with it, in one transaction.
            var group = [Pending(batch: batch, verified: verified, keys: keys)]
            let limit = VerifiedBatch.groupLimit(link.db)
            while group.count < limit, case .batch(let b, let v?, let k)? = inbox.first,
                !refusedOrigins.contains(b.origin)
            {
                inbox.removeFirst()
                inboxBytes -= b.byteCount
                group.append(Pending(batch: b, verified: v, keys: k))
            }
            if group.count > 1 { return store(group, link: link, context: context) }
        }
        applying = true
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let (pool, loop, db) = (engine.pool, context.eventLoop, link.db)
        verified.flatMap { v in pool.runIfActive(eventLoop: loop) { try db.store(v) } }
            .whenComplete { result in
                let (receiver, context) = bound.value
                receiver.applying = false
                guard !receiver.stopped else { return }
                switch result {
                case .success(let outcome):
                    receiver.report.update {
                        $0.receivedEntries += outcome.stored
                        $0.lastSyncMs = nowMs()
                    }
                    receiver.noteMissing(parked: outcome.report.parked > 0, db: db, context: context)
                    receiver.resumeReading(context: context)
                    receiver.applyNext(context: context)
                case .failure(let error as SyncRejection) where error.blamesOrigin:
                    receiver.refuse(batch, error, link: link, context: context)
                    if error == .unknownEpoch || error == .badSeal {
                        context.fireUserInboundEventTriggered(AwaitingKeys(held: keys))
                    }
                case .failure(let error):
                    // A refusal of the peer's frame, or a local failure: the session decides.
                    receiver.stop()
                    context.fireErrorCaught(error)
                }
            }
    }

    /// A batch taken from the inbox with its verification.
    private struct Pending {
        let batch: EntryBatch
        let verified: EventLoopFuture<VerifiedBatch>
        let keys: Int
    }

    /// Stores the batches of `group` that verified, up to the first that did not, in one transaction. The ones not
    /// stored go back to the front of the inbox; when the transaction would have refused any of them, all go back to
    /// be stored one by one, each to its own verdict (`applyNext`).
    private func store(_ group: [Pending], link: SyncLinkEstablished, context: ChannelHandlerContext) {
        applying = true
        groupExtra = (group.count - 1, group.dropFirst().reduce(0) { $0 + $1.batch.byteCount })
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let (pool, loop, db) = (engine.pool, context.eventLoop, link.db)
        EventLoopFuture.whenAllComplete(group.map(\.verified), on: loop).flatMap { results in
            let verified = results.prefix { if case .success = $0 { true } else { false } }.compactMap { try? $0.get() }
            guard verified.count > 1 else { return loop.makeSucceededFuture((verified.count, [BatchOutcome]?.none)) }
            return pool.runIfActive(eventLoop: loop) { (verified.count, try db.store(group: verified)) }
        }.whenComplete { result in
            let (receiver, context) = bound.value
            receiver.applying = false
            receiver.groupExtra = (0, 0)
            guard !receiver.stopped else { return }
            switch result {
            case .success((_, let outcomes?)):
                receiver.report.update {
                    $0.receivedEntries += outcomes.reduce(0) { $0 + $1.stored }
                    $0.lastSyncMs = nowMs()
                }
                receiver.noteMissing(parked: outcomes.contains { $0.report.parked > 0 }, db: db, context: context)
                // A group cut short (for another write, or at its bound of documents) stored fewer than it verified:
                // the rest go back too.
                receiver.putBack(group.dropFirst(outcomes.count))
            case .success((let count, nil)):
                receiver.putBack(group[...])
                receiver.singly = max(1, count)
            case .failure(let error):
                receiver.stop()
                context.fireErrorCaught(error)
                return
            }
            receiver.resumeReading(context: context)
            receiver.applyNext(context: context)
        }
    }

    /// Returns batches taken from the inbox to its front, in order.
    private func putBack(_ pending: ArraySlice<Pending>) {
        inbox.insert(contentsOf: pending.map { .batch($0.batch, verified: $0.verified, keys: $0.keys) }, at: 0)
        inboxBytes += pending.reduce(0) { $0 + $1.batch.byteCount }
    }

    /// Starts verifying `batch` on the verification pool against the space as it is now (membership operations received before
    /// it merged); returns the verification and how many entry keys the space held.
    private func verify(_ batch: EntryBatch, link: SyncLinkEstablished, context: ChannelHandlerContext)
        -> (EventLoopFuture<VerifiedBatch>, Int)
    {
        let (db, snapshot) = (link.db, link.space.snapshot)
        let verified = engine.verifyPool.runIfActive(eventLoop: context.eventLoop) {
            try db.verify(batch: batch, key: snapshot.key, membership: snapshot.membership)
        }
        // Once verified the peer provably holds it, stored here or not: nothing of it goes back to the peer, even from
        // a round being read right now. (This runs before the store begins, and so before the commit wakes a round.)
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        verified.whenSuccess { _ in
            bound.value.fireUserInboundEventTriggered(PeerHoldsBatch(origin: batch.origin, seq: batch.head.seq))
        }
        return (verified, snapshot.key.entryKeyCount)
    }

    /// Merges membership operations into the space on the I/O pool (resolving the log takes time that the event loop's
    /// other connections should not wait), then tells the session which were new (`MergedOps`).
    private func merge(_ ops: [MembershipOp], link: SyncLinkEstablished, context: ChannelHandlerContext) {
        applying = true
        let space = link.space
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let before = opsSetAside
        engine.pool.runIfActive(eventLoop: context.eventLoop) { () throws -> ([MembershipOp], SetAsideOps) in
            var aside = before
            return (try space.merge(ops, aside: &aside, storing: true), aside)
        }.whenComplete { result in
            let (receiver, context) = bound.value
            receiver.applying = false
            guard !receiver.stopped else {
                // The session ended while they merged (a message refused right after them): the space holds them now,
                // and this device's next operations may name them, so they are stored and announced all the same.
                if case .success(let (fresh, _)) = result, !fresh.isEmpty { receiver.engine.persist(fresh, space: space) }
                return
            }
            receiver.opsPending -= 1
            switch result {
            case .success(let (fresh, aside)):
                // Held aside for a peer the log lists only: anyone else's connections are many and cheap.
                if case .member = space.snapshot.admits(link.device) { receiver.opsSetAside = aside } else { receiver.opsSetAside = SetAsideOps() }
                context.fireUserInboundEventTriggered(MergedOps(received: ops, fresh: fresh))
                receiver.resumeReading(context: context)
                receiver.applyNext(context: context)
            case .failure(let error):
                receiver.stop()
                context.fireErrorCaught(LocalFailure(error))
            }
        }
    }

    /// Re-reads what changes received depend on and this device lacks, when this batch parked changes or something
    /// was missing before (it may have arrived): `sync.status` `waiting` (SYNC.md §8, "Withheld entries").
    private func noteMissing(parked: Bool, db: BlazeDatabase, context: ChannelHandlerContext) {
        let book = report.book
        guard parked || book.hasMissing(db: db.name) else { return }
        let peer = parked ? report.peer : nil
        _ = engine.pool.runIfActive(eventLoop: context.eventLoop) {
            book.setMissing(db: db.name, needed: try db.missingDependencies(), held: try db.versionVector(), parkedBy: peer)
        }
    }

    /// True when the backlog (waiting, and being stored beyond one batch) is at its limits.
    private var isFull: Bool {
        inbox.count + groupExtra.count >= Self.maxInbox || inboxBytes + groupExtra.bytes >= Self.maxInboxBytes
    }

    /// Turns reading back on once the backlog is below its limits.
    func resumeReading(context: ChannelHandlerContext) {
        guard readPaused && !isFull else { return }
        readPaused = false
        context.channel.setOption(ChannelOptions.autoRead, value: true).whenFailure { _ in }
    }

    /// Refuses a batch for what its origin signed: counts the reason, skips the origin for the rest of the session
    /// (a fork is also stored as evidence, which quarantines the origin for good), and goes on with other origins.
    private func refuse(_ batch: EntryBatch, _ reason: SyncRejection, link: SyncLinkEstablished, context: ChannelHandlerContext) {
        refusedOrigins.insert(batch.origin)
        report.update { $0.rejected[reason.rawValue, default: 0] += 1; $0.lastError = "rejected: \(reason.rawValue)" }
        engine.logger.warning(
            "Sync refused an origin's batch",
            metadata: [
                "db": "\(report.db ?? "-")", "peer": "\(report.peer)", "origin": "\(batch.origin)", "reason": "\(reason.rawValue)",
            ])
        if reason.mayClear { context.fireUserInboundEventTriggered(RefusedForNow(reason: reason)) }
        if reason == .fork {
            let (db, key) = (link.db, link.key)
            _ = engine.pool.runIfActive(eventLoop: context.eventLoop) { try db.recordFork(batch: batch, key: key) }
        }
        resumeReading(context: context)
        applyNext(context: context)
    }
}
