import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeWire
import NIOCore

/// Membership on a session (SYNC.md §9): each side sends the log operations the other lacks before its `STATE`, so
/// entries are always checked against a log at least as new as their sender's; a joiner redeems its invite first and
/// sends its `STATE` only once admitted; a removed device's connection is closed as soon as its removal is known.
extension SyncSession {
    /// Registers for membership changes, then either redeems the invite (joining) or sends the log and `STATE`.
    func startMembership(context: ChannelHandlerContext) {
        guard let link else { return }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let loop = context.eventLoop
        registration = engine.register(db: link.db.name) {
            loop.execute {
                let (session, context) = bound.value
                session.membershipChanged(context: context)
            }
        }
        if let wait = link.space.joining.withLock({ $0 }) {
            let me = engine.identity.publicKeys
            send(.join(id: wait.invite.id, device: me, proof: wait.invite.joinProof(device: me)), context: context)
            return
        }
        let snapshot = link.space.snapshot
        if snapshot.admits(link.device) == .revoked {
            sendProofOfRemoval(snapshot, context: context)
            return
        }
        // A device dialing in that the log does not list waits: its join, or its own operations listing it.
        guard servesPeer else {
            sendProofOfMembership(context: context)
            return
        }
        sendClock(context: context)
        sendMembers(context: context)
        sendState(context: context)
        sendAcks(context: context)
        sendFormats(context: context)
    }

    /// `CLOCK`, once per session, to a peer this session serves over protocol 5 or later: a device the log does not
    /// list (a capability holder, a removed device) learns nothing, not even this device's clock.
    func sendClock(context: ChannelHandlerContext) {
        guard let link, link.protocolVersion >= 5, !clockSent else { return }
        clockSent = true
        send(.clock(ms: Self.clockMs()), context: context)
    }

    /// Whether this session serves the peer: in a space with a log, a device that the log does not list (a joiner not
    /// admitted yet, anyone else holding the capability), whichever side dialed, gets nothing but the join flow until
    /// it is listed. A relay this device dialed (over a WebSocket: relays are never listed) is served.
    var servesPeer: Bool {
        guard let link else { return false }
        let snapshot = link.space.snapshot
        return servesUnlisted || snapshot.membership == nil || snapshot.admits(link.device) != .outsider
    }

    /// To a peer this device dialed that its log does not list: the operations that add this device, and nothing
    /// else of the log. That peer may be a member another admin added concurrently with this device, whose log does
    /// not list this one either; each would otherwise wait for the other forever on a link that is their only path.
    func sendProofOfMembership(context: ChannelHandlerContext) {
        guard let link, report.direction == .outbound, let membership = link.space.snapshot.membership else { return }
        let proof = membership.proofOfMembership(of: engine.identity.nodeID, ops: link.space.snapshot.ops)
            .filter { opsShared.insert($0.hash).inserted }
        for message in PeerMessage.members(chunking: proof, order: membership.order) { send(message, context: context) }
    }

    /// The device at the other end is removed in this side's log: it gets the operations that prove it (its removal
    /// and that operation's past, nothing later) and nothing else. It may still answer with operations that undo the
    /// removal (its own concurrent removal of the remover, by a more senior admin); its `STATE` ends that chance.
    func sendProofOfRemoval(_ snapshot: SharedSpace.Snapshot, context: ChannelHandlerContext) {
        guard let link else { return }
        peerRemoved = true
        let proof = snapshot.proofOfRemoval(of: link.device.nodeID).filter { !opsShared.contains($0.hash) }
        for op in proof { opsShared.insert(op.hash) }
        if !proof.isEmpty { send(.members(proof), context: context) }
        // A peer whose STATE came already has sent its log: the removal is final.
        if peerVector != nil { _ = stillRemoved(context: context) }
    }

    /// Decides about a removed peer: when the log still removes it, counts `revoked`, tells it and closes (returns
    /// true); otherwise the session goes on as with any member (returns false).
    @discardableResult
    func stillRemoved(context: ChannelHandlerContext) -> Bool {
        guard let link else { return true }
        guard link.space.snapshot.admits(link.device) == .revoked else {
            peerRemoved = false
            sendMembers(context: context)
            sendState(context: context)
            return false
        }
        report.reject(.revoked)
        engine.logger.info(
            "Sync refused a removed device", metadata: ["db": "\(link.db.name)", "device": "\(link.device.nodeIDHex)"])
        send(.error(SyncRejection.revoked.rawValue), context: context)
        close(context: context)
        return true
    }

    /// Sends the operations the peer is not known to hold, parents first, in messages of bounded size
    /// (`PeerMessage.members(chunking:order:)`).
    func sendMembers(context: ChannelHandlerContext) {
        guard let link else { return }
        let snapshot = link.space.snapshot
        let fresh = snapshot.ops.values.filter { !opsShared.contains($0.hash) }
        for op in fresh { opsShared.insert(op.hash) }
        for message in PeerMessage.members(chunking: Array(fresh), order: snapshot.membership?.order ?? []) {
            send(message, context: context)
        }
    }

