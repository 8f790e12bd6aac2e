import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeTestSupport
import Foundation
import Logging
import NIOCore
import NIOPosix
import Testing

@testable import BlazeSync

/// A device in one process: identity, store, sync engine on loopback.
final class Device: @unchecked Sendable {
    // @unchecked: set up in init and replaced only by `restart`, which the one test task driving the device calls.
    let dir = NSTemporaryDirectory() + "blazesync-\(UUID().uuidString)"
    let identity = DeviceIdentity()
    private(set) var store: Store
    private(set) var engine: SyncEngine
    private(set) var pool = NIOThreadPool(numberOfThreads: 2)
    var port = 0

    init() throws {
        pool.start()
        (store, engine) = try Self.open(dir: dir, identity: identity, pool: pool)
    }

    private static func open(dir: String, identity: DeviceIdentity, pool: NIOThreadPool) throws -> (Store, SyncEngine) {
        let store = try Store(directory: dir, node: NodeID(bytes: identity.nodeID))
        var logger = Logger(label: "test.sync")
        logger.logLevel = .critical
        let engine = SyncEngine(
            store: store, identity: identity, keysDirectory: dir + "/keys/spaces", group: MultiThreadedEventLoopGroup.singleton,
            pool: pool, logger: logger)
        return (store, engine)
    }

    /// Listens on a loopback port outside the kernel's ephemeral range (`StablePorts`), so `restart` gets it back.
    func listen() async throws {
        for attempt in 1...20 {
            do {
                port = try await engine.listen(host: "127.0.0.1", port: StablePorts.next())
                return
            } catch let error as IOError where attempt < 20 && error.errnoCode == EADDRINUSE {
                continue
            }
        }
    }

    /// Stops sync and closes the store, then opens both again from the same directory and listens on the same port,
    /// as the daemon starts: spaces loaded, then the listener, then links to the configured peers.
    func restart() async throws {
        await engine.shutdown()
        // Work the old engine queued (stores of what it received) finishes before its store closes.
        try? await pool.shutdownGracefully()
        store.closeAll()
        pool = NIOThreadPool(numberOfThreads: 2)
        pool.start()
        (store, engine) = try Self.open(dir: dir, identity: identity, pool: pool)
        engine.loadSpaces()
        if port != 0 { port = try await engine.listen(host: "127.0.0.1", port: port) }
        engine.start()
    }

    func close() async {
        await engine.shutdown()
        try? await pool.shutdownGracefully()
        store.closeAll()
        try? FileManager.default.removeItem(atPath: dir)
    }
}

@Suite(.serialized) struct SyncEngineTests {
    @Test func twoDevicesSyncBothWaysOverOneConnection() async throws {
        let a = try Device(), b = try Device()
        try await a.listen()
        let dbA = try a.store.create("notes")
        for i in 0..<250 { _ = try dbA.apply(.put(collection: "c", id: "a\(i)", doc: ["n": .int(Int64(i))])) }
        _ = try a.engine.share(db: dbA)
        let invite = try a.engine.invite(db: dbA, role: .writer, expiresInMs: 60_000, address: nil).token
        let dbB = try b.engine.join(token: invite, name: "mine")
        #expect(try dbB.peers() == ["127.0.0.1:\(a.port)"], "joining keeps the inviting member as a peer")
        #expect(try eventually { try dbB.summary().documents == 250 })
        // Live in both directions.
        _ = try dbB.apply(.put(collection: "c", id: "fromB", doc: ["x": 1]))
        _ = try dbA.apply(.patch(collection: "c", id: "a1", set: ["n": 1000]))
        #expect(try eventually { try dbA.stateHash() == dbB.stateHash() && dbA.summary().documents == 251 })
        let statusB = b.engine.status(db: dbB)
        #expect(statusB.count == 1 && statusB[0].connected && statusB[0].receivedEntries >= 251 && statusB[0].sentEntries >= 1)
        #expect(statusB[0].rejected.isEmpty)
        let statusA = a.engine.status(db: dbA)
        #expect(statusA.first?.direction == .inbound && statusA.first?.connected == true)
        await b.close()
        await a.close()
    }

    /// A request that started before its database was dropped holds the old handle: the space it loads from it is not
    /// served again, and a database made anew under the name is not shared.
    @Test func aDroppedDatabaseIsNotServedAgainFromAStaleHandle() async throws {
        let d = try Device()
        let db = try d.store.create("team")
        _ = try d.engine.share(db: db)
        #expect(d.engine.servedSpaces().count == 1)
        try d.store.drop("team")
        d.engine.forget(db: "team", spaceID: nil)
        #expect(throws: StoreError.self) { try d.engine.space(db: db) }
        #expect(d.engine.servedSpaces().isEmpty)
        let again = try d.store.create("team")
        #expect(try d.engine.space(db: again) == nil)
        #expect(d.engine.servedSpaces().isEmpty)
        await d.close()
    }

