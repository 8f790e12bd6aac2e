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
