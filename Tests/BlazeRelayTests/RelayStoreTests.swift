import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
@testable import BlazeRelay
import BlazeStore
import BlazeSync
import BlazeTestSupport
import BlazeWire
import Foundation
import Logging
import NIOPosix
import Synchronization
import Testing

/// A device writing into a legacy-keyed database, whose sealed entries the relay receives.
final class Writer {
    let identity = DeviceIdentity()
    let dir = NSTemporaryDirectory() + "relaytest-\(UUID().uuidString)"
    let store: Store
    let db: BlazeDatabase

    init(key: SpaceKey) throws {
        store = try Store(directory: dir, node: NodeID(bytes: identity.nodeID))
        db = try store.create("s")
        try db.setSpaceID(key.idHex)
    }

    deinit {
        store.closeAll()
        try? FileManager.default.removeItem(atPath: dir)
    }

    /// Writes `n` documents and seals them in heads of `batch` entries.
    func write(_ n: Int, from: Int = 0, key: SpaceKey, batch: Int = 10) throws {
        for i in from..<(from + n) { _ = try db.apply(.put(collection: "c", id: "d\(i)", doc: ["n": .int(Int64(i))])) }
        try db.sealLocal(key: key, identity: identity, batch: batch)
    }

    var origin: NodeID { db.node }
}

/// A membership log created by `admin`, adding each of `readers` as a reader.
func adminLog(_ admin: DeviceIdentity, readers: [DeviceIdentity] = []) throws -> MembershipState {
    let salt = SpaceKey.randomBytes(16)
    let space = MembershipOp.spaceID(creator: admin.publicKeys, salt: salt)
    var ops = [try MembershipOp(space: space, author: admin, timeMs: 1, parents: [], action: .create(salt: salt), envelopes: [])]
    for (i, reader) in readers.enumerated() {
        ops.append(
            try MembershipOp(
                space: space, author: admin, timeMs: UInt64(2 + i), parents: [ops.last!.hash],
                action: .add(device: reader.publicKeys, role: .reader), envelopes: []))
    }
    return MembershipState(space: space, ops: ops)
}

/// The relay's two stores.
enum Backend: String, CaseIterable, CustomStringConvertible, Sendable {
    case sqlite, postgres
    var description: String { rawValue }
}

/// A relay store of either kind on temporary files (a throwaway PostgreSQL server for `.postgres`), removed at the end.
final class TempRelay {
    let store: any RelayBackend
    /// The directory of the SQLite store (its `-wal` and `-shm` files included), removed whole.
    private let directory: String?
    /// The PostgreSQL server of a `.postgres` store.
    let server: PostgresServer?

    init(_ backend: Backend, limits: RelayLimits = RelayLimits()) async throws {
        switch backend {
        case .sqlite:
            let directory = NSTemporaryDirectory() + "relay-\(UUID().uuidString)"
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            self.directory = directory
            server = nil
            store = try RelayStore(path: directory + "/relay.db", limits: limits)
        case .postgres:
            let server = try PostgresServer()
            self.server = server
            directory = nil
            var logger = Logger(label: "relay-test")
            logger.logLevel = .critical
            store = try await PostgresRelayStore(
                configuration: try PostgresRelayStore.configuration(url: server.url), limits: limits, logger: logger)
        }
    }

    deinit {
        (store as? PostgresRelayStore)?.close()
        if let directory { try? FileManager.default.removeItem(atPath: directory) }
    }
}

/// The relay's store (Protocol/RELAY.md): what it accepts of a device's batches without opening any entry.
@Suite struct RelayStoreTests {
    let key = SpaceKey.generate()

