import BlazeCrypto
import BlazeProtocol
import BlazeStore

/// Keys sealed wrong (SYNC.md §9): acknowledgements name the keys their member was sealed but cannot take, and a
/// current admin that holds them seals them to it again, once.
extension SyncEngine {
    /// The keys this device was sealed in `space` and cannot take, for its next acknowledgement.
    func lackingKeys(_ snapshot: SharedSpace.Snapshot) -> [EpochKeyID] {
        guard let membership = snapshot.membership, membership.member(snapshot.node)?.isCurrent == true else { return [] }
        return membership.keysSealedWrong(to: snapshot.node, held: snapshot.held)
    }

    /// When this device is a current admin, seals to each current member whose acknowledgement in `acks` names keys
    /// it was sealed and lacks those of them this device holds, in one `grant`, never twice the same key to the same
    /// member (whatever it asks, a member gets at most one envelope per key from each admin). Returns whether it
    /// made one. Runs on the I/O pool.
    func resealLacking(space: SharedSpace, acks: [Acknowledgement]) throws -> Bool {
        guard acks.contains(where: { !$0.lacking.isEmpty }) else { return false }
        let snapshot = space.snapshot
        guard let membership = snapshot.membership, let me = membership.member(identity.nodeID), me.isCurrent,
            me.role == .admin
        else { return false }
        var sealedByMe = Set<[UInt8]>()
        for op in snapshot.ops.values where op.author == identity.publicKeys {
            for e in op.envelopes { sealedByMe.insert(Self.sealing(e.recipient, e.epoch, e.keyOp == KeyEnvelope.thisOp ? op.hash : e.keyOp)) }
        }
        var envelopes: [KeyEnvelope] = []
        for ack in acks where ack.space == space.id {
            guard let m = membership.member(ack.node), m.isCurrent, m.keys.signing == ack.deviceKey else { continue }
            for key in ack.lacking where envelopes.count < Self.maxGrantEnvelopes && membership.sealed(key, to: ack.node) {
                let tag = Self.sealing(ack.node, key.epoch, key.op)
                guard let secret = snapshot.held[key], !sealedByMe.contains(tag) else { continue }
                envelopes.append(try KeyEnvelope(sealing: secret, space: space.id, epoch: key.epoch, keyOp: key.op, to: m.keys))
                sealedByMe.insert(tag)
            }
        }
        guard !envelopes.isEmpty else { return false }
        try recordGrant(envelopes, space: space)
        logger.warning(
            "Sync sealed epoch keys again to members that could not take the ones another admin sealed them",
            metadata: ["db": "\(space.db.name)", "envelopes": "\(envelopes.count)"])
        return true
    }

    private static func sealing(_ recipient: [UInt8], _ epoch: UInt32, _ keyOp: [UInt8]) -> [UInt8] {
        var out = recipient
        out.appendBE(epoch)
        return out + keyOp
    }
}
