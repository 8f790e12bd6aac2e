import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
@testable import BlazeRelay
import BlazeTestSupport
import BlazeWire
import Foundation
import GRDB
import Logging
import NIOPosix
import PostgresNIO
import Testing

/// Snapshots in the relay's store (SYNC.md §11, RELAY.md "What it does", "Storage"): pieces staged per upload as they
/// come, kept whole in one transaction as the space's snapshot, the bases it leaves, how it is served, and what an
/// upload that does not end leaves (nothing).
extension RelayStoreTests {
    @Test(arguments: Backend.allCases) func aMembersSnapshotBecomesTheBaseLaterEntriesLinkToAndIsServedAsUploaded(
        backend: Backend
    ) async throws {
        let temp = try await TempRelay(backend)
        let relay = temp.store
        _ = try await relay.add(RelayCapability(key: key))
        let admin = try Writer(key: key), stranger = try Writer(key: key)
        let log = try adminLog(admin.identity)
        try admin.write(30, key: key)
        func batch(after: UInt64) throws -> EntryBatch {
            try #require(try admin.db.entryBatch(origin: admin.origin, after: after, maxEntries: 10))
        }
        #expect(try await relay.store(try batch(after: 0), space: key.id, membership: log) == 10)
        let upTo20 = try batch(after: 10)
        let p = pieces([300, 200])
        let (p0, p1) = (p[0], p[1])
        let head20: [[UInt8]: (seq: UInt64, hash: [UInt8])] = [admin.origin.bytes: (20, upTo20.entries.last!.hash)]
        let manifest = self.manifest([p0, p1], createdMs: 1_000, heads: head20, by: admin.identity)
        let byStranger = self.manifest([p0, p1], createdMs: 1_000, heads: head20, by: stranger.identity)
        // Its manifest, before any piece: signed by the writer the connection proved, declaring a size its pieces can
        // hold (the relay's size limit is the connection's to apply: a larger one is declined, not refused).
        let adminKeys = admin.identity.publicKeys, strangerKeys = stranger.identity.publicKeys
        try RelayRules.checkManifest(manifest, space: key.id, membership: log, device: adminKeys)
        #expect(throws: SyncRejection.badSnapshot) { try RelayRules.checkManifest(byStranger, space: key.id, membership: log, device: strangerKeys) }
        #expect(throws: SyncRejection.badSnapshot) { try RelayRules.checkManifest(manifest, space: key.id, membership: log, device: strangerKeys) }
        #expect(throws: SyncRejection.badSnapshot) { try RelayRules.checkManifest(manifest, space: key.id, membership: log, device: nil) }
        #expect(throws: SyncRejection.badSnapshot) { try RelayRules.checkManifest(manifest, space: SpaceID(bytes: random(16))!, membership: log, device: adminKeys) }
        let overstated = SnapshotManifest(
            space: key.id, createdMs: 1_000, parts: 2, size: 2 * UInt64(SnapshotPart.maxBytes) + 1, lastPart: p1.hash, heads: head20,
            identity: admin.identity)
        #expect(throws: SyncRejection.badSnapshot) { try RelayRules.checkManifest(overstated, space: key.id, membership: log, device: adminKeys) }
        // Its pieces, each before it is written: in order, chained, no more than it counts, the last the one it names.
        func take(_ parts: [SnapshotPart], _ manifest: SnapshotManifest) throws(SyncRejection) -> Bool {
            var upload = SnapshotUpload(manifest: manifest, startedMs: 0)
            for part in parts { _ = try upload.take(part) }
            return upload.complete
        }
        #expect(throws: SyncRejection.badSnapshot) { try take([p1], manifest) }
        #expect(throws: SyncRejection.badSnapshot) { try take([p0, p0], manifest) }
        #expect(throws: SyncRejection.badSnapshot) { try take([p0, p1, p1], manifest) }
        let unlinked = SnapshotPart.seal(random(200), index: 1, prev: random(32), key: key)
        #expect(throws: SyncRejection.badSnapshot) { try take([p0, unlinked], manifest) }
        let short = self.manifest([p0, p1], createdMs: 1_000, heads: head20, by: admin.identity, size: UInt64(p0.bytes.count + 10))
        #expect(throws: SyncRejection.badSnapshot, "more bytes than it declares") { try take([p0, p1], short) }
        #expect(try !take([p0], manifest))
        #expect(try take([p0, p1], manifest))
        #expect(try await keep(manifest, [p0, p1], in: relay))
        // The entries held below what it covers are gone; the base stands for them.
        #expect(try await relay.bases(space: key.id) == [admin.origin: PrunedHead(seq: 20, hash: upTo20.entries.last!.hash)])
        #expect(try await relay.vector(space: key.id) == [admin.origin: 20])
        #expect(try await relay.usage(space: key.id).entries == 0)
        #expect(try await relay.batch(space: key.id, origin: admin.origin, after: 0, maxEntries: 100, maxBytes: 1 << 20) == nil)
        // Entries at or below the base cannot be checked: refused. The next ones link to it.
        await #expect(throws: SyncRejection.brokenChain) { try await relay.store(upTo20, space: key.id, membership: log) }
        let after20 = try batch(after: 20)
        #expect(try await relay.store(after20, space: key.id, membership: log) == 10)
        #expect(try await relay.vector(space: key.id) == [admin.origin: 30])
        let served = try await relay.batch(space: key.id, origin: admin.origin, after: 20, maxEntries: 100, maxBytes: 1 << 20)
        #expect(served?.entries.map(\.hash) == after20.entries.map(\.hash))
        // Served exactly as uploaded.
        #expect(try await relay.snapshotManifest(space: key.id) == manifest)
        #expect(try await relay.snapshotPart(space: key.id, index: 0) == p0)
        #expect(try await relay.snapshotPart(space: key.id, index: 1) == p1)
        #expect(try await relay.snapshotPart(space: key.id, index: 2) == nil)
        // Not replaced by one as old, nor by one covering less than the base.
        #expect(try await !keep(manifest, [p0, p1], in: relay))
        let q = pieces([100])
        let lower = self.manifest(q, createdMs: 2_000, heads: [admin.origin.bytes: (10, try batch(after: 0).entries.last!.hash)], by: admin.identity)
        #expect(try await !keep(lower, q, in: relay))
        #expect(try await relay.snapshotManifest(space: key.id) == manifest)
        #expect(try await relay.dropSnapshotUploads(startedBefore: .max) == 0, "a keep leaves nothing staged, kept or not")
        // Retention drops it with the rest.
        #expect(try await relay.expire(idleBefore: Int64(Date().timeIntervalSince1970 * 1000) + 60_000) == [key.id])
        #expect(try await relay.snapshotManifest(space: key.id) == nil)
        #expect(try await relay.bases(space: key.id).isEmpty)
        #expect(try await relay.snapshotPart(space: key.id, index: 0) == nil)
    }

