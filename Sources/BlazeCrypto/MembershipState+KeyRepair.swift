import BlazeProtocol

/// Keys sealed wrong (SYNC.md §9, "Keys sealed wrong"): a member that an envelope sealed a key it cannot take says
/// so in its acknowledgement, and any current admin holding the key seals it to that member again.
extension MembershipState {
    /// The keys applied operations sealed to the device `node` that `held` lacks: an envelope it could not open, or one
    /// sealing another key than its operation committed to (an admin handing it a key the others do not hold).
    public func keysSealedWrong(to node: [UInt8], held: [EpochKeyID: [UInt8]]) -> [EpochKeyID] {
        let created = Set(epochKeys)
        var out = Set<EpochKeyID>()
        for (envelope, key) in envelopes where envelope.recipient == node && created.contains(key) && held[key] == nil {
            out.insert(key)
        }
        return Array(out)
    }

    /// Whether an applied operation sealed `key` to the device `node` (so that device may ask for it again).
    public func sealed(_ key: EpochKeyID, to node: [UInt8]) -> Bool {
        envelopes.contains { $0.envelope.recipient == node && $0.key == key }
    }
}

/// What a device shows a peer that does not list it yet (SYNC.md §9, "Relay capability").
extension MembershipState {
    /// The operations that prove `device` was added, from `ops` (this log's, by hash): the applied `add` of it (or the
    /// `create`, for the creator) and all that operation's past, nothing later. Empty when the log does not list it.
    public func proofOfMembership(of device: [UInt8], ops: [EntryHash: MembershipOp]) -> [MembershipOp] {
        guard
            let added = applied.compactMap({ ops[$0] }).first(where: {
                switch $0.action {
                case .add(let d, _): return d.nodeID == device
                case .create: return $0.author.nodeID == device
                default: return false
                }
            })
        else { return [] }
        return Self.withPast(added, ops: ops)
    }

    /// `root` and every operation of `ops` in its past, by hash: what proves it took effect.
    static func withPast(_ root: MembershipOp, ops: [EntryHash: MembershipOp]) -> [MembershipOp] {
        var proof: [EntryHash: MembershipOp] = [:]
        var next = [root]
        while let op = next.popLast() {
            guard proof.updateValue(op, forKey: op.hash) == nil else { continue }
            next += op.parents.compactMap { ops[$0] }
        }
        return proof.values.sorted { $0.hash < $1.hash }
    }
}
