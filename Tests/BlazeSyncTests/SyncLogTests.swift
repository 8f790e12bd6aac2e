// The sync log through BlazeSync, which seals and verifies its entries: entries carried between replicas, tampered
// batches, forks and rollbacks, parked changes. What the store records on its own (space, peers) is tested in
// BlazeStoreTests.

import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeWire
import Foundation
import GRDB
import Testing

@testable import BlazeStore
@testable import BlazeSync

/// A device: its identity and a store whose node id is derived from it, holding database "s".
final class SyncReplica {
    let identity = DeviceIdentity()
    let temp: TempStore
    let db: BlazeDatabase

    init(key: SpaceKey, limits: StoreLimits = StoreLimits()) throws {
        temp = try TempStore(limits: limits, node: NodeID(bytes: identity.nodeID))
        db = try temp.store.create("s")
        try db.setSpaceID(key.idHex)
    }

    func insert(_ n: Int, from: Int = 0) throws {
        for i in from..<(from + n) { _ = try db.apply(.put(collection: "c", id: "d\(i)", doc: ["n": .int(Int64(i))])) }
    }
}

/// Sends everything `to` lacks from `from`, batch by batch, as a peer session would (sealing `from`'s own first).
@discardableResult
func pull(_ to: SyncReplica, from: SyncReplica, key: SpaceKey, maxEntries: Int = 50) throws -> Int {
    try from.db.sealLocal(key: key, identity: from.identity, batch: 20)
    var stored = 0
    for (origin, _) in try from.db.syncVector() {
        while let batch = try from.db.entryBatch(origin: origin, after: try to.db.syncVector()[origin] ?? 0, maxEntries: maxEntries) {
            stored += try to.db.receive(batch: batch, key: key).stored
        }
    }
    return stored
}

@Suite struct SyncLogTests {
    let key = SpaceKey.generate()

    @Test func entriesCarryChangesBetweenReplicasAndThroughAThirdOne() throws {
        let a = try SyncReplica(key: key), b = try SyncReplica(key: key), c = try SyncReplica(key: key)
        try a.insert(45)
        try b.insert(10, from: 100)
        #expect(try pull(b, from: a, key: key) == 45)
        // C never talks to A: A's entries reach it through B, still verified against A's own signatures.
        #expect(try pull(c, from: b, key: key) == 55)
        try pull(a, from: b, key: key)
        let hashes = try [a, b, c].map { try $0.db.stateHash() }
        let documents = try c.db.summary().documents
        #expect(Set(hashes).count == 1 && documents == 55)
        // Received entries are stored as sealed locally ones are: origin, hash and bytes as BLOBs.
        let types = try c.db.read { try String.fetchAll($0, sql: "SELECT DISTINCT typeof(origin) || typeof(hash) || typeof(bytes) FROM sync_entries") }
        #expect(types == ["blobblobblob"])
        // Nothing is left to send, and sealing again seals nothing.
        #expect(try pull(b, from: a, key: key) == 0)
        #expect(try a.db.sealLocal(key: key, identity: a.identity) == 0)
        // Heads were signed per sealing batch (20), and batches end at heads.
        let batch = try #require(try a.db.entryBatch(origin: a.db.node, after: 0, maxEntries: 50))
        #expect(batch.entries.count == 45 && batch.head.seq == 45)
        let part = try #require(try a.db.entryBatch(origin: a.db.node, after: 0, maxEntries: 30))
        #expect(part.entries.count == 20)
        let small = try #require(try a.db.entryBatch(origin: a.db.node, after: 20, maxEntries: 5))
        #expect(small.entries.count == 20 && small.head.seq == 40)
        // A byte budget ends a batch at the furthest head within it, and never before the nearest head.
        let sizes = batch.entries.map(\.bytes.count)
        let upTo20 = sizes[..<20].reduce(0, +), upTo40 = sizes[..<40].reduce(0, +)
        for (budget, end) in [(upTo20, 20), (upTo40 - 1, 20), (upTo40, 40), (1, 20), (upTo40 + sizes[40...].reduce(0, +), 45)] {
            let cut = try #require(try a.db.entryBatch(origin: a.db.node, after: 0, maxEntries: 50, maxBytes: budget))
            #expect(cut.head.seq == UInt64(end) && cut.entries.map(\.header.seq) == Array(1...UInt64(end)), "budget \(budget)")
        }
        // Past the last head there is nothing to send.
        #expect(try a.db.entryBatch(origin: a.db.node, after: 45, maxEntries: 50) == nil)
    }

