import BlazeCrypto
import BlazeProtocol
import NIOCore

/// A connection's part in joins through the relay (Protocol/RELAY.md, "Joins"). A relay admits no one: it holds a
/// joiner's request (which carries no secret, only a proof bound to the joiner's keys) and passes it to the space's
/// current admins, connected now or later, on any relay process; the issuing admin's refusal goes back to the
/// joiner's connection alone.
extension RelayConnection {
    /// The device asks to join: held for as long as this connection stays open. Once per connection, only for the
    /// key the device proved in the handshake (a connection cannot ask for another device), and only while the log
    /// does not list it.
    func hold(invite: [UInt8], joiner: DevicePublicKeys, proof: [UInt8], space: SpaceID, context: ChannelHandlerContext) {
        guard let device, joiner == device, let listener, !holdsJoin else { return }
        let join = HeldJoin(
            invite: invite, device: joiner, proof: proof, holder: "\(relay.instance) \(listener)",
            expiresMs: RelayServer.nowMs() + RelayServer.joinLifetimeMs)
        holdsJoin = true
        let relay = self.relay
        holding = Task(executorPreference: relay.executor) {
            do {
                guard try await relay.membership(space)?.member(joiner.nodeID) == nil else { return }
                try await relay.hold(join, space: space)
            } catch {
                relay.logger.warning("Relay could not hold a join", metadata: ["error": "\(error)"])
            }
        }
    }

    /// The device refuses a join, in order with what it sent before: passed on to the joiner's connection, on
    /// whichever process holds it, when the device is a current admin the log lists with the key it proved, the
    /// reason is one only the issuing admin gives (a used or expired invite), and the log does not list the joiner
    /// (admitted meanwhile). Otherwise it is ignored. Reading goes on once it is handled.
    func refuse(invite: [UInt8], joiner: [UInt8], reason: InviteRefusal, space: SpaceID, context: ChannelHandlerContext) {
        let device = self.device
        run(context: context, { relay -> Bool in
            guard reason == .used || reason == .expired, let device, let membership = try await relay.membership(space),
                let admin = membership.member(device.nodeID), admin.isCurrent, admin.role == .admin, admin.keys == device,
                !membership.members.values.contains(where: { $0.keys.signing == joiner })
            else { return false }
            return try await relay.refuse(invite: invite, device: joiner, reason: reason, space: space)
        }) { connection, _, context in
            connection.storing = false
            connection.resumeReading(context: context)
            connection.storeNext(space: space, context: context)
        }
    }

    /// The space's joins as held now: a current admin is sent those it was not sent yet whose device the log does not
    /// list; a joiner is sent the refusal of its own, which is then dropped, and a joiner the log lists now drops its
    /// join.
    func passOn(_ joins: [HeldJoin], membership: MembershipState?, context: ChannelHandlerContext) {
        guard let device, case .established(let space) = state else { return }
        if holdsJoin, membership?.member(device.nodeID) != nil {
            // Admitted: its join is done.
            dropHeldJoin(space: space)
        } else if let mine = joins.first(where: { $0.device == device }), let refusal = mine.refusal {
            send(.joinRefused(id: mine.invite, device: device.signing, reason: refusal), context: context)
            run(context: context, { try await $0.store.dropJoin(space: space, device: device.signing, holder: mine.holder) }) {
                connection, _, _ in connection.holdsJoin = false
            }
            return
        }
        guard let membership, let me = membership.member(device.nodeID), me.isCurrent, me.role == .admin, me.keys == device
        else { return }
        for join in joins where join.refusal == nil && membership.member(join.device.nodeID) == nil {
            guard joinsSent.insert(join.invite + join.device.signing).inserted else { continue }
            send(.join(id: join.invite, device: join.device, proof: join.proof), context: context)
        }
        // What was sent and is held no more is forgotten, so the set stays within the space's joins.
        let held = Set(joins.map { $0.invite + $0.device.signing })
        joinsSent.formIntersection(held)
    }

    /// Drops the join this connection holds, once it closes (a joiner that reconnects sends it again), or once it is
    /// done; after the store holds it, if it was still being stored.
    func dropHeldJoin(space: SpaceID) {
        guard holdsJoin, let device, let listener else { return }
        holdsJoin = false
        let (relay, holder, holding) = (self.relay, "\(relay.instance) \(listener)", self.holding)
        Task(executorPreference: relay.executor) {
            await holding?.value
            do {
                try await relay.store.dropJoin(space: space, device: device.signing, holder: holder)
            } catch {
                relay.logger.warning("Relay could not drop a closed connection's join (it expires)", metadata: ["error": "\(error)"])
            }
        }
    }
}
