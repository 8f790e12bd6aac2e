import BlazeProtocol
import BlazeCrypto
import BlazeWire
import NIOCore

/// What a device may fetch from the relay (Protocol/RELAY.md, "Who fetches what"). The capability only lets a device
/// in; in a space with a log, what it then gets depends on who it proved to be in the handshake.
enum RelayAccess: Equatable {
    /// A current member the log lists with the keys it proved (or any device of a space without a log): entries,
    /// operations, acknowledgements and snapshots.
    case member
    /// A device the log removed: the operations that prove it (its removal and that operation's past), nothing else.
    case removed
    /// Anyone else holding the capability (a joiner, a stranger with a fresh key, a removed device under a new key):
    /// it may ask to join and hear its join refused; it gets nothing until the log lists it.
    case outsider

    /// The access of `device` in a space resolved as `membership` (nil: the relay holds no log of it).
    static func of(_ device: DevicePublicKeys?, in membership: MembershipState?) -> RelayAccess {
        guard let membership else { return .member }
        guard let device, let m = membership.member(device.nodeID), m.keys == device else { return .outsider }
        return m.isCurrent ? .member : .removed
    }
}

extension RelayConnection {
    /// Sends what the device may have of the log as it is now (the operations it lacks, or the proof of its removal)
    /// and, when it has just become a member (admitted, or the operations it sent list it), starts serving it.
    func sendMembers(space: SpaceID, context: ChannelHandlerContext) {
        run(context: context, { relay in try await relay.heldLog(space) }) { connection, held, context in
            let (ops, membership) = (held?.ops ?? [], held?.state)
            let before = connection.access
            connection.access = .of(connection.device, in: membership)
            let fresh: [MembershipOp]
            switch connection.access {
            case .member: fresh = ops.filter { !connection.opsShared.contains($0.hash) }
            case .outsider: fresh = []
            case .removed:
                let byHash = Dictionary(ops.map { ($0.hash, $0) }, uniquingKeysWith: { a, _ in a })
                fresh = (membership?.proofOfRemoval(of: connection.device?.nodeID ?? [], ops: byHash) ?? [])
                    .filter { !connection.opsShared.contains($0.hash) }
            }
            for op in fresh { connection.opsShared.insert(op.hash) }
            for message in PeerMessage.members(chunking: fresh, order: membership?.order ?? []) {
                connection.send(message, context: context)
            }
            guard connection.access == .member else { return }
            if membership != nil, let device = connection.device { connection.relay.listed(connection.place, device: device) }
            if before != .member { connection.startServing(space: space, context: context) }
            connection.pump(space: space, context: context)
        }
    }

    /// Starts serving a member: the relay's `STATE`, then the acknowledgements and statements of entry formats it
    /// holds.
    func startServing(space: SpaceID, context: ChannelHandlerContext) {
        // Its clock, once, to a member on protocol 5 or later: a device the log does not list learns nothing.
        if protocolVersion >= 5, !clockSent {
            clockSent = true
            send(.clock(ms: UInt64(max(0, RelayServer.nowMs()))), context: context)
        }
        run(context: context, { try await $0.store.vector(space: space) }) { connection, vector, context in
            connection.send(.state(vector: vector, ownHead: nil), context: context)
            connection.sendHeldAcks(space: space, context: context)
            connection.sendHeldFormats(space: space, context: context)
        }
    }
}
