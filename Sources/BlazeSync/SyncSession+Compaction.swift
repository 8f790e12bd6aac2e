import BlazeCRDT
import BlazeCrypto
import BlazeStore
import BlazeWire
import NIOCore

/// Acknowledgements and snapshots on a session (SYNC.md §11).
extension SyncSession {
    /// Sends the acknowledgements the peer is not known to hold (this device's own, issued first when what it
    /// applied changed, and those of other members it passes on).
    func sendAcks(context: ChannelHandlerContext) {
        guard let link, stateSent, !closed else { return }
        let (db, space, identity) = (link.db, link.space.id, engine.identity)
        let lacking = engine.lackingKeys(link.space.snapshot)
        let known = acksShared
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        engine.pool.runIfActive(eventLoop: context.eventLoop) { () -> [Acknowledgement] in
            _ = try db.issueAcknowledgement(space: space, identity: identity, nowMs: nowMsUnsigned(), lacking: lacking)
            return try db.acknowledgements().filter { held in known[held.node].map { held.issuedMs > $0 } ?? true }
                .compactMap { try? Acknowledgement(bytes: $0.bytes) }
        }.whenComplete { result in
            let (session, context) = bound.value
            guard case .success(let acks) = result, !acks.isEmpty, !session.closed else { return }
            for ack in acks { session.acksShared[ack.node] = max(session.acksShared[ack.node] ?? 0, ack.issuedMs) }
            // Bounded per message like `MEMBERS`: an acknowledgement names at most every origin.
            var chunk: [Acknowledgement] = []
            var bytes = 0
            for ack in acks {
                if bytes + ack.bytes.count > 1 << 20, !chunk.isEmpty {
                    session.send(.acks(chunk), context: context)
                    chunk = []
                    bytes = 0
                }
                chunk.append(ack)
                bytes += ack.bytes.count
            }
            session.send(.acks(chunk), context: context)
        }
    }

    /// Keeps the peer's acknowledgements that are newer than those held, then lets every session of the database
    /// pass them on.
    func received(acks: [Acknowledgement], context: ChannelHandlerContext) {
        // A peer this side does not serve (the log does not list it) has no acknowledgements worth keeping or acting on.
        guard let link, servesPeer else { return }
        let (db, snapshot, engine) = (link.db, link.space.snapshot, self.engine)
        // Only signers the log lists are remembered, so what a session keeps is bounded by the log, however many keys
        // a peer signs with.
        for ack in acks {
            guard let member = snapshot.membership?.member(ack.node), member.keys.signing == ack.deviceKey else { continue }
            acksShared[ack.node] = max(acksShared[ack.node] ?? 0, ack.issuedMs)
        }
        let (space, shared) = (link.space.id, link.space)
        _ = engine.pool.runIfActive(eventLoop: context.eventLoop) {
            let kept = try db.keep(acks, space: space, membership: snapshot.membership)
            // An admin seals again what a member says it was sealed wrong (SYNC.md §9, "Keys sealed wrong").
            let resealed = try engine.resealLacking(space: shared, acks: acks)
            if kept || resealed { engine.membershipChanged(db: db.name) }
        }
    }

    /// Sends the peer a snapshot of this replica (its signed manifest, then its pieces), because it lacks entries
    /// compacted away here, then what follows it; one per session. A current member installs it; a relay (a device the log does not list) keeps it for the
    /// devices that reach only the relay (RELAY.md): it is sealed with the space's key, which a relay never holds. A
    /// member that was removed gets none.
    func sendSnapshot(context: ChannelHandlerContext) {
        guard let link, !closed else { return }
        let space = link.space.snapshot
        // A space without a log has no member list: every capability holder is a member there.
        let listed = space.membership?.member(link.device.nodeID)
        let mayTake = space.membership == nil || listed == nil || listed?.isCurrent == true
        guard !snapshotSent, mayTake else {
            report.update { $0.lastError = "the peer lacks entries compacted away here, and a removed member takes no snapshot" }
            pumping = false
            return
        }
        snapshotSent = true
        let (db, identity, cache) = (link.db, engine.identity, engine.snapshots)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        // One build a minute per database, whoever asks (`SnapshotCache`).
        cache.snapshot(db: db.name, pool: engine.pool, on: context.eventLoop) {
            guard let snapshot = try db.makeSnapshot(key: space.key, identity: identity) else { return nil }
            return SnapshotCache.Built(
                manifest: snapshot.manifest, messages: try snapshot.parts.map { try PeerMessage.snapshotPart($0).encoded() },
                byteCount: snapshot.byteCount, at: .now)
        }.whenComplete { result in
            let (session, context) = bound.value
            switch result {
            case .success(let snapshot?):
                // Its memory goes once its minute is over, whether or not another session asks.
                context.eventLoop.scheduleTask(in: .seconds(61)) { cache.expire() }
                // The signed manifest first: the peer checks it before it takes any piece (SYNC.md §11).
                session.send(.snapshot(snapshot.manifest), context: context)
                session.sendPieces(snapshot.messages[...], context: context)
                for (origin, head) in snapshot.manifest.heads { session.peerHolds(origin: NodeID(bytes: origin), seq: head.seq) }
                session.report.update { $0.snapshotsSent += 1 }
                session.engine.logger.info(
                    "Sync sent a snapshot", metadata: ["db": "\(db.name)", "peer": "\(session.report.peer)", "bytes": "\(snapshot.byteCount)"])
            case .success(nil):
                session.report.update { $0.lastError = "the peer lacks entries compacted away here, and this device cannot seal a snapshot" }
                session.pumping = false
            case .failure(let error):
                session.pumping = false
                session.errorCaught(context: context, error: LocalFailure(error))
            }
        }
    }

    /// Writes a snapshot's encoded `pieces` one after another, each once the one before it was written, then goes on
    /// pumping: a peer that reads slowly holds this session to one sealed piece in memory, while the pieces
    /// themselves are held once for every session (`SnapshotCache`).
    func sendPieces(_ pieces: ArraySlice<[UInt8]>, context: ChannelHandlerContext) {
        guard let piece = pieces.first, !closed else {
            pumping = false
            if !closed { pump(context: context) }
            return
        }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        send(bytes: piece, context: context).whenComplete { result in
            let (session, context) = bound.value
            guard case .success = result else {
                session.pumping = false
                return
            }
            session.sendPieces(pieces.dropFirst(), context: context)
        }
    }
}
