import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import BlazeWire
import Foundation
import GRDB
import Logging
import NIOCore
import NIOPosix
import Testing

@testable import BlazeRelay

/// Snapshot uploads through a relay (Protocol/RELAY.md, "What it does"): pieces are staged in its store as they come
/// and kept whole after the last; an upload over the relay's bounds (its size, its window) is declined — its pieces
/// checked and ignored, nothing of it kept — while the connection serves on; an abandoned one leaves nothing staged.
@Suite struct RelaySnapshotUploadTests {
    /// `count` pieces of `size` bytes standing for sealed records (a relay never opens one), chained from the first.
    static func pieces(_ count: Int, size: Int = 64 << 10) throws -> [SnapshotPart] {
        var out: [SnapshotPart] = []
        for i in 0..<count {
            var bytes: [UInt8] = []
            bytes.appendBE(UInt32(i))
            bytes += (out.last?.hash ?? SealedEntry.genesis) + [0, 0, 0, 0] + SpaceKey.randomBytes(12)
            bytes += SpaceKey.randomBytes(size + 16)
            out.append(try SnapshotPart(bytes: bytes))
        }
        return out
    }

    /// The manifest of `parts`, covering nothing in particular, signed by `identity`.
    static func manifest(_ parts: [SnapshotPart], key: SpaceKey, createdMs: UInt64, by identity: DeviceIdentity) -> SnapshotManifest {
        SnapshotManifest(
            space: key.id, createdMs: createdMs, parts: UInt32(parts.count), size: UInt64(parts.reduce(0) { $0 + $1.bytes.count }),
            lastPart: parts.last!.hash, heads: [:], identity: identity)
    }

    /// Sends `message` on `device`'s connection.
    static func send(_ message: PeerMessage, on device: HostileMember) throws { try device.send(try message.encoded()) }

    /// Sends an acknowledgement `device` signs, issued a minute from now (newer than any its daemon sent): the relay
    /// keeps it only if it reads on past what came before it. Returns when it was issued.
    static func acknowledge(on device: HostileMember, key: SpaceKey) throws -> UInt64 {
        let issued = UInt64(Date().timeIntervalSince1970 * 1000) + 60_000
        try send(.acks([Acknowledgement(space: key.id, vector: [:], issuedMs: issued, identity: device.identity)]), on: device)
        return issued
    }

    /// When the acknowledgement of `node` that the relay database `db` keeps was issued.
    static func ackIssued(_ db: any DatabaseReader, node: [UInt8]) throws -> UInt64? {
        try db.read { try Int64.fetchOne($0, sql: "SELECT issued_ms FROM relay_acks WHERE node = ?", arguments: [Data(node)]) }
            .map { UInt64(bitPattern: $0) }
    }

