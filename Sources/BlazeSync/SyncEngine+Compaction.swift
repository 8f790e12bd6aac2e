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
        try db.sealLocal(key: snapshot.key, identity: identity, membership: snapshot.membership)
        if try db.compactor.issueAcknowledgement(space: space.id, identity: identity, nowMs: now, lacking: lackingKeys(snapshot)) {
            membershipChanged(db: db.name)
        }
        guard let membership = snapshot.membership else {
            return CompactionOutcome(report: try db.compact(stable: VersionVector(), defragment: defragment), stable: VersionVector())
        }
        let (computed, strictComputed, silent) = try db.compactor.stableVector(
            membership: membership, self: identity.nodeID, nowMs: now, horizonMs: horizonMs)
        let stable = try computed.map { try db.recordStableVector($0) } ?? db.lastStableVector()
        let strict = try strictComputed.map { try db.recordStableVector($0, key: "strict_stable_vector") }
            ?? db.lastStableVector(key: "strict_stable_vector")
        return CompactionOutcome(
            report: try db.compact(stable: stable, tombstonesStable: strict, defragment: defragment), stable: stable,
            silentMembers: silent)
    }
}