    @Test func remoteEntriesReachTheChangeFeedWithTheirOrigin() throws {
        let a = try SyncReplica(key: key), b = try SyncReplica(key: key)
        try a.insert(3)
        try pull(b, from: a, key: key)
        let feed = try b.db.feedEntries(after: 0, limit: 10, maxEvents: 100)
        #expect(feed.count == 3 && feed.allSatisfy { $0.origin == a.db.node })
    }

    @Test func tamperedBatchesAreRejectedAndStoreNothing() throws {
        let a = try SyncReplica(key: key), b = try SyncReplica(key: key)
        try a.insert(5)
        try a.db.sealLocal(key: key, identity: a.identity)
        let batch = try #require(try a.db.entryBatch(origin: a.db.node, after: 0, maxEntries: 50))
        func rejected(_ b2: EntryBatch, with key: SpaceKey? = nil) -> SyncRejection? {
            do {
                _ = try b.db.receive(batch: b2, key: key ?? self.key)
                return nil
            } catch { return error as? SyncRejection }
        }
        var flipped = batch
        var bytes = flipped.entries[2].bytes
        bytes[bytes.count - 20] ^= 1
        flipped.entries[2] = try SealedEntry(bytes: bytes)
        #expect(rejected(flipped) == .badSeal)
        var dropped = batch
        dropped.entries.remove(at: 1)
        #expect(rejected(dropped) == .malformed)
        var tail = batch
        tail.entries.removeFirst(2)
        #expect(rejected(tail) == .brokenChain)  // a gap before the batch
        #expect(rejected(batch, with: SpaceKey.generate()) == .badHead)
        let nothing = try b.db.syncVector().isEmpty && b.db.summary().documents == 0
        #expect(nothing)
        #expect(try b.db.receive(batch: batch, key: key).stored == 5)
        // The same batch again is a duplicate, not an error.
        let again = try b.db.receive(batch: batch, key: key)
        #expect(again.stored == 0 && again.duplicates == 5)
    }

