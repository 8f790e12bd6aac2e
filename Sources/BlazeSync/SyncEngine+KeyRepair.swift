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
        let asking = acks.filter { !$0.lacking.isEmpty && $0.space == space.id }
        guard !asking.isEmpty else { return false }
        // One repair at a time, each from the state as it is then: two computed at once would seal a key twice.
        return try grantLock.withLock { _ in
            let snapshot = space.snapshot
            guard let membership = snapshot.membership, let me = membership.member(identity.nodeID), me.isCurrent,
                me.role == .admin
            else { return false }
            // What is asked, from current members signing with their listed keys, of keys this device holds and an
            // applied operation sealed to the asker; only then what this device sealed already (a scan of its own).
            var wanted: [(member: Member, key: EpochKeyID, secret: [UInt8])] = []
            for ack in asking {
                guard let m = membership.member(ack.node), m.isCurrent, m.keys.signing == ack.deviceKey else { continue }
                for key in ack.lacking {
                    if let secret = snapshot.held[key], membership.sealed(key, to: ack.node) { wanted.append((m, key, secret)) }
                }
            }
            guard !wanted.isEmpty else { return false }
            var sealedByMe = Set<[UInt8]>()
            for op in snapshot.ops.values where op.author == identity.publicKeys {
                for e in op.envelopes {
                    sealedByMe.insert(Self.sealing(e.recipient, e.epoch, e.keyOp == KeyEnvelope.thisOp ? op.hash : e.keyOp))
                }
            }
            var envelopes: [KeyEnvelope] = []
            for (member, key, secret) in wanted where envelopes.count < Self.maxGrantEnvelopes {
                guard sealedByMe.insert(Self.sealing(member.keys.nodeID, key.epoch, key.op)).inserted else { continue }
                envelopes.append(try KeyEnvelope(sealing: secret, space: space.id, epoch: key.epoch, keyOp: key.op, to: member.keys))
            }
            guard !envelopes.isEmpty else { return false }
            try recordGrant(envelopes, space: space)
            logger.warning(
                "Sync sealed epoch keys again to members that could not take the ones another admin sealed them",
                metadata: ["db": "\(space.db.name)", "envelopes": "\(envelopes.count)"])
            return true
        }
    }

    private static func sealing(_ recipient: [UInt8], _ epoch: Epoch, _ keyOp: EntryHash) -> [UInt8] {
        var out = recipient
        out.appendBE(epoch)
        return out + keyOp.bytes
    }
}