    /// Fails on main before uploads were staged: there, a manifest over 256 MiB was refused and the connection closed.
    @Test func anOversizeSnapshotIsDeclinedAndTheConnectionServesOn() throws {
        let relay = try RelayProcess()
        let (a, ca, capability) = try sharedTeam(servedBy: relay)
        _ = try ca.call("peer.add", ["db": "team", "address": .string(relay.address)])
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "d", "doc": ["v": 1]])
        let na = try nodeID(ca, "team")
        #expect(try eventually { try relay.held()[na] == ownSeq(ca, "team") }, "the relay holds the log and the entries")
        // The daemon leaves the relay: what the relay keeps of its acknowledgements is then what this test sends.
        _ = try ca.call("peer.remove", ["db": "team", "address": .string(relay.address)])
        let key = try RelayCapability(text: capability).key
        let relayDB = try DatabaseQueue(path: relay.dataDir + "/relay.db")
        // The writer's own device key: a relay takes a manifest only from the current writer its connection proved.
        let identity = try DeviceIdentity.loadOrCreate(directory: a.dataDir + "/keys")
        let writer = HostileMember(key: key, identity: identity)
        try writer.connect(port: relay.port, webSocket: "/v1/sync")
        // A snapshot larger than the relay takes (256 MiB; a device takes up to 1 GiB): declined, not refused.
        let parts = try Self.pieces(3)
        let oversize = SnapshotManifest(
            space: key.id, createdMs: 1, parts: 80, size: 300 << 20, lastPart: SpaceKey.randomBytes(32), heads: [:], identity: identity)
        try Self.send(.snapshot(oversize), on: writer)
        for part in parts { try Self.send(.snapshotPart(part), on: writer) }
        // What the device sends after those pieces is taken, in order: the connection serves on.
        let issued = try Self.acknowledge(on: writer, key: key)
        #expect(try eventually { try Self.ackIssued(relayDB, node: identity.nodeID) == issued }, "the relay read on")
        #expect(RelayLimitTests.metric(relay, "blaze_relay_snapshots_dropped_total") == 1, "declined, and counted")
        #expect(try relay.count("relay_snapshot_uploads") == 0, "nothing of it was staged")
        // Its other pieces are still checked against its manifest: one out of place is refused.
        try Self.send(.snapshotPart(parts[1]), on: writer)
        let end = writer.awaitClose(seconds: 20)
        #expect(end.closed && end.error == "bad_snapshot", "a piece out of place is refused, declined or not")

        // On its next connection, one within the relay's bounds is staged and kept whole.
        try writer.connect(port: relay.port, webSocket: "/v1/sync")
        let small = try Self.pieces(3)
        try Self.send(.snapshot(Self.manifest(small, key: key, createdMs: 2, by: identity)), on: writer)
        for part in small { try Self.send(.snapshotPart(part), on: writer) }
        #expect(try eventually { try relay.count("relay_snapshot_parts") == 3 }, "kept")
        #expect(eventually { RelayLimitTests.metric(relay, "blaze_relay_snapshots_kept_total") == 1 })
        #expect(try relay.count("relay_snapshot_uploads") == 0, "kept, its staged pieces went")
        // One abandoned mid-way (its connection closed) leaves nothing staged.
        let abandoned = try Self.pieces(3)
        try Self.send(.snapshot(Self.manifest(abandoned, key: key, createdMs: 3, by: identity)), on: writer)
        try Self.send(.snapshotPart(abandoned[0]), on: writer)
        #expect(try eventually { try relay.count("relay_snapshot_uploads") == 1 }, "its first piece is staged")
        writer.close()
        #expect(try eventually { try relay.count("relay_snapshot_uploads") == 0 }, "and goes with its connection")
        #expect(try relay.count("relay_snapshot_parts") == 3, "the kept snapshot stays")
        // The member syncs on through it.
        _ = try ca.call("peer.add", ["db": "team", "address": .string(relay.address)])
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "e", "doc": ["v": 2]])
        #expect(try eventually { try relay.held()[na] == ownSeq(ca, "team") })
        a.stop()
        relay.stop()
    }

    @Test func aSlowUploadIsDeclinedAtItsWindowAndTheConnectionServesOn() async throws {
        let dir = TempDir()
        let store = try RelayStore(path: dir.path + "/relay.db")
        var limits = SnapshotUploadLimits()
        limits.window = .seconds(1)
        var logger = Logger(label: "relay")
        logger.logLevel = .critical
        let server = RelayServer(
            store: store, identity: DeviceIdentity(), group: MultiThreadedEventLoopGroup.singleton, logger: logger, snapshotUploads: limits)
        let port = try await server.listen(host: "127.0.0.1", port: 0)
        let a = try syncDaemon()
        let ca = try a.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try ca.call("db.share", ["db": "team"])
        let key = try RelayCapability(text: try ca.relayCapability("team")).key
        _ = try await server.add(try RelayCapability(text: try ca.relayCapability("team")))
        _ = try ca.call("peer.add", ["db": "team", "address": .string("ws://127.0.0.1:\(port)/v1/sync")])
        func count(_ table: String) throws -> Int { try store.pool.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM \(table)") ?? 0 } }
        #expect(try await waitUntil { try count("relay_ops") > 0 }, "the relay holds the space's log")
        // The daemon leaves the relay: what the relay keeps of its acknowledgements is then what this test sends.
        _ = try ca.call("peer.remove", ["db": "team", "address": .string("ws://127.0.0.1:\(port)/v1/sync")])

        let identity = try DeviceIdentity.loadOrCreate(directory: a.dataDir + "/keys")
        let writer = HostileMember(key: key, identity: identity)
        try writer.connect(port: port, webSocket: "/v1/sync")
        let parts = try Self.pieces(3)
        try Self.send(.snapshot(Self.manifest(parts, key: key, createdMs: 1, by: identity)), on: writer)
        try Self.send(.snapshotPart(parts[0]), on: writer)
        // Its last piece does not come within the window: declined, and what it staged goes.
        #expect(await waitUntil { server.counters.snapshotsDropped == 1 })
        #expect(try await waitUntil { try count("relay_snapshot_uploads") == 0 })
        // Its late pieces are checked and ignored, not refused; what follows them is taken.
        for part in parts.dropFirst() { try Self.send(.snapshotPart(part), on: writer) }
        let issued = try Self.acknowledge(on: writer, key: key)
        #expect(try await waitUntil { try Self.ackIssued(store.pool, node: identity.nodeID) == issued }, "the relay read on")
        #expect(server.counters.snapshotsKept == 0 && server.counters.rejected["bad_snapshot"] == nil)
        #expect(try count("relay_snapshot_parts") == 0)
        // With every piece it declared in, a piece more has no manifest: refused.
        try Self.send(.snapshotPart(parts[0]), on: writer)
        #expect(writer.awaitClose(seconds: 20).error == "bad_snapshot")
        writer.close()
        a.stop()
        await server.shutdown()
    }
}
