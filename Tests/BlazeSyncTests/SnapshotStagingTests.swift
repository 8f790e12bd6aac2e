import BlazeCrypto
import BlazeStore
import BlazeWire
import Foundation
import Testing

@testable import BlazeSync

/// A snapshot received is staged on disk piece by piece (`SnapshotStaging`, SYNC.md §11): each piece checked against
/// the manifest accepted first, installed by reading the pieces back one at a time, and its file and disk reservation
/// gone once it ends, however it ends.
@Suite struct SnapshotStagingTests {
    let key = SpaceKey.generate()

    func source() throws -> (SyncReplica, SealedSnapshot) {
        let a = try SyncReplica(key: key)
        try a.insert(60)
        let snapshot = try #require(try a.db.makeSnapshot(key: key, identity: a.identity, partBytes: 500))
        #expect(snapshot.parts.count >= 3)
        #expect(snapshot.manifest.size == UInt64(snapshot.byteCount))
        return (a, snapshot)
    }

    @Test func aStagedSnapshotInstallsFromDiskAndItsFileGoes() throws {
        let (a, snapshot) = try source()
        let c = try SyncReplica(key: key)
        let budget = MemoryBudget(limit: 1 << 30)
        let staging = try SnapshotStaging(manifest: snapshot.manifest, db: c.db, budget: budget)
        #expect(FileManager.default.fileExists(atPath: staging.path))
        for part in snapshot.parts {
            #expect(!staging.complete)
            try staging.append(part, key: key)
        }
        #expect(staging.complete)
        _ = try c.db.install(snapshot: snapshot.manifest, key: key, membership: nil, records: try staging.reader())
        staging.remove()
        #expect(try c.db.stateHash() == a.db.stateHash())
        #expect(!FileManager.default.fileExists(atPath: staging.path))
        // Its reservation came back: the whole budget is free again.
        #expect(budget.reserve(1 << 30))
    }

    @Test func aBrokenChainIsRefusedPieceByPiece() throws {
        let (_, snapshot) = try source()
        let c = try SyncReplica(key: key)
        let budget = MemoryBudget(limit: 1 << 30)
        let p = snapshot.parts
        // A piece out of place, naming the wrong previous hash, or the last by count but not the one named.
        let cases: [(SnapshotManifest, [SnapshotPart], SnapshotPart)] = [
            (snapshot.manifest, [], p[1]),
            (snapshot.manifest, [p[0]], SnapshotPart.seal([1, 2, 3], index: 1, prev: SealedEntry.genesis, key: key)),
            (
                SnapshotManifest(
                    space: key.id, createdMs: 1, parts: 2, size: snapshot.manifest.size, lastPart: p[2].hash, heads: [:],
                    identity: DeviceIdentity()), [p[0]], p[1]
            ),
            // More bytes than the manifest declares.
            (
                SnapshotManifest(
                    space: key.id, createdMs: 1, parts: snapshot.manifest.parts, size: UInt64(p[0].bytes.count), lastPart: p.last!.hash,
                    heads: [:], identity: DeviceIdentity()), [p[0]], p[1]
            ),
        ]
        for (manifest, before, bad) in cases {
            let staging = try SnapshotStaging(manifest: manifest, db: c.db, budget: budget)
            for part in before { try staging.append(part, key: key) }
            #expect(throws: SyncRejection.badSnapshot) { try staging.append(bad, key: key) }
            #expect(!staging.complete)
            staging.remove()
            #expect(!FileManager.default.fileExists(atPath: staging.path))
        }
        // A piece after the file was removed (the session ended) is not written anywhere.
        let staging = try SnapshotStaging(manifest: snapshot.manifest, db: c.db, budget: budget)
        staging.remove()
        #expect(throws: StagingFailure.self) { try staging.append(p[0], key: key) }
        #expect(budget.reserve(1 << 30))
    }

    @Test func stagingIsBoundedOnDiskPerDatabaseAndInAll() throws {
        let (_, snapshot) = try source()
        let c = try SyncReplica(key: key)
        let size = Int(snapshot.manifest.size)
        let budget = MemoryBudget(limit: 3 * size, perKey: 2 * size)
        let first = try SnapshotStaging(manifest: snapshot.manifest, db: c.db, budget: budget)
        let second = try SnapshotStaging(manifest: snapshot.manifest, db: c.db, budget: budget)
        #expect(throws: StagingFull.self) { try SnapshotStaging(manifest: snapshot.manifest, db: c.db, budget: budget) }
        first.remove()
        first.remove()
        let third = try SnapshotStaging(manifest: snapshot.manifest, db: c.db, budget: budget)
        second.remove()
        third.remove()
        #expect(budget.reserve(3 * size - 1, for: c.db.name) == false, "at most the per-database share")
        #expect(budget.reserve(2 * size, for: c.db.name))
    }
}