    /// Operations the peer sent were merged (`BatchReceiver`): the peer holds them, and new ones are stored, then
    /// every session of the database hears of them.
    func merged(_ merged: MergedOps) {
        guard let link else { return }
        for op in merged.received { opsShared.insert(op.hash) }
        if !merged.fresh.isEmpty { engine.persist(merged.fresh, space: link.space) }
    }

    /// The space's log changed: close if the peer (or this device) was removed, finish joining once admitted, and
    /// send the peer what it lacks.
    func membershipChanged(context: ChannelHandlerContext) {
        guard let link, !closed else { return }
        // The peer may have become a member (it is asked for chunks from now on) or stopped being one.
        refreshChunkSource(context: context)
        let snapshot = link.space.snapshot
        if snapshot.admits(link.device) == .revoked {
            sendProofOfRemoval(snapshot, context: context)
            return
        }
        if peerRemoved {
            // Operations that arrived since undid the removal.
            stillRemoved(context: context)
            return
        }
        if let me = snapshot.membership?.member(engine.identity.nodeID), !me.isCurrent {
            report.update { $0.lastError = "this device was removed from the space" }
            close(context: context)
            return
        }
        if link.space.joining.withLock({ $0 != nil }) {
            guard snapshot.membership?.member(engine.identity.nodeID)?.isCurrent == true else { return }
            engine.finishJoin(link.space)
        }
        guard servesPeer else { return }
        sendClock(context: context)
        sendMembers(context: context)
        sendState(context: context)
        sendAcks(context: context)
        sendFormats(context: context)
        reconnectForNewKeys(context: context)
    }

    /// The first wait before a session that refused a batch for a reason that may clear ends, and the longest.
    static let refetchFirst: TimeAmount = .seconds(5), refetchMost: TimeAmount = .minutes(30)

    /// The link this session belongs to, as `SyncEngine.refetchBackoff` counts it.
    var refetchKey: String { "\(report.db ?? "-")\u{0}\(report.peer)\u{0}\(link?.device.nodeIDHex ?? "-")" }

    /// This side refused a batch for a reason that may clear (`SyncRejection.mayClear`) and skips its origin for the
    /// rest of the session, while the peer counts it as delivered: the session ends after a wait (5 s, doubling with
    /// each such end in a row on this link, at most 30 min), and the link's next connection exchanges `STATE` afresh,
    /// so the peer sends the batch again.
    func refetchLater(_ reason: SyncRejection, context: ChannelHandlerContext) {
        refusedForNow = true
        // Only for a peer this side serves: anyone else's sessions are not worth ending, or remembering.
        guard refetch == nil, !closed, servesPeer else { return }
        let ends = engine.refetchBackoff.withLock { b -> Int in
            // Links are few; a map this large means keys that never come back, and forgetting them only shortens waits.
            if b.count >= SyncEngine.maxRefetchLinks && b[refetchKey] == nil { b = [:] }
            defer { b[refetchKey, default: 0] += 1 }
            return b[refetchKey] ?? 0
        }
        let wait = min(Self.refetchMost.nanoseconds, Self.refetchFirst.nanoseconds << min(ends, 20))
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        refetch = context.eventLoop.scheduleTask(in: .nanoseconds(wait)) {
            let (session, context) = bound.value
            guard !session.closed else { return }
            session.report.update { $0.lastError = "reconnecting to fetch again entries refused for now (\(reason.rawValue))" }
            session.engine.logger.info(
                "Sync reconnects for entries refused for now",
                metadata: ["db": "\(session.report.db ?? "-")", "peer": "\(session.report.peer)", "reason": "\(reason.rawValue)"])
            session.close(context: context)
        }
    }

    /// This side refused batches it could not open and has received keys since (a `grant`): the peer counts those
    /// entries as delivered, so the session closes and the link's next connection exchanges `STATE` afresh.
    func reconnectForNewKeys(context: ChannelHandlerContext) {
        guard let held = awaitingKeys, let link, !closed, link.key.entryKeyCount > held else { return }
        report.update { $0.lastError = "new epoch keys arrived: reconnecting to fetch entries refused before" }
        engine.logger.info("Sync reconnects for entries it can now open", metadata: ["db": "\(link.db.name)"])
        close(context: context)
    }

