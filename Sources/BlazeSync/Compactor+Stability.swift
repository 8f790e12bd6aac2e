import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import Foundation

/// Acknowledgements and stability (SYNC.md §11): what compaction may drop, decided on top of the store's `Compactor`.
extension Compactor {
    /// Signs and keeps this device's acknowledgement when what it applied changed since its last one; true when it
    /// issued one.
    public func issueAcknowledgement(
        space: SpaceID, identity: DeviceIdentity, nowMs: UInt64, lacking: [EpochKeyID] = []
    ) throws -> Bool {
        let applied = try database.versionVector()
        let mine = try database.acknowledgements().first { $0.node == identity.nodeID }
        let vector = Dictionary(uniqueKeysWithValues: applied.entries.map { ($0.key.bytes, $0.value) })
        let ack = Acknowledgement(
            space: space, vector: vector, issuedMs: max(nowMs, (mine?.issuedMs ?? 0) + 1), identity: identity, lacking: lacking)
        if let mine, let held = try? Acknowledgement(bytes: mine.bytes), held.vector == vector, held.lacking == ack.lacking {
            return false
        }
        return try database.storeAcknowledgement(node: ack.node, issuedMs: ack.issuedMs, bytes: ack.bytes)
    }

    /// Keeps the acknowledgements of `space` signed by devices its log lists; true when any was newer than the one
    /// held. A space without a log keeps none: nothing is stable there (SYNC.md §11), and any holder of its capability
    /// could sign them under keys of its own, without bound.
    public func keep(_ acks: [Acknowledgement], space: SpaceID, membership: MembershipState?) throws -> Bool {
        guard let membership else { return false }
        var kept = false
        for ack in acks where ack.space == space {
            guard let m = membership.member(ack.node), m.keys.signing == ack.deviceKey else { continue }
            if try database.storeAcknowledgement(node: ack.node, issuedMs: ack.issuedMs, bytes: ack.bytes) { kept = true }
        }
        return kept
    }

    /// The stable vector (SYNC.md §11): the minimum of the current members' latest acknowledgements, provided this
    /// replica applied everything each of them had authored when it acknowledged. A member not heard from holds
    /// stability at zero, unless it has been silent past `horizonMs` (since its last acknowledgement, or since it
    /// was added): it is then left out, and must re-join from a snapshot. Nil while the condition fails (the caller
    /// keeps the last stable vector).
    ///
    /// `strict` is the same without the horizon, and with every removed member's accepted entries (up to its removal's
    /// cutoff) applied here: the vector tombstones may go up to, since a late change concurrent with a delete would
    /// otherwise revive its document only where the tombstone is gone.
    public func stableVector(membership: MembershipState, self node: [UInt8], nowMs: UInt64, horizonMs: UInt64) throws
        -> (stable: VersionVector?, strict: VersionVector?, silent: [String])
    {
        let applied = try database.versionVector()
        var latest: [[UInt8]: Acknowledgement] = [:]
        for held in try database.acknowledgements() {
            if let ack = try? Acknowledgement(bytes: held.bytes) { latest[ack.node] = ack }
        }
        var acknowledged: [NodeID: VersionVector] = [:]
        var everyone: [NodeID: VersionVector] = [:]
        var silent: [String] = []
        for member in membership.current {
            let id = member.keys.nodeID
            if id == node {
                acknowledged[NodeID(bytes: id)] = applied
                everyone[NodeID(bytes: id)] = applied
                continue
            }
            let ack = latest[id].flatMap { $0.deviceKey == member.keys.signing ? $0 : nil }
            var vector: [NodeID: UInt64] = [:]
            for (origin, seq) in ack?.vector ?? [:] { vector[NodeID(bytes: origin)] = seq }
            everyone[NodeID(bytes: id)] = VersionVector(vector)
            let lastHeard = ack?.issuedMs ?? member.addedAtMs
            if nowMs > lastHeard, nowMs - lastHeard > horizonMs {
                silent.append(hexString(id))
                continue
            }
            if ack == nil { silent.append(hexString(id)) }
            acknowledged[NodeID(bytes: id)] = VersionVector(vector)
        }
        var strict = Stability.stableVector(acknowledged: everyone, applied: applied)
        for member in membership.members.values {
            if let cutoff = member.removal?.cutoff, applied[NodeID(bytes: member.keys.nodeID)] < cutoff { strict = nil }
        }
        return (Stability.stableVector(acknowledged: acknowledged, applied: applied), strict, silent.sorted())
    }
}

/// The calls other files make through the database (forwarded to `Compactor`).
extension BlazeDatabase {
    /// Signs and keeps this device's acknowledgement when what it applied changed (`Compactor.issueAcknowledgement`).
    public func issueAcknowledgement(
        space: SpaceID, identity: DeviceIdentity, nowMs: UInt64, lacking: [EpochKeyID] = []
    ) throws -> Bool {
        try compactor.issueAcknowledgement(space: space, identity: identity, nowMs: nowMs, lacking: lacking)
    }

    /// Keeps the acknowledgements of `space` signed by listed devices (`Compactor.keep`).
    public func keep(_ acks: [Acknowledgement], space: SpaceID, membership: MembershipState?) throws -> Bool {
        try compactor.keep(acks, space: space, membership: membership)
    }

    /// The stable vector, its strict form and the silent members (`Compactor.stableVector`).
    public func stableVector(membership: MembershipState, self node: [UInt8], nowMs: UInt64, horizonMs: UInt64) throws
        -> (stable: VersionVector?, strict: VersionVector?, silent: [String])
    {
        try compactor.stableVector(membership: membership, self: node, nowMs: nowMs, horizonMs: horizonMs)
    }
}
