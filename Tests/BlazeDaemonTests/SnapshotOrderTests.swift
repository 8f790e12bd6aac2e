import BlazeCrypto
import BlazeTestSupport
import Foundation
import Testing

/// A snapshot's manifest comes before its pieces (SYNC.md §11): a daemon refuses a piece with no accepted manifest at
/// the first one, checks each piece as it comes, stages them on disk, and deletes the staging file when the snapshot
/// fails or the connection closes.
@Suite struct SnapshotOrderTests {
    /// The snapshot staging files in the daemon's data directory.
    static func staged(_ t: SyncTarget) -> [String] {
        let names = FileManager.default.enumerator(atPath: t.node.dir.path)?.allObjects as? [String] ?? []
        return names.filter { $0.contains(".snapshot-staging-") }
    }

    /// Three chained pieces of made-up records, sealed with the space's key.
    static func pieces(_ key: SpaceKey) -> [SnapshotPart] {
        var parts: [SnapshotPart] = []
        for i in 0..<3 {
            parts.append(
                SnapshotPart.seal(SpaceKey.randomBytes(600), index: UInt32(i), prev: parts.last?.hash ?? SealedEntry.genesis, key: key))
        }
        return parts
    }

    /// A manifest signed by `m`, covering entries of its own the daemon lacks.
    static func manifest(_ m: HostileMember, _ key: SpaceKey, parts: UInt32, size: Int, last: [UInt8]) -> [UInt8] {
        let manifest = SnapshotManifest(
            space: key.id, createdMs: UInt64(HostileMember.clockNow()), parts: parts, size: UInt64(size), lastPart: last,
            heads: [m.identity.nodeID: (seq: 5, hash: SpaceKey.randomBytes(32))], identity: m.identity)
        return [9] + manifest.bytes
    }

    /// A member (here: any holder of a legacy space's key) that sends a snapshot piece before any manifest is refused
    /// at that piece, and the daemon goes on serving.
    @Test func piecesWithoutAManifestAreRefusedAtTheFirst() throws {
        let t = try SyncTarget()
        let m = try t.member()
        try m.send([8] + Self.pieces(t.key)[0].bytes)
        let end = m.awaitClose(seconds: 20)
        #expect(end.closed, "the connection closes at the first piece")
        #expect(end.error == "bad_snapshot")
        #expect(Self.staged(t).isEmpty)
        try t.expectServing()
        m.close()
    }

    /// A chain broken mid-way (a piece naming the wrong previous hash, more pieces than the manifest counts, a last
    /// piece that never comes) is refused or dropped, and its staging file is gone afterwards.
    @Test func aBrokenChainIsRefusedAndItsStagingFileGoes() throws {
        let t = try SyncTarget()
        let p = Self.pieces(t.key)
        let size = p.reduce(0) { $0 + $1.bytes.count }
        let wrongPrev = SnapshotPart.seal(SpaceKey.randomBytes(600), index: 1, prev: SealedEntry.genesis, key: t.key)
        // (manifest's pieces, its declared size, what is sent after the first piece, whether the sender just leaves)
        let cases: [(parts: UInt32, size: Int, then: [SnapshotPart], leaves: Bool)] = [
            (3, size, [wrongPrev], false),
            // Two pieces counted, a third named as the last: the second, the last by count, is not it.
            (2, size, [p[1], p[2]], false),
            (3, size, [p[1]], true),
        ]
        for c in cases {
            let m = try t.member()
            try m.send(Self.manifest(m, t.key, parts: c.parts, size: c.size, last: p[2].hash))
            try m.send([8] + p[0].bytes)
            #expect(eventually(timeout: .seconds(20)) { Self.staged(t).count == 1 }, "the first piece is staged on disk")
            // The daemon may close the connection before the last is written.
            for part in c.then { try? m.send([8] + part.bytes) }
            if c.leaves {
                m.close()
            } else {
                let end = m.awaitClose(seconds: 20)
                #expect(end.closed && end.error == "bad_snapshot", "refused: \(c.parts) pieces, then \(c.then.map(\.index))")
                m.close()
            }
            #expect(eventually(timeout: .seconds(20)) { Self.staged(t).isEmpty }, "the staging file is deleted")
        }
        try t.expectServing()
    }

    /// A manifest covering nothing the daemon lacks is refused before any piece is taken.
    @Test func aManifestCoveringNothingNewIsRefusedBeforeAnyPiece() throws {
        let t = try SyncTarget()
        let m = try t.member()
        let manifest = SnapshotManifest(
            space: t.key.id, createdMs: UInt64(HostileMember.clockNow()), parts: 1, size: 1_000, lastPart: SpaceKey.randomBytes(32),
            heads: [:], identity: m.identity)
        try m.send([9] + manifest.bytes)
        let end = m.awaitClose(seconds: 20)
        #expect(end.closed && end.error == "bad_snapshot")
        #expect(Self.staged(t).isEmpty)
        m.close()
    }

    /// A staging file a crash left is deleted when the database next opens.
    @Test func aStagingFileLeftByACrashIsDeletedAtOpen() throws {
        let t = try SyncTarget()
        let m = try t.member()
        let p = Self.pieces(t.key)
        try m.send(Self.manifest(m, t.key, parts: 3, size: p.reduce(0) { $0 + $1.bytes.count }, last: p[2].hash))
        try m.send([8] + p[0].bytes)
        #expect(eventually(timeout: .seconds(20)) { Self.staged(t).count == 1 })
        // Killed while the connection is open: nothing deletes the file before the daemon starts again.
        try t.restart(kill9: true)
        m.close()
        try t.expectServing()
        #expect(Self.staged(t).isEmpty)
    }
}