    @Test(arguments: Backend.allCases) func uploadsAreStagedApartKeptWholeAndDroppedWhenAbandonedOrStale(backend: Backend) async throws {
        let temp = try await TempRelay(backend)
        let relay = temp.store
        _ = try await relay.add(RelayCapability(key: key))
        let writer = DeviceIdentity()
        let now = RelayServer.nowMs()
        // Two uploads of one space at once (two connections), their pieces interleaved: neither takes the other's.
        let (a, b) = (pieces([300, 200, 100]), pieces([150, 250]))
        let (ua, ub) = (SpaceKey.randomBytes(16), SpaceKey.randomBytes(16))
        for (part, upload) in [(a[0], ua), (b[0], ub), (a[1], ua), (b[1], ub), (a[2], ua)] {
            try await relay.stageSnapshotPart(part, upload: upload, space: key.id, startedMs: now)
        }
        let (ma, mb) = (manifest(a, createdMs: 1_000, by: writer), manifest(b, createdMs: 2_000, by: writer))
        #expect(try await relay.keepSnapshot(ma, upload: ua, space: key.id))
        for i in 0..<4 { #expect(try await relay.snapshotPart(space: key.id, index: UInt32(i)) == a[safe: i]) }
        // The later one replaces it whole: no piece of the first is left beside it.
        #expect(try await relay.keepSnapshot(mb, upload: ub, space: key.id))
        #expect(try await relay.snapshotManifest(space: key.id) == mb)
        for i in 0..<3 { #expect(try await relay.snapshotPart(space: key.id, index: UInt32(i)) == b[safe: i]) }
        #expect(try await relay.dropSnapshotUploads(startedBefore: .max) == 0)

        let c = pieces([100, 120])
        let mc = manifest(c, createdMs: 3_000, by: writer)
        // Not every piece staged: not kept, and what was staged goes with it.
        let uc = SpaceKey.randomBytes(16)
        try await relay.stageSnapshotPart(c[0], upload: uc, space: key.id, startedMs: now)
        #expect(try await !relay.keepSnapshot(mc, upload: uc, space: key.id))
        try await relay.stageSnapshotPart(c[1], upload: uc, space: key.id, startedMs: now)
        #expect(try await !relay.keepSnapshot(mc, upload: uc, space: key.id), "its first piece went with the failed keep")
        // Pieces of another space, or other than the bytes the manifest declares: not kept.
        let other = SpaceKey.generate()
        _ = try await relay.add(RelayCapability(key: other))
        let elsewhere = try await stage(c, space: other.id, in: relay, startedMs: now)
        #expect(try await !relay.keepSnapshot(mc, upload: elsewhere, space: key.id))
        let misstated = manifest(c, createdMs: 3_000, by: writer, size: UInt64(c[0].bytes.count + c[1].bytes.count + 1))
        #expect(try await !relay.keepSnapshot(misstated, upload: try await stage(c, space: key.id, in: relay, startedMs: now), space: key.id))
        // An abandoned upload (declined, or its connection closed) is dropped: nothing of it is left to keep.
        let abandoned = try await stage(c, space: key.id, in: relay, startedMs: now)
        try await relay.dropSnapshotUpload(abandoned)
        #expect(try await !relay.keepSnapshot(mc, upload: abandoned, space: key.id))
        #expect(try await relay.snapshotManifest(space: key.id) == mb)
        #expect(try await relay.dropSnapshotUploads(startedBefore: .max) == 0, "nothing staged is left behind")
        // By age: what an upload begun before the cutoff staged goes (a process that stopped mid-way left it; others
        // may share the store); a recent one's pieces stay, and are kept.
        let (stale, recent) = (SpaceKey.randomBytes(16), SpaceKey.randomBytes(16))
        for part in c {
            try await relay.stageSnapshotPart(part, upload: stale, space: key.id, startedMs: now - 20 * 60_000)
            try await relay.stageSnapshotPart(part, upload: recent, space: key.id, startedMs: now)
        }
        #expect(try await relay.dropSnapshotUploads(startedBefore: now - 10 * 60_000) == 2)
        #expect(try await !relay.keepSnapshot(mc, upload: stale, space: key.id))
        #expect(try await relay.keepSnapshot(mc, upload: recent, space: key.id))
        #expect(try await relay.snapshotPart(space: key.id, index: 1) == c[1])
    }

    @Test(arguments: Backend.allCases) func aRelayStartingDropsWhatStoppedUploadsLeftAndNothingRecent(backend: Backend) async throws {
        let temp = try await TempRelay(backend)
        let relay = temp.store
        _ = try await relay.add(RelayCapability(key: key))
        let c = pieces([100, 120, 140])
        let now = RelayServer.nowMs()
        for part in c {
            try await relay.stageSnapshotPart(part, upload: [1], space: key.id, startedMs: now - 60 * 60_000)
        }
        try await relay.stageSnapshotPart(c[0], upload: [2], space: key.id, startedMs: now)
        var logger = Logger(label: "relay-test")
        logger.logLevel = .critical
        let server = RelayServer(store: relay, identity: DeviceIdentity(), group: MultiThreadedEventLoopGroup.singleton, logger: logger)
        _ = try await server.listen(host: "127.0.0.1", port: 0)
        await server.shutdown()
        #expect(try await relay.dropSnapshotUploads(startedBefore: .max) == 1, "the recent upload's piece stayed")
    }

    /// A relay database made before uploads were staged (SQLite at migration v5; PostgreSQL without the table) gains
    /// the staging table when the relay opens it, and uploads go through.
    @Test(arguments: Backend.allCases) func anExistingRelayDatabaseGainsTheStagingTable(backend: Backend) async throws {
        let temp = try await TempRelay(backend)
        _ = try await temp.store.add(RelayCapability(key: key))
        var logger = Logger(label: "relay-test")
        logger.logLevel = .critical
        let reopened: any RelayBackend
        if let store = temp.store as? RelayStore {
            try await store.pool.write { db in
                try db.execute(sql: "DROP TABLE relay_snapshot_uploads")
                try db.execute(sql: "DELETE FROM grdb_migrations WHERE identifier = 'v6'")
            }
            reopened = try RelayStore(path: store.pool.path)
        } else {
            let store = try #require(temp.store as? PostgresRelayStore)
            _ = try await store.client.query("DROP TABLE relay_snapshot_uploads", logger: logger)
            let url = try #require(temp.server?.url)
            reopened = try await PostgresRelayStore(configuration: try PostgresRelayStore.configuration(url: url), logger: logger)
        }
        defer { (reopened as? PostgresRelayStore)?.close() }
        let c = pieces([100, 120])
        let mc = manifest(c, createdMs: 1_000, by: DeviceIdentity())
        #expect(try await keep(mc, c, in: reopened))
        #expect(try await reopened.snapshotPart(space: key.id, index: 1) == c[1])
    }

    // MARK: Helpers

    /// Random bytes: what the relay cannot open stands for sealed records.
    func random(_ n: Int) -> [UInt8] { SpaceKey.randomBytes(n) }

    /// Pieces of records of `sizes` bytes, sealed and chained as a snapshot's.
    func pieces(_ sizes: [Int]) -> [SnapshotPart] {
        var out: [SnapshotPart] = []
        for (i, size) in sizes.enumerated() {
            out.append(SnapshotPart.seal(random(size), index: UInt32(i), prev: out.last?.hash ?? SealedEntry.genesis, key: key))
        }
        return out
    }

    /// The manifest of `parts` signed by `identity` (declaring `size`, else their bytes).
    func manifest(
        _ parts: [SnapshotPart], createdMs: UInt64, heads: [[UInt8]: (seq: UInt64, hash: [UInt8])] = [:], by identity: DeviceIdentity,
        size: UInt64? = nil
    ) -> SnapshotManifest {
        SnapshotManifest(
            space: key.id, createdMs: createdMs, parts: UInt32(parts.count), size: size ?? UInt64(parts.reduce(0) { $0 + $1.bytes.count }),
            lastPart: parts.last!.hash, heads: heads, identity: identity)
    }

    /// Stages `parts` as a new upload of `space`; returns its id.
    func stage(_ parts: [SnapshotPart], space: SpaceID, in relay: any RelayBackend, startedMs: Int64) async throws -> [UInt8] {
        let upload = SpaceKey.randomBytes(16)
        for part in parts { try await relay.stageSnapshotPart(part, upload: upload, space: space, startedMs: startedMs) }
        return upload
    }
}

/// Stages `parts` as one upload, then keeps `manifest` with them, as a relay connection does.
func keep(_ manifest: SnapshotManifest, _ parts: [SnapshotPart], in relay: any RelayBackend) async throws -> Bool {
    let upload = SpaceKey.randomBytes(16)
    for part in parts { try await relay.stageSnapshotPart(part, upload: upload, space: manifest.space, startedMs: RelayServer.nowMs()) }
    return try await relay.keepSnapshot(manifest, upload: upload, space: manifest.space)
}

extension Array {
    /// The element at `i`, nil past the end.
    subscript(safe i: Int) -> Element? { indices.contains(i) ? self[i] : nil }
}
