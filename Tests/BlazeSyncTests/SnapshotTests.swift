// Snapshots and the sealed log under compaction: pruned entries leave chain heads, and devices that lack what was
// pruned catch up from a snapshot. Compaction of the store itself is tested in BlazeStoreTests.

import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeSync
import Testing

@testable import BlazeStore

/// Opens a sealed snapshot's pieces in order, as a receiver does.
func openedParts(_ snapshot: SealedSnapshot, key: SpaceKey) throws -> [[UInt8]] {
    var prev = SealedEntry.genesis
    return try snapshot.parts.enumerated().map { i, part in
        defer { prev = part.hash }
        return try BlazeDatabase.openSnapshotPart(part, expected: UInt32(i), prev: prev, key: key)
    }
}

/// Installs `snapshot` into `replica` as a session would.
@discardableResult
func install(_ snapshot: SealedSnapshot, into replica: SyncReplica, key: SpaceKey) throws -> ReceiveReport {
    try replica.db.install(
        snapshot: snapshot.manifest, records: try openedParts(snapshot, key: key), lastHash: snapshot.parts.last!.hash, key: key,
        membership: nil)
}

@Suite struct SnapshotTests {
    let key = SpaceKey.generate()

    /// Both members hold everything, so everything is stable: the sealed entries go (each origin keeps its chain head),
    /// a new device gets a snapshot instead of the history, and entries written afterwards link to the kept heads
    /// on every device, old and new, in both directions.
    @Test func prunedEntriesLeaveAChainHeadAndANewDeviceJoinsFromASnapshot() throws {
        let a = try SyncReplica(key: key), b = try SyncReplica(key: key)
        try a.insert(45)
        for i in 0..<10 { _ = try a.db.apply(.delete(collection: "c", id: "d\(i)")) }
        _ = try a.db.write { tx in try tx.createIndex(collection: "c", fields: ["n"], name: "byN") }
        try b.insert(10, from: 100)
        try pull(b, from: a, key: key)
        try pull(a, from: b, key: key)
        let both = try a.db.versionVector()
        #expect(try b.db.versionVector() == both)
        let report = try a.db.compact(stable: both)
        #expect(report.entries == 66 && report.tombstones == 10)
        #expect(try rowCount(a.db, "sync_entries") == 0 && rowCount(a.db, "tombstones") == 0)
        #expect(try a.db.prunedHeads()[a.db.node]?.seq == 56)
        // A new device cannot have the history any more…
        let c = try SyncReplica(key: key)
        #expect(throws: StoreError.self) { try a.db.entryBatch(origin: a.db.node, after: 0, maxEntries: 100) }
        // …it gets the state.
        let snapshot = try #require(try a.db.makeSnapshot(key: key, identity: a.identity, partBytes: 1000))
        #expect(snapshot.parts.count > 1)
        try install(snapshot, into: c, key: key)
        #expect(try c.db.stateHash() == a.db.stateHash())
        #expect(try c.db.versionVector() == both)
        #expect(try c.db.indexes().map(\.name) == ["byN"])
        #expect(try c.db.find(FindQuery(collection: "c", filter: try Filter.parse(["n": 44]))).docs.count == 1)
        // What follows links to the kept heads, whoever compacted.
        try a.insert(3, from: 200)
        try b.insert(2, from: 300)
        try pull(c, from: a, key: key)
        try pull(c, from: b, key: key)
        try pull(b, from: a, key: key)
        try c.insert(4, from: 400)
        try pull(a, from: c, key: key)
        try pull(b, from: c, key: key)
        try pull(a, from: b, key: key)
        let hashes = try [a, b, c].map { try $0.db.stateHash() }
        #expect(Set(hashes).count == 1)
        let vectors = try [a, b, c].map { try $0.db.versionVector() }
        #expect(vectors.allSatisfy { $0 == vectors[0] })
        #expect(try c.db.summary().documents == 35 + 10 + 3 + 2 + 4)
    }

