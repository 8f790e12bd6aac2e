import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import Foundation

/// What compacting one database did, and the stable vector it used.
public struct CompactionOutcome: Sendable {
    /// What was removed.
    public var report: CompactionReport
    /// The stable vector compaction went up to (for a database nobody shares: everything it applied).
    public var stable: VersionVector
    /// Current members whose acknowledgement is missing or older than the horizon (they hold stability back, or
    /// were left out of it past the horizon), by node id hex.
    public var silentMembers: [String] = []
}

/// Acknowledgements and stability (SYNC.md §11) on top of the store.
extension BlazeDatabase {
    /// Signs and keeps this device's acknowledgement when what it applied changed since its last one; true when it
    /// issued one.
    public func issueAcknowledgement(
        space: [UInt8], identity: DeviceIdentity, nowMs: UInt64, lacking: [EpochKeyID] = []
    ) throws -> Bool {
        let applied = try versionVector()
        let mine = try acknowledgements().first { $0.node == identity.nodeID }
        let vector = Dictionary(uniqueKeysWithValues: applied.entries.map { ($0.key.bytes, $0.value) })
        let ack = Acknowledgement(
            space: space, vector: vector, issuedMs: max(nowMs, (mine?.issuedMs ?? 0) + 1), identity: identity, lacking: lacking)
        if let mine, let held = try? Acknowledgement(bytes: mine.bytes), held.vector == vector, held.lacking == ack.lacking {
            return false
        }
        return try storeAcknowledgement(node: ack.node, issuedMs: ack.issuedMs, bytes: ack.bytes)
    }

    /// Keeps the acknowledgements of `space` signed by devices its log lists; true when any was newer than the one
    /// held. A space without a log keeps none: nothing is stable there (SYNC.md §11), and any holder of its capability
    /// could sign them under keys of its own, without bound.
    public func keep(_ acks: [Acknowledgement], space: [UInt8], membership: MembershipState?) throws -> Bool {
        guard let membership else { return false }
        var kept = false
        for ack in acks where ack.space == space {
            guard let m = membership.member(ack.node), m.keys.signing == ack.deviceKey else { continue }
            if try storeAcknowledgement(node: ack.node, issuedMs: ack.issuedMs, bytes: ack.bytes) { kept = true }
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
        let applied = try versionVector()
        var latest: [[UInt8]: Acknowledgement] = [:]
        for held in try acknowledgements() {
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

extension SyncEngine {
    /// How long a member may stay silent before stability stops waiting for it (SYNC.md §11).
    public static let defaultHorizonMs: UInt64 = 30 * 24 * 3_600_000

    /// Compacts `db` (Protocol/SYNC.md §11). A database nobody shares: everything it applied is stable. A shared
    /// one: this device issues its acknowledgement (passed on to every connected peer), the stable vector is computed
    /// from the members' latest ones, and compaction goes up to it; without a membership log only op-log bodies whose
    /// entries are held are dropped.
    /// With `defragment`, a fragmented file is also rewritten (`BlazeDatabase.compact`).
    public func compact(db: BlazeDatabase, horizonMs: UInt64 = SyncEngine.defaultHorizonMs, defragment: Bool = false) throws
        -> CompactionOutcome
    {
        // A snapshot built before (or while it runs) may be followed by entries this compaction drops.
        snapshots.forget(db: db.name)
        defer { snapshots.forget(db: db.name) }
        guard let space = try space(db: db) else {
            let stable = try db.versionVector()
            return CompactionOutcome(report: try db.compact(stable: stable, defragment: defragment), stable: stable)
        }
        let snapshot = space.snapshot
        let now = nowMsUnsigned()
        // Sealed, this device's changes can be pruned like any other's (their entries then go once stable).
        try db.sealLocal(key: snapshot.key, identity: identity)
        if try db.issueAcknowledgement(space: space.id, identity: identity, nowMs: now, lacking: lackingKeys(snapshot)) {
            membershipChanged(db: db.name)
        }
        guard let membership = snapshot.membership else {
            return CompactionOutcome(report: try db.compact(stable: VersionVector(), defragment: defragment), stable: VersionVector())
        }
        let (computed, strictComputed, silent) = try db.stableVector(
            membership: membership, self: identity.nodeID, nowMs: now, horizonMs: horizonMs)
        let stable = try computed.map { try db.recordStableVector($0) } ?? db.lastStableVector()
        let strict = try strictComputed.map { try db.recordStableVector($0, key: "strict_stable_vector") }
            ?? db.lastStableVector(key: "strict_stable_vector")
        return CompactionOutcome(
            report: try db.compact(stable: stable, tombstonesStable: strict, defragment: defragment), stable: stable,
            silentMembers: silent)
    }
}