    /// Dropping a database drops the blob keys derived for it, shared or not: no secret of a dropped space stays in
    /// memory, and the keys of the databases that remain stay.
    @Test func droppingADatabaseDropsItsBlobKeys() async throws {
        let d = try Device()
        let local = try d.store.create("local")
        let localKeys = try d.engine.blobKeys(db: local)
        let shared = try d.store.create("team")
        let space = try d.engine.share(db: shared).space
        let sharedKeys = try d.engine.blobKeys(db: shared)
        #expect(sharedKeys.space.hex == space)
        #expect(SyncEngine.holdsBlobKeys(space: localKeys.space) && SyncEngine.holdsBlobKeys(space: sharedKeys.space))
        try d.store.drop("local")
        d.engine.forget(db: "local", spaceID: nil)
        #expect(!SyncEngine.holdsBlobKeys(space: localKeys.space), "a dropped local database's blob keys stayed")
        #expect(SyncEngine.holdsBlobKeys(space: sharedKeys.space))
        try d.store.drop("team")
        d.engine.forget(db: "team", spaceID: space)
        #expect(!SyncEngine.holdsBlobKeys(space: sharedKeys.space), "a dropped shared database's blob keys stayed")
        await d.close()
    }

    /// With no peer connected, a shared database's changes are sealed soon after they commit, a whole batch at a
    /// time (one head each); the rest waits for a session, which seals it with a head of its own.
    @Test func changesAreSealedInTheBackgroundAWholeBatchAtATime() async throws {
        let d = try Device()
        let db = try d.store.create("offline")
        _ = try d.engine.share(db: db)
        d.engine.start()
        _ = try db.commit((0..<10).map { .put(collection: "c", id: "first\($0)", doc: ["n": 1]) })
        for i in 0..<2_499 { _ = try db.apply(.put(collection: "c", id: "d\(i)", doc: ["n": .int(Int64(i))])) }
        #expect(try eventually { try db.latestHead(origin: db.node)?.seq == 2_000 })
        // A head per batch: the first batch ends at the first head.
        #expect(try db.entryBatch(origin: db.node, after: 0, maxEntries: 1_500)?.entries.count == 1_000)
        let key = try #require(try d.engine.spaceKey(db: db))
        #expect(try db.sealLocal(key: key, identity: d.identity) == 500)
        #expect(try db.latestHead(origin: db.node)?.seq == 2_500)
        await d.close()
    }

    @Test func aStrangerIsRefusedAndGetsNothing() async throws {
        let a = try Device(), c = try Device()
        try await a.listen()
        let dbA = try a.store.create("secret")
        _ = try dbA.apply(.put(collection: "c", id: "x", doc: ["private": "yes"]))
        _ = try a.engine.share(db: dbA)
        let dbC = try c.store.create("guess")
        _ = try c.engine.share(db: dbC)  // another space: another key
        _ = try c.engine.addPeer(db: dbC, address: PeerAddress("127.0.0.1:\(a.port)")!)
        #expect(eventually { a.engine.strangersRefused.load(ordering: .relaxed) >= 2 })
        #expect(try dbC.summary().documents == 0)
        #expect(c.engine.status(db: dbC).first?.connected == false)
        #expect(a.engine.status(db: dbA).isEmpty)
        await c.close()
        await a.close()
    }

    @Test func peerAddressesParse() {
        #expect(PeerAddress("127.0.0.1:7000")?.port == 7000)
        #expect(PeerAddress("[::1]:7000")?.host == "::1")
        #expect(PeerAddress("[::1]:7000")?.description == "[::1]:7000")
        for bad in ["", "host", "host:0", "host:70000", ":80", "a b:80", "host:x"] { #expect(PeerAddress(bad) == nil, "\(bad)") }
        // WebSocket URLs: default ports and path, always written out in full.
        #expect(PeerAddress("ws://relay.example")?.description == "ws://relay.example:80/v1/sync")
        #expect(PeerAddress("wss://relay.example")?.description == "wss://relay.example:443/v1/sync")
        #expect(PeerAddress("WSS://relay.example:8443/sync/x")?.transport == .webSocket(tls: true, path: "/sync/x"))
        #expect(PeerAddress("ws://[::1]:9000")?.host == "::1")
        #expect(PeerAddress("ws://[::1]")?.description == "ws://[::1]:80/v1/sync")
        #expect(PeerAddress("ws://127.0.0.1:7400/v1/sync")?.hostPort == "127.0.0.1:7400")
        for bad in ["ws://", "ws://:80", "ws://host:0", "ws://host:x/", "ws://h st", "ws://host/a b", "http://host:80", "ws://[::1"] {
            #expect(PeerAddress(bad) == nil, "\(bad)")
        }
        // A listening address is never a URL.
        #expect(PeerAddress("ws://127.0.0.1:7400", listening: true) == nil)
    }
}
