import BlazeCrypto
import Synchronization

/// Snapshots a member built for peers that lack entries compacted away (SYNC.md §11), kept for `lifetime` per
/// database: however many sessions ask meanwhile — a capability holder presenting an empty `STATE` on connection
/// after connection — a database builds at most one snapshot per `lifetime`. A compaction of the database forgets
/// its snapshot (the entries after it may be gone).
final class SnapshotCache: Sendable {
    /// A snapshot as sessions send it: its manifest, its pieces' encoded messages and their bytes.
    struct Built: Sendable {
        let manifest: SnapshotManifest
        let messages: [[UInt8]]
        let byteCount: Int
        let at: ContinuousClock.Instant
    }

    /// How long a built snapshot is reused.
    static let lifetime: Duration = .seconds(60)
    private let held = Mutex<[String: Built]>([:])
    /// Serializes builds, so that sessions asking at once wait for one build instead of each making their own.
    private let building = Mutex<Void>(())

    /// The snapshot of `db` built less than `lifetime` ago, else the one `build` makes now (nil: none can be made);
    /// snapshots past their lifetime are dropped on the way.
    func snapshot(db: String, now: ContinuousClock.Instant = .now, build: () throws -> Built?) rethrows -> Built? {
        try building.withLock { _ in
            let fresh = held.withLock { all -> Built? in
                all = all.filter { now - $0.value.at < Self.lifetime }
                return all[db]
            }
            if let fresh { return fresh }
            guard let built = try build() else { return nil }
            held.withLock { $0[db] = built }
            return built
        }
    }

    /// Forgets the snapshot of `db` (compacted, or dropped).
    func forget(db: String) { _ = held.withLock { $0.removeValue(forKey: db) } }

    /// Drops snapshots past their lifetime.
    func expire(now: ContinuousClock.Instant = .now) { held.withLock { $0 = $0.filter { now - $0.value.at < Self.lifetime } } }
}