    /// A device that was offline while the others compacted past what it holds installs a snapshot: its own changes
    /// that nobody has seen yet are applied again on top, and reach the others afterwards.
    @Test func aLaggingDeviceKeepsItsOwnUnsentChangesAcrossASnapshot() throws {
        let a = try SyncReplica(key: key), d = try SyncReplica(key: key)
        try a.insert(5)
        try pull(d, from: a, key: key)
        // D goes offline and writes; A writes more and compacts (D left out: past the horizon).
        _ = try d.db.apply(.patch(collection: "c", id: "d0", incr: ["hits": 2]))
        _ = try d.db.apply(.put(collection: "c", id: "offline", doc: ["by": "d"]))
        try a.insert(5, from: 5)
        _ = try a.db.apply(.patch(collection: "c", id: "d0", incr: ["hits": 1]))
        try a.db.sealLocal(key: key, identity: a.identity)
        try a.db.compact(stable: try a.db.versionVector())
        #expect(throws: StoreError.self) { try pull(d, from: a, key: key) }
        let snapshot = try #require(try a.db.makeSnapshot(key: key, identity: a.identity))
        let report = try install(snapshot, into: d, key: key)
        #expect(report.applied == 2)
        #expect(try d.db.get(collection: "c", id: "offline")["by"] == "d")
        #expect(try d.db.get(collection: "c", id: "d0")["hits"] == .int(3))
        // The install rewrote the versions: D's next change follows its own last one.
        #expect(try d.db.committedVersionsMatchTheTable())
        let own = try d.db.versionVector()[d.db.node]
        _ = try d.db.apply(.put(collection: "c", id: "after", doc: ["by": "d"]))
        #expect(try d.db.versionVector()[d.db.node] == own + 1 && d.db.committedVersionsMatchTheTable())
        try pull(a, from: d, key: key)
        #expect(try a.db.stateHash() == d.db.stateHash())
        #expect(try a.db.versionVector() == d.db.versionVector())
        // The same snapshot again covers nothing D lacks: refused.
        #expect(throws: SyncRejection.badSnapshot) { try install(snapshot, into: d, key: key) }
    }

    /// A snapshot is refused whole for any damage: an altered, missing or reordered piece, a manifest that does not
    /// end the pieces received, one signed for another space, a header that is not the one signed, or an author who
    /// is not a writing member. Nothing of a refused snapshot is installed.
    @Test func aDamagedOrForeignSnapshotInstallsNothing() throws {
        let a = try SyncReplica(key: key), c = try SyncReplica(key: key)
        try a.insert(30)
        let snapshot = try #require(try a.db.makeSnapshot(key: key, identity: a.identity, partBytes: 500))
        #expect(snapshot.parts.count >= 3)
        var flipped = snapshot.parts[1].bytes
        flipped[flipped.count - 30] ^= 1
        #expect(throws: SyncRejection.badSnapshot) { try SnapshotPart(bytes: flipped).open(with: key) }
        #expect(throws: SyncRejection.badSnapshot) {
            try BlazeDatabase.openSnapshotPart(snapshot.parts[2], expected: 1, prev: snapshot.parts[0].hash, key: key)
        }
        #expect(throws: SyncRejection.badSnapshot) {
            try BlazeDatabase.openSnapshotPart(snapshot.parts[1], expected: 1, prev: SealedEntry.genesis, key: key)
        }
        #expect(throws: SyncRejection.badSnapshot) { try snapshot.parts[0].open(with: SpaceKey.generate()) }
        var records = try openedParts(snapshot, key: key)
        let last = snapshot.parts.last!.hash
        #expect(throws: SyncRejection.badSnapshot) {
            try c.db.install(snapshot: snapshot.manifest, records: Array(records.dropLast()), lastHash: snapshot.parts[snapshot.parts.count - 2].hash, key: key, membership: nil)
        }
        let other = SpaceKey.generate()
        #expect(throws: SyncRejection.badSnapshot) {
            try c.db.install(snapshot: snapshot.manifest, records: records, lastHash: last, key: other, membership: nil)
        }
        var manifestBytes = snapshot.manifest.bytes
        manifestBytes[60] ^= 1
        #expect(throws: SyncRejection.badSnapshot) { try SnapshotManifest(bytes: manifestBytes) }
        // A header (first record) other than the signed heads, and a document record with an invalid state.
        var header = records[0]
        let cut = header.firstIndex(of: 0x0A)!
        header.replaceSubrange(0..<cut, with: Array(#"{"h":null,"v":[]}"#.utf8))
        #expect(throws: SyncRejection.badSnapshot) {
            try c.db.install(snapshot: snapshot.manifest, records: [header] + records.dropFirst(), lastHash: last, key: key, membership: nil)
        }
        records[records.count - 1] += Array(#"{"d":["c","evil",{"l":1},null,null,null]}"#.utf8) + [0x0A]
        #expect(throws: SyncRejection.badSnapshot) {
            try c.db.install(snapshot: snapshot.manifest, records: records, lastHash: last, key: key, membership: nil)
        }
        #expect(try c.db.summary().documents == 0 && c.db.versionVector().entries.isEmpty)
        // An author the log does not list as a writing member.
        let creator = DeviceIdentity()
        let create = try MembershipOp(
            space: key.id, author: creator, timeMs: 1, parents: [], action: .create(salt: SpaceKey.randomBytes(16)))
        let membership = MembershipState(space: key.id, ops: [create])
        #expect(throws: SyncRejection.badSnapshot) {
            try c.db.install(snapshot: snapshot.manifest, records: try openedParts(snapshot, key: key), lastHash: last, key: key, membership: membership)
        }
        try install(snapshot, into: c, key: key)
        #expect(try c.db.stateHash() == a.db.stateHash())
    }
}