    @Test func aForkIsRefusedAndARollbackIsDetected() throws {
        let a = try SyncReplica(key: key), b = try SyncReplica(key: key)
        try a.insert(3)
        try pull(b, from: a, key: key)
        // A second store with A's identity (a restored copy of A) writes different changes at the same sequences.
        let twinTemp = try TempStore(node: a.db.node)
        let twin = try twinTemp.store.create("s")
        _ = try twin.apply(.put(collection: "c", id: "other", doc: ["n": 1]))
        try twin.sealLocal(key: key, identity: a.identity)
        let forked = try #require(try twin.entryBatch(origin: a.db.node, after: 0, maxEntries: 50))
        #expect(throws: SyncRejection.fork) { try b.db.receive(batch: forked, key: key) }
        #expect(throws: SyncRejection.fork) { try b.db.checkOwnHead(forked.head, key: key) }
        // A head from A that is behind what A signed before is a rollback.
        let early = try #require(try a.db.entryBatch(origin: a.db.node, after: 0, maxEntries: 50))
        #expect(early.head.seq == 3)
        try a.insert(2, from: 10)
        try pull(b, from: a, key: key)
        #expect(throws: SyncRejection.rollback) { try b.db.checkOwnHead(early.head, key: key) }
        try b.db.checkOwnHead(try #require(try a.db.latestHead(origin: a.db.node)), key: key)
    }

    @Test func parkedChangesAreBoundedPerOrigin() throws {
        var limits = StoreLimits()
        limits.maxParkedPerOrigin = 3
        let a = try SyncReplica(key: key, limits: limits), b = try SyncReplica(key: key), c = try SyncReplica(key: key)
        try b.insert(1)
        try pull(c, from: b, key: key)
        // C's changes depend on B's entry, which A lacks: they wait for it, at most three at a time.
        try c.insert(5, from: 10)
        try c.db.sealLocal(key: key, identity: c.identity, batch: 1)
        let first = try #require(try c.db.entryBatch(origin: c.db.node, after: 0, maxEntries: 3))
        #expect(try a.db.receive(batch: first, key: key).report.parked == 3)
        let rest = try #require(try c.db.entryBatch(origin: c.db.node, after: 3, maxEntries: 10))
        #expect(throws: SyncRejection.tooManyParked) { try a.db.receive(batch: rest, key: key) }
        #expect(try a.db.syncVector()[c.db.node] == 3, "nothing of the refused batch is stored")
        // Once B's entry arrives, the parked changes apply and the rest comes.
        let fromB = try #require(try b.db.entryBatch(origin: b.db.node, after: 0, maxEntries: 10))
        #expect(try a.db.receive(batch: fromB, key: key).report.applied == 4)
        _ = try a.db.receive(batch: rest, key: key)
        #expect(try a.db.summary().documents == 6 && a.db.stateHash() == c.db.stateHash())
    }

    @Test func aGroupOfBatchesIsStoredInOneTransactionOrNotAtAll() throws {
        let a = try SyncReplica(key: key), b = try SyncReplica(key: key), c = try SyncReplica(key: key)
        try a.insert(30)
        // Patches of the same documents in later batches: a group applies them together.
        for i in 0..<30 { _ = try a.db.apply(.patch(collection: "c", id: "d\(i % 10)", set: ["n": .int(Int64(100 + i))])) }
        try b.insert(5, from: 100)
        try a.db.sealLocal(key: key, identity: a.identity, batch: 20)
        try b.db.sealLocal(key: key, identity: b.identity)
        var batches: [EntryBatch] = []
        while let next = try a.db.entryBatch(origin: a.db.node, after: batches.last?.head.seq ?? 0, maxEntries: 20) {
            batches.append(next)
        }
        batches.append(try #require(try b.db.entryBatch(origin: b.db.node, after: 0, maxEntries: 20)))
        #expect(batches.count == 4)
        let verified = try batches.map { try c.db.verify(batch: $0, key: key) }
        let outcomes = try #require(try c.db.store(group: verified))
        #expect(outcomes.map(\.stored) == [20, 20, 20, 5])
        #expect(outcomes.last?.report.applied == 65)
        // The same as storing them one by one: B took A's batches alone.
        for batch in batches.prefix(3) { _ = try b.db.receive(batch: batch, key: key) }
        #expect(try c.db.stateHash() == b.db.stateHash() && c.db.summary().documents == 35)
        #expect(try c.db.feedEntries(after: 0, limit: 100, maxEvents: 1000).count == 65)
        // A group holding a batch the log refuses stores nothing: a gap (A's second batch without its first), and
        // a fork (a twin of A) behind a good batch.
        let d = try SyncReplica(key: key)
        #expect(try d.db.store(group: [verified[1], verified[3]]) == nil)
        let twinTemp = try TempStore(node: a.db.node)
        let twin = try twinTemp.store.create("s")
        _ = try twin.apply(.put(collection: "c", id: "other", doc: ["n": 1]))
        try twin.sealLocal(key: key, identity: a.identity)
        let forked = try d.db.verify(batch: try #require(try twin.entryBatch(origin: a.db.node, after: 0, maxEntries: 5)), key: key)
        _ = try d.db.store(verified[0])
        #expect(try d.db.store(group: [verified[3], forked]) == nil)
        #expect(try d.db.syncVector()[b.db.node] == nil && d.db.summary().documents == 20, "nothing of the group stored")
        // One by one, each gets its verdict.
        #expect(try d.db.store(verified[3]).stored == 5)
        #expect(throws: SyncRejection.fork) { try d.db.store(forked) }
    }

    @Test func groupsAreShortWhileAnotherWriteWaitsForTheDatabase() throws {
        let a = try SyncReplica(key: key)
        let db = a.db
        // Nothing waits: a receiver stores full groups.
        #expect(!a.db.writesWaiting)
        #expect(VerifiedBatch.groupLimit(a.db) == VerifiedBatch.maxGroup)
        // A long write holds the writer; a local write queued behind it is counted until it starts.
        let (holding, release) = (DispatchSemaphore(value: 0), DispatchSemaphore(value: 0))
        let done = DispatchGroup()
        done.enter()
        Thread.detachNewThread {
            defer { done.leave() }
            _ = try? db.write { _ in
                holding.signal()
                release.wait()
            }
        }
        holding.wait()
        done.enter()
        Thread.detachNewThread {
            defer { done.leave() }
            _ = try? db.apply(.put(collection: "c", id: "queued", doc: ["n": 1]))
        }
        let deadline = Date().addingTimeInterval(120)
        while !a.db.writesWaiting && Date() < deadline { usleep(1000) }
        #expect(a.db.writesWaiting)
        #expect(VerifiedBatch.groupLimit(a.db) == VerifiedBatch.maxGroupWhileOthersWait)
        release.signal()
        done.wait()
        #expect(!a.db.writesWaiting, "a write that started is no longer counted")
        #expect(VerifiedBatch.groupLimit(a.db) == VerifiedBatch.maxGroup)
        #expect(try JSONParser().parse(try a.db.getText(collection: "c", id: "queued"))["n"] == 1)
        // A write that fails before it starts (the database closed) is not counted forever.
        try a.db.close()
        #expect(throws: (any Error).self) { _ = try a.db.apply(.put(collection: "c", id: "late", doc: ["n": 1])) }
        #expect(!a.db.writesWaiting)
        #expect(throws: (any Error).self) { try a.db.connections.write { _ in } }
        #expect(!a.db.writesWaiting)
    }

    /// A's batches of 10 (checked to be six): 30 new documents, then 30 patches to the first 10 of them.
    private func sixBatches(_ a: SyncReplica) throws -> [EntryBatch] {
        try a.insert(30)
        for i in 0..<30 { _ = try a.db.apply(.patch(collection: "c", id: "d\(i % 10)", set: ["n": .int(Int64(100 + i))])) }
        try a.db.sealLocal(key: key, identity: a.identity, batch: 10)
        var batches: [EntryBatch] = []
        while let next = try a.db.entryBatch(origin: a.db.node, after: batches.last?.head.seq ?? 0, maxEntries: 10) {
            batches.append(next)
        }
        #expect(batches.count == 6)
        return batches
    }

    @Test func aGroupStopsAfterFourBatchesWhileAnotherWriteWaits() throws {
        let a = try SyncReplica(key: key), b = try SyncReplica(key: key), c = try SyncReplica(key: key)
        let batches = try sixBatches(a)
        let verified = try batches.map { try c.db.verify(batch: $0, key: key) }
        // A write waits for the database (counted as the writer's queue counts it): the group stops after four.
        c.db.connections.writesWaiting.add(1, ordering: .relaxed)
        let first = try #require(try c.db.store(group: verified))
        #expect(first.map(\.stored) == [10, 10, 10, 10])
        #expect(first.last?.report.applied == 40)
        for batch in batches.prefix(4) { _ = try b.db.receive(batch: batch, key: key) }
        #expect(try c.db.stateHash() == b.db.stateHash() && c.db.syncVector()[a.db.node] == 40)
        // Nothing waits any more: the rest is one transaction, and the result is A's state.
        c.db.connections.writesWaiting.subtract(1, ordering: .relaxed)
        let rest = try #require(try c.db.store(group: Array(verified.dropFirst(first.count))))
        #expect(rest.map(\.stored) == [10, 10])
        #expect(try c.db.stateHash() == a.db.stateHash() && c.db.summary().documents == 30)
        #expect(try c.db.feedEntries(after: 0, limit: 100, maxEvents: 1000).count == 60)
    }

    /// A group stops at the batch that brings its transaction to the documents it may hold; documents its batches
    /// change again do not count twice.
    @Test func aGroupStopsOnceItsBatchesHoldEnoughDocuments() throws {
        let a = try SyncReplica(key: key), b = try SyncReplica(key: key), c = try SyncReplica(key: key)
        let batches = try sixBatches(a)
        var verified = try batches.map { try c.db.verify(batch: $0, key: key) }
        // Three batches of 10 new documents, then three of patches to the first 10: groups hold at most 15.
        var stored: [[Int]] = []
        while !verified.isEmpty {
            let outcomes = try #require(try c.db.store(group: verified, maxDocuments: 15))
            stored.append(outcomes.map(\.stored))
            verified.removeFirst(outcomes.count)
        }
        #expect(stored == [[10, 10], [10, 10], [10, 10]])
        for batch in batches { _ = try b.db.receive(batch: batch, key: key) }
        #expect(try c.db.stateHash() == a.db.stateHash() && c.db.stateHash() == b.db.stateHash())
        #expect(try c.db.summary().documents == 30 && c.db.feedEntries(after: 0, limit: 100, maxEvents: 1000).count == 60)
        // Batches that change the same documents again stay in one group: 60 changes, 10 documents.
        let d = try SyncReplica(key: key)
        let again = try batches.map { try d.db.verify(batch: $0, key: key) }
        _ = try d.db.store(group: Array(again.prefix(3)), maxDocuments: .max)
        let patches = try #require(try d.db.store(group: Array(again.dropFirst(3)), maxDocuments: 15))
        #expect(patches.map(\.stored) == [10, 10, 10])
        #expect(try d.db.stateHash() == a.db.stateHash())
    }
}
