import BlazeProtocol
import Crypto

/// The epoch keys a member holds from a resolved log (SYNC.md §9, "Epoch keys"): the envelopes sealed to it, each
/// taken only as its key's operation committed to it, and the secrets of combined epochs.
extension MembershipState {
    /// The epoch keys `identity` can open from the envelopes addressed to it, plus `initial` (the space's secret at
    /// epoch 1, which the creator and legacy members hold already).
    public func keys(for identity: DeviceIdentity, initial: [UInt8]? = nil) -> [EpochKeyID: [UInt8]] {
        var opened: [KeyEnvelope: [UInt8]] = [:]
        return keys(for: identity, initial: initial, opened: &opened)
    }

    /// `keys(for:initial:)` with the envelopes `identity` opened before, each with what it opened to (empty when it
    /// did not open): an envelope is opened with HPKE once, however often the log is resolved again.
    public func keys(for identity: DeviceIdentity, initial: [UInt8]? = nil, opened: inout [KeyEnvelope: [UInt8]]) -> [EpochKeyID: [UInt8]] {
        var out: [EpochKeyID: [UInt8]] = [:]
        if let initial, let genesis = epochKeys.first(where: { $0.epoch == 1 }), commits(initial, to: genesis) {
            out[genesis] = initial
        }
        let created = Set(epochKeys)
        // Once: a device identity derives its node id from its private key (an Ed25519 scalar multiplication).
        let me = identity.nodeID
        for (envelope, key) in envelopes where envelope.recipient == me && out[key] == nil && created.contains(key) {
            // Only keys an applied operation created are taken (an envelope naming any other operation, or its own
            // `add` or `grant`, delivers nothing), and a key its operation committed to only as committed: an envelope
            // sealing another one (an admin handing this member a key the others do not hold) is ignored. What an
            // envelope opened to is recorded, not whether it committed: the same envelope bytes (one naming its own
            // operation binds no operation hash) can sit in two operations committing to different keys.
            let secret = opened[envelope] ?? envelope.open(space: space, identity: identity) ?? []
            opened[envelope] = secret
            if !secret.isEmpty, commits(secret, to: key) { out[key] = secret }
        }
        return out
    }

    /// Whether `secret` is the key `key` names, as far as its operation committed to it (true without a commitment).
    func commits(_ secret: [UInt8], to key: EpochKeyID) -> Bool {
        commitments[key].map { $0 == KeyEnvelope.commitment(secret: secret, space: space, epoch: key.epoch) } ?? true
    }

    /// The secret of the current epoch from `keys`, nil when one of its parts is missing. Concurrent latest keys are
    /// combined (HKDF over their secrets in the order of their operations' hashes), so only a device that received
    /// every one of them, a member of all their recipient sets, can seal or read the combined epoch.
    public func currentSecret(_ keys: [EpochKeyID: [UInt8]]) -> [UInt8]? {
        combined(frontier, keys)
    }

    /// The secret of the epoch that `latest` keys seal under, nil when one of its parts is missing from `keys`.
    func combined(_ latest: [EpochKeyID], _ keys: [EpochKeyID: [UInt8]]) -> [UInt8]? {
        guard !latest.isEmpty else { return nil }
        var parts: [UInt8] = []
        for k in latest {
            guard let secret = keys[k] else { return nil }
            parts += secret
        }
        if latest.count == 1 { return parts }
        var info = Array("blazedb combined epoch v1".utf8)
        info.appendBE(Self.epoch(of: latest))
        return HKDF<SHA256>.deriveKey(inputKeyMaterial: SymmetricKey(data: parts), salt: space.bytes, info: info, outputByteCount: 32)
            .withUnsafeBytes { Array($0) }
    }

    /// Every (epoch, secret) that opens entries, from `keys`: each key, and each combination whose parts are all held.
    public func ring(_ keys: [EpochKeyID: [UInt8]]) -> [(epoch: Epoch, secret: [UInt8])] {
        var out = keys.sorted { $0.key.op < $1.key.op }.map { ($0.key.epoch, $0.value) }
        for set in combinations {
            if let secret = combined(set, keys) { out.append((Self.epoch(of: set), secret)) }
        }
        return out
    }
}