    @Test(arguments: Backend.allCases) func batchesAreStoredLinkedAndServedBackExactly(backend: Backend) async throws {
        let temp = try await TempRelay(backend)
        let relay = temp.store
        #expect(try await relay.add(RelayCapability(key: key)))
        #expect(try await !relay.add(RelayCapability(key: key)), "adding the same space again changes nothing")
        await #expect(throws: RelayError.self, "the same space with another capability") {
            _ = try await relay.add(RelayCapability(key: try SpaceKey(id: key.id, capability: SpaceKey.randomBytes(32))))
        }
        let w = try Writer(key: key)
        try w.write(35, key: key)
        // The writer's log in two batches: 1–20, then 21–35 (a batch ends at a head).
        let first = try #require(try w.db.entryBatch(origin: w.origin, after: 0, maxEntries: 20))
        let rest = try #require(try w.db.entryBatch(origin: w.origin, after: 20, maxEntries: 20))
        #expect(try await relay.store(first, space: key.id, membership: nil) == 20)
        #expect(try await relay.store(first, space: key.id, membership: nil) == 0, "a duplicate stores nothing")
        #expect(try await relay.store(rest, space: key.id, membership: nil) == 15)
        #expect(try await relay.vector(space: key.id) == [w.origin: 35])
        #expect(try await relay.usage(space: key.id).entries == 35)
        // Served back, the entries are the writer's, byte for byte, and open for a member.
        var after: UInt64 = 0
        var served: [SealedEntry] = []
        while let batch = try await relay.batch(space: key.id, origin: w.origin, after: after, maxEntries: 15, maxBytes: 1 << 20) {
            try EntryChain.verifyLinks(batch.entries, head: batch.head, previousHash: served.last?.hash, space: key.id)
            served += batch.entries
            after = batch.head.seq
        }
        let held = try #require(try w.db.entryBatch(origin: w.origin, after: 0, maxEntries: 100))
        #expect(served.map(\.bytes) == held.entries.map(\.bytes))
        let reader = try Writer(key: key)
        var stored = 0
        after = 0
        while let batch = try await relay.batch(space: key.id, origin: w.origin, after: after, maxEntries: 100, maxBytes: 1 << 20) {
            stored += try reader.db.receive(batch: batch, key: key).stored
            after = batch.head.seq
        }
        #expect(stored == 35)
        #expect(try reader.db.stateHash() == w.db.stateHash())
    }

    @Test(arguments: Backend.allCases) func gapsForksForeignSpacesAndBrokenLinksAreRefused(backend: Backend) async throws {
        let temp = try await TempRelay(backend)
        let relay = temp.store
        _ = try await relay.add(RelayCapability(key: key))
        let w = try Writer(key: key)
        try w.write(30, key: key)
        let first = try #require(try w.db.entryBatch(origin: w.origin, after: 0, maxEntries: 10))
        let third = try #require(try w.db.entryBatch(origin: w.origin, after: 20, maxEntries: 10))
        await #expect(throws: SyncRejection.brokenChain) { try await relay.store(third, space: key.id, membership: nil) }
        #expect(try await relay.store(first, space: key.id, membership: nil) == 10)
        // Another space's entries.
        await #expect(throws: SyncRejection.self) { try await relay.store(first, space: SpaceKey.generate().id, membership: nil) }
        // A fork: the same origin signs other entries 1–12 (a device restored from an old copy, same identity).
        let cloneDir = w.dir + "-clone"
        let clone = try Store(directory: cloneDir, node: w.origin)
        defer {
            clone.closeAll()
            try? FileManager.default.removeItem(atPath: cloneDir)
        }
        let cdb = try clone.create("s")
        try cdb.setSpaceID(key.idHex)
        for i in 0..<12 { _ = try cdb.apply(.put(collection: "c", id: "other\(i)", doc: ["n": .int(Int64(i))])) }
        try cdb.sealLocal(key: key, identity: w.identity, batch: 12)
        let fork = try #require(try cdb.entryBatch(origin: w.origin, after: 0, maxEntries: 12))
        await #expect(throws: SyncRejection.fork) { try await relay.store(fork, space: key.id, membership: nil) }
        // An altered entry no longer matches the head its origin signed.
        let second = try #require(try w.db.entryBatch(origin: w.origin, after: 10, maxEntries: 10))
        var bytes = second.entries[3].bytes
        bytes[bytes.count - 1] ^= 1
        var altered = second
        altered.entries[3] = try SealedEntry(stored: bytes, hash: second.entries[3].hash)
        // As it arrives: decoding the wire message computes each entry's hash from its bytes.
        guard case .entries(let received) = try PeerMessage(decoding: try PeerMessage.entries(altered).encoded()) else {
            Issue.record("not an ENTRIES message")
            return
        }
        // Links are rebuilt from the bytes (SYNC.md §6), so only the signed head can tell: it names another last entry.
        await #expect(throws: SyncRejection.badHead) { try await relay.store(received, space: key.id, membership: nil) }
        #expect(try await relay.vector(space: key.id) == [w.origin: 10], "nothing refused was stored")
    }

    @Test(arguments: Backend.allCases) func originsOutsideTheLogAndReadersAreRefusedAndTheQuotaHolds(backend: Backend) async throws {
        var limits = RelayLimits()
        limits.maxEntriesPerSpace = 15
        let temp = try await TempRelay(backend, limits: limits)
        let relay = temp.store
        _ = try await relay.add(RelayCapability(key: key))
        let admin = try Writer(key: key), reader = try Writer(key: key), stranger = try Writer(key: key)
        let log = try adminLog(admin.identity, readers: [reader.identity])
        for w in [admin, reader, stranger] { try w.write(10, key: key) }
        func batch(_ w: Writer) throws -> EntryBatch { try #require(try w.db.entryBatch(origin: w.origin, after: 0, maxEntries: 10)) }
        #expect(try await relay.store(try batch(admin), space: key.id, membership: log) == 10)
        await #expect(throws: SyncRejection.reader) { try await relay.store(try batch(reader), space: key.id, membership: log) }
        await #expect(throws: SyncRejection.notMember) { try await relay.store(try batch(stranger), space: key.id, membership: log) }
        // Past the quota (15 entries): refused whole, nothing of it stored.
        try admin.write(10, from: 100, key: key)
        let more = try #require(try admin.db.entryBatch(origin: admin.origin, after: 10, maxEntries: 10))
        await #expect(throws: SyncRejection.overQuota) { try await relay.store(more, space: key.id, membership: log) }
        #expect(try await relay.usage(space: key.id).entries == 10)
        #expect(try await relay.vector(space: key.id) == [admin.origin: 10])
    }

    @Test(arguments: Backend.allCases) func acknowledgementsOfListedSignersAreKeptLatestOnlyAndDroppedWithTheSpace(
        backend: Backend
    ) async throws {
        let temp = try await TempRelay(backend)
        let relay = temp.store
        _ = try await relay.add(RelayCapability(key: key))
        let other = SpaceKey.generate()
        _ = try await relay.add(RelayCapability(key: other))
        let admin = DeviceIdentity(), reader = DeviceIdentity(), stranger = DeviceIdentity()
        let log = try adminLog(admin, readers: [reader])
        func ack(_ who: DeviceIdentity, _ issued: UInt64, in space: SpaceID? = nil) -> Acknowledgement {
            Acknowledgement(space: space ?? key.id, vector: [[UInt8](repeating: 7, count: 16): issued], issuedMs: issued, identity: who)
        }
        // Listed signers only (readers acknowledge too), the latest of each, this space only; none without a log.
        let offered = [ack(admin, 10), ack(admin, 5), ack(reader, 7), ack(stranger, 9), ack(admin, 20, in: other.id)]
        let accepted = RelayRules.acceptableAcks(offered, space: key.id, membership: log)
        #expect(accepted.map(\.issuedMs).sorted() == [7, 10])
        #expect(RelayRules.acceptableAcks(offered, space: key.id, membership: nil).isEmpty)
        #expect(try await relay.keepAcks(accepted, space: key.id).count == 2)
        // Not newer than what is held: nothing kept; newer: replaces.
        #expect(try await relay.keepAcks([ack(admin, 10), ack(admin, 3)], space: key.id).isEmpty)
        #expect(try await relay.keepAcks([ack(admin, 11)], space: key.id).map(\.issuedMs) == [11])
        let held = try await relay.acks(space: key.id)
        #expect(held.count == 2 && Set(held.map(\.issuedMs)) == [7, 11])
        #expect(held.allSatisfy { (try? Acknowledgement(bytes: $0.bytes)) == $0 }, "kept as signed")
        #expect(try await relay.acks(space: other.id).isEmpty)
        // Retention drops them with the space's data.
        let w = try Writer(key: key)
        try w.write(5, key: key)
        _ = try await relay.store(try #require(try w.db.entryBatch(origin: w.origin, after: 0, maxEntries: 10)), space: key.id, membership: nil)
        #expect(try await relay.expire(idleBefore: Int64(Date().timeIntervalSince1970 * 1000) + 60_000) == [key.id])
        #expect(try await relay.acks(space: key.id).isEmpty)
    }

    @Test(arguments: Backend.allCases) func idleSpacesAreDroppedWholeAndFillAgain(backend: Backend) async throws {
        let temp = try await TempRelay(backend)
        let relay = temp.store
        _ = try await relay.add(RelayCapability(key: key))
        let other = SpaceKey.generate()
        _ = try await relay.add(RelayCapability(key: other))
        let w = try Writer(key: key)
        try w.write(20, key: key)
        let batch = try #require(try w.db.entryBatch(origin: w.origin, after: 0, maxEntries: 100))
        // (Times taken around the write, not after it: a test may wait long for a thread in a busy run.)
        let beforeWrite = Int64(Date().timeIntervalSince1970 * 1000)
        #expect(try await relay.store(batch, space: key.id, membership: nil) == 20)
        // Written after the cutoff: kept.
        #expect(try await relay.expire(idleBefore: beforeWrite - 1).isEmpty)
        // A cutoff after the last write drops the space's data, and only that space's (the other was never written).
        let dropped = try await relay.expire(idleBefore: Int64(Date().timeIntervalSince1970 * 1000) + 60_000)
        #expect(dropped == [key.id])
        #expect(try await relay.vector(space: key.id).isEmpty)
        #expect(try await relay.usage(space: key.id).entries == 0)
        #expect(try await relay.ops(space: key.id).isEmpty)
        #expect(try await relay.spaces().map(\.id).contains(key.id), "the space is still served")
        // A device hands everything back from its first entry, as on a first sync.
        #expect(try await relay.store(batch, space: key.id, membership: nil) == 20)
        #expect(try await relay.vector(space: key.id) == [w.origin: 20])
    }
}

/// What the PostgreSQL store does when its server goes away and comes back (Protocol/RELAY.md, "Metrics").
@Suite struct PostgresRestartTests {
    /// Calls that ended, by outcome; callers that stopped, and whether they were asked to.
    final class Outcomes: Sendable {
        private let counts = Mutex<(ok: Int, failed: Int, stopped: Int)>((0, 0, 0))
        func record(_ ok: Bool) { counts.withLock { ok ? ($0.ok += 1) : ($0.failed += 1) } }
        func stopped() { counts.withLock { $0.stopped += 1 } }
        private let stop = Mutex(false)
        func requestStop() { stop.withLock { $0 = true } }
        var stopRequested: Bool { stop.withLock { $0 } }
        var ended: Int { counts.withLock { $0.ok + $0.failed } }
        var callersStopped: Int { counts.withLock { $0.stopped } }
    }

    @Test func everyCallEndsWhenTheServerRestartsUnderLoadAndLaterCallsSucceed() async throws {
        let server = try PostgresServer()
        var logger = Logger(label: "relay-test")
        logger.logLevel = .critical
        let store = try await PostgresRelayStore(
            configuration: try PostgresRelayStore.configuration(url: server.url), logger: logger,
            operationTimeout: .seconds(3))
        defer { store.close() }
        let key = SpaceKey.generate()
        _ = try await store.add(RelayCapability(key: key))
        // 16 callers keep the pool busy while the server stops and starts again: some calls are in flight when it
        // goes, and without a deadline some of those never end (postgres-nio leaves them waiting), so their caller
        // never stops. The callers run on event loops, as a relay's connections do: a full test run's shared pool
        // may have no thread free for a minute.
        // Their own event loops: while the server is down, failing calls return at once and the callers spin, which
        // on the shared singleton group starved every other in-process server of the test run (a relay test
        // running alongside saw nothing stored for 90 s).
        let outcomes = Outcomes()
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        defer { group.shutdownGracefully { _ in } }
        let executor = EventLoopTaskExecutor(group: group)
        let callers = (0..<16).map { [store, key] _ in
            Task(executorPreference: executor) {
                while !outcomes.stopRequested {
                    do {
                        _ = try await store.vector(space: key.id)
                        outcomes.record(true)
                    } catch {
                        outcomes.record(false)
                    }
                }
                outcomes.stopped()
            }
        }
        #expect(await waitUntil { outcomes.ended > 100 })
        server.stop()
        try server.start()
        outcomes.requestStop()
        #expect(await waitUntil(timeout: .seconds(60)) { outcomes.callersStopped == callers.count },
            "\(outcomes.callersStopped) of \(callers.count) callers ended their last call")
        for c in callers { c.cancel() }
        // The pool reconnects (after its backoff, which under load can outlast one call's deadline).
        var answered = false
        let deadline = ContinuousClock.now + .seconds(60)
        while !answered, ContinuousClock.now < deadline {
            answered = (try? await store.vector(space: key.id))?.isEmpty == true
        }
        #expect(answered, "the store answers after the restart")
        #expect(try await store.spaces().map(\.id) == [key.id])
    }
}