    /// A joiner redeems an invite, itself at the other end or through a relay: on success the new operation reaches
    /// it like any other. A refusal is counted; a joiner at the other end is told (`ERROR`) and the connection closes,
    /// while one behind a relay is told only by the admin that issued the invite (`JOIN_REFUSED`, which the relay
    /// passes to the joiner alone): the relay passes every join to every admin, most of which did not issue that
    /// invite, and the link to the relay stays up.
    func redeem(inviteID: [UInt8], device: DevicePublicKeys, proof: [UInt8], context: ChannelHandlerContext) {
        guard let link else { return }
        let (engine, space) = (self.engine, link.space)
        let direct = device == link.device
        // A member admits; a device that is not one ignores what a relay passes it.
        guard direct || space.snapshot.membership?.member(engine.identity.nodeID)?.role == .admin else { return }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let older = direct && link.protocolVersion < Self.formatsFrom
        engine.pool.runIfActive(eventLoop: context.eventLoop) { () throws -> Redemption in
            // A joiner the log lists with these keys already was admitted: its join came again (it reconnected
            // before the operation reached it, or a relay passed it on once more). It gets the log like any member.
            if space.snapshot.membership?.member(device.nodeID)?.keys == device { return .admittedBefore }
            // A device of an earlier build could not open what was sealed in format 3: admitted, it would hold back
            // compaction for every member while it waits for entries it is never sent (SYNC.md §6, "Entry formats").
            if older, try space.db.holdsEntries(newerThan: EntryHeader.version) { return .upgradeRequired }
            do {
                _ = try engine.admit(device: device, inviteID: inviteID, proof: proof, space: space)
                return .admitted
            } catch let refusal as InviteRefusal {
                return .refused(refusal, issuedHere: try direct || space.db.invites().contains { $0.id == inviteID })
            }
        }.whenComplete { result in
            let (session, context) = bound.value
            switch result {
            case .success(.admittedBefore):
                break
            case .success(.admitted):
                engine.logger.info(
                    "Sync admitted a device with an invite", metadata: ["db": "\(space.db.name)", "device": "\(device.nodeIDHex)"])
            case .success(.refused(let refusal, let issuedHere)) where !direct:
                // Most relayed joins name another admin's invite: only the admin that issued this one counts the
                // refusal and tells the joiner through the relay (`JOIN_REFUSED`); a wrong proof says nothing.
                guard issuedHere, refusal == .used || refusal == .expired else { return }
                engine.countInviteRefusal(refusal.rawValue)
                guard !engine.withoutJoinRefusal.withLock({ $0.contains(session.report.peer) }) else { return }
                session.sentJoinRefusal = true
                session.send(.joinRefused(id: inviteID, device: device.signing, reason: refusal), context: context)
            case .success(.upgradeRequired):
                engine.countInviteRefusal("upgrade_required")
                engine.logger.warning(
                    "Sync refused a join: the device speaks an older sync protocol and this space holds entries of format 3",
                    metadata: ["db": "\(space.db.name)", "device": "\(device.nodeIDHex)"])
                session.send(.error(Self.upgradeRequired), context: context)
                session.close(context: context)
            case .success(.refused(let refusal, _)):
                engine.countInviteRefusal(refusal.rawValue)
                engine.logger.warning(
                    "Sync refused an invite",
                    metadata: ["db": "\(space.db.name)", "device": "\(device.nodeIDHex)", "reason": "\(refusal.rawValue)"])
                session.send(.error(refusal.rawValue), context: context)
                session.close(context: context)
            case .failure(let error):
                session.errorCaught(context: context, error: LocalFailure(error))
            }
        }
    }

    /// The admin that issued this device's invite refused it, as a relay passes on: the join fails with that reason.
    /// Anything else (another device's refusal, one for an invite this device is not redeeming, one arriving once the
    /// log lists this device) is ignored.
    func refusedJoin(inviteID: [UInt8], device: [UInt8], reason: InviteRefusal, context: ChannelHandlerContext) {
        guard let link, device == engine.identity.publicKeys.signing,
            link.space.joining.withLock({ $0?.invite.id == inviteID }),
            link.space.snapshot.membership?.member(engine.identity.nodeID) == nil
        else { return }
        report.update { $0.lastError = "the inviting member refused this device: \(reason.rawValue)" }
        engine.failJoin(link.space, reason: reason.rawValue)
    }

    /// What became of a join an admin redeemed.
    enum Redemption: Sendable {
        /// The log lists the device with these keys already.
        case admittedBefore
        /// Added to the log now.
        case admitted
        /// Refused, and whether this device issued the invite.
        case refused(InviteRefusal, issuedHere: Bool)
        /// Not redeemed: the device speaks a protocol before 6 and the space holds entries of format 3.
        case upgradeRequired
    }

    /// What a joiner of an earlier build is told when it is refused for holding back formats (an `ERROR` reason, at
    /// most 200 bytes; its build shows it as "the member refused to admit this device: …"). The invite stays unused.
    static let upgradeRequired =
        "upgrade_required: this space holds entries of entry format 3, which this device's build cannot open; upgrade it, then join again"
}
