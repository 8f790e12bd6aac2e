import BlazeCRDT
import BlazeProtocol
import BlazeTestSupport
import Foundation
import GRDB
import Synchronization
import Testing

@testable import BlazeStore

@Suite struct GroupCommitTests {
    /// Submits `ops` while the writer is held, so that all of them wait for, and share, the next group commit; returns
    /// their outcomes in order.
    static func submitTogether(_ db: BlazeDatabase, _ ops: [WriteOp]) -> [Result<WriteResult, any Error>] {
        let outcomes = Mutex<[Int: Result<WriteResult, any Error>]>([:])
        let done = DispatchGroup()
        db.connections.writeWithoutTransaction { _ in
            for (i, op) in ops.enumerated() {
                done.enter()
                db.submit(op) { r in
                    outcomes.withLock { $0[i] = r }
                    done.leave()
                }
            }
        }
        #expect(done.wait(timeout: .now() + 60) == .success)
        return outcomes.withLock { o in ops.indices.map { o[$0]! } }
    }

    @Test func writesWaitingTogetherShareOneCommitAndEachIsItsOwnChange() throws {
        let t = try TempStore()
        let db = try t.store.create("g")
        guard let rec = FeedRecorder.attached(to: db) else { return }
        let start = db.feed.lastSequence
        let before = db.groupCommitCounts
        let ops: [WriteOp] = (0..<10).map { .insert(collection: "c", doc: ["_id": .string("d\($0)"), "n": .int(Int64($0))]) }
        let results = Self.submitTogether(db, ops)
        #expect(results.map { (try? $0.get())?.id } == (0..<10).map { "d\($0)" })
        let after = db.groupCommitCounts
        #expect(after.groups - before.groups == 1 && after.writes - before.writes == 10)
        // Ten changes, one per write, in submission order, each with its own feed entry.
        let changes = try db.changes(since: VersionVector())
        #expect(changes.map(\.seq) == Array(1...10))
        #expect(changes.allSatisfy { $0.origin == db.node && $0.ops.count == 1 })
        #expect(summary(rec.entries) == (0..<10).map { "insert c/d\($0)" })
        #expect(rec.entries.map(\.seq) == Array((start + 1)...(start + 10)))
        for i in 0..<10 { #expect(try db.get(collection: "c", id: "d\(i)")["n"] == .int(Int64(i))) }
    }

    @Test func aFailingWriteInAGroupFailsAloneAndLeavesNoTrace() throws {
        var limits = StoreLimits()
        limits.maxDocumentBytes = 1000
        let t = try TempStore(limits: limits)
        let db = try t.store.create("g")
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "taken"]))
        guard let rec = FeedRecorder.attached(to: db) else { return }
        let start = db.feed.lastSequence
        let big = JSONValue.string(String(repeating: "x", count: 2000))
        let ops: [WriteOp] = [
            .insert(collection: "c", doc: ["_id": "a"]),
            .insert(collection: "fresh", doc: ["_id": "big", "v": big]),  // too large, in a collection not yet known
            .insert(collection: "c", doc: ["_id": "taken"]),  // exists
            .patch(collection: "c", id: "missing", set: ["v": 1]),  // not found
            .put(collection: "c", id: "b", doc: ["v": 2]),
        ]
        let results = Self.submitTogether(db, ops)
        func kind(_ r: Result<WriteResult, any Error>) -> String {
            switch r {
            case .success(let w): return "ok \(w.id)"
            case .failure(let e as StoreError): return e.kind
            case .failure(let e): return "\(e)"
            }
        }
        #expect(results.map(kind) == ["ok a", "document_too_large", "document_exists", "document_not_found", "ok b"])
        // Only the kept writes are changes, with consecutive sequences, and only they reach the feed.
        #expect(try db.changes(since: VersionVector()).map(\.seq) == [1, 2, 3])
        #expect(summary(rec.entries) == ["insert c/a", "insert c/b"])
        #expect(rec.entries.map(\.seq) == [start + 1, start + 2])
        // The collection the failed write would have created does not exist, and a later write creates it for good.
        #expect(try db.collections().map(\.name) == ["c"])
        // Alone in its group (no savepoint), a refused write leaves no trace either.
        #expect(throws: StoreError.self) { try db.apply(.insert(collection: "alone", doc: ["_id": "big", "v": big])) }
        #expect(try db.collections().map(\.name) == ["c"])
        _ = try db.apply(.insert(collection: "fresh", doc: ["_id": "small"]))
        #expect(try db.collections().map(\.name) == ["c", "fresh"])
        let reopened = try Store(directory: t.dir, limits: limits, node: t.store.node)
        defer { reopened.closeAll() }
        t.store.closeAll()
        #expect(try reopened.database("g").collections().map(\.name) == ["c", "fresh"])
    }

    /// A group is committed without savepoints until one of its writes fails; that group is redone with a savepoint
    /// per write (the failed attempt leaves nothing: no change, feed entry, id or collection), and so are the next
    /// `savepointGroupsAfterFailure` groups, after which groups go without again.
    @Test func aGroupWithAFailingWriteIsRedoneWithSavepointsAndLaterGroupsGoWithoutAgain() throws {
        let t = try TempStore()
        let db = try t.store.create("g")
        guard let rec = FeedRecorder.attached(to: db) else { return }
        #expect(db.groupCommitter.savepointGroupsRemaining == 0)
        let ok = Self.submitTogether(db, [.insert(collection: "c", doc: ["_id": "a"]), .insert(collection: "c", doc: ["_id": "b"])])
        #expect(ok.map { (try? $0.get())?.id } == ["a", "b"])
        #expect(db.groupCommitter.savepointGroupsRemaining == 0)
        // Generated ids, a new collection and a change before the failing write: all rolled back, then redone.
        let mixed = Self.submitTogether(
            db,
            [
                .insert(collection: "new", doc: ["n": 1]), .insert(collection: "c", doc: ["_id": "a"]),
                .insert(collection: "c", doc: ["n": 2]),
            ])
        #expect(mixed.map { (try? $0.get()) != nil } == [true, false, true])
        #expect(db.groupCommitter.savepointGroupsRemaining == GroupCommitter.savepointGroupsAfterFailure)
        let generated = mixed.compactMap { try? $0.get().id }
        #expect(try db.changes(since: VersionVector()).map(\.seq) == [1, 2, 3, 4])
        #expect(summary(rec.entries) == ["insert c/a", "insert c/b", "insert new/\(generated[0])", "insert c/\(generated[1])"])
        #expect(try db.collections().map(\.name) == ["c", "new"])
        #expect(try db.count(collection: "new", filter: try Filter.parse(nil)) == 1)
        for i in 0..<GroupCommitter.savepointGroupsAfterFailure {
            let pair = Self.submitTogether(
                db, [.put(collection: "c", id: "p\(i)", doc: [:]), .patch(collection: "c", id: "p\(i)", set: ["v": 1])])
            #expect(pair.allSatisfy { (try? $0.get()) != nil })
        }
        #expect(db.groupCommitter.savepointGroupsRemaining == 0)
        let total = 4 + 2 * GroupCommitter.savepointGroupsAfterFailure
        #expect(try db.changes(since: VersionVector()).map(\.seq) == (1...total).map(UInt64.init))
        #expect(try db.committedVersionsMatchTheTable())
    }

    @Test func aWriteSubmittedHereWithNoGroupUnderWayCommitsOnTheCallingThreadBeforeReturning() throws {
        let t = try TempStore()
        let db = try t.store.create("g")
        let before = db.groupCommitCounts
        let caller = pthread_self()
        let outcome = Mutex<(result: Result<WriteResult, any Error>, onCaller: Bool)?>(nil)
        db.submit(.insert(collection: "c", doc: ["_id": "a", "n": 1]), here: true) { r in
            outcome.withLock { $0 = (r, pthread_equal(pthread_self(), caller) != 0) }
        }
        let seen = try #require(outcome.withLock { $0 })
        #expect((try? seen.result.get())?.id == "a")
        #expect(seen.onCaller)
        #expect(db.groupCommitCounts.groups == before.groups + 1 && db.groupCommitCounts.writes == before.writes + 1)
        #expect(try db.get(collection: "c", id: "a")["n"] == .int(1))
        #expect(try db.changes(since: VersionVector()).map(\.seq) == [1])
    }

    @Test func aWriteSubmittedHereWhileAGroupIsUnderWayJoinsTheNextGroupWithoutWaiting() throws {
        let t = try TempStore()
        let db = try t.store.create("g")
        let before = db.groupCommitCounts
        let done = DispatchGroup()
        let results = Mutex<[String: Result<WriteResult, any Error>]>([:])
        let returned = DispatchSemaphore(value: 0)
        let answeredBeforeReturning = Mutex(false)
        db.connections.writeWithoutTransaction { _ in
            // The writer is held here: this write's group commit is queued behind it.
            done.enter()
            db.submit(.insert(collection: "c", doc: ["_id": "queued"])) { r in
                results.withLock { $0["queued"] = r }
                done.leave()
            }
            // Another thread submits "here": it must join the queue and return at once, not wait for the writer.
            done.enter()
            Thread.detachNewThread {
                db.submit(.insert(collection: "c", doc: ["_id": "here"]), here: true) { r in
                    results.withLock { $0["here"] = r }
                    done.leave()
                }
                answeredBeforeReturning.withLock { $0 = results.withLock { $0["here"] != nil } }
                returned.signal()
            }
            #expect(returned.wait(timeout: .now() + 30) == .success)
        }
        #expect(!answeredBeforeReturning.withLock { $0 })
        #expect(done.wait(timeout: .now() + 60) == .success)
        #expect(results.withLock { $0.mapValues { (try? $0.get())?.id } } == ["queued": "queued", "here": "here"])
        // Both went in the one group commit that followed the held writer.
        let after = db.groupCommitCounts
        #expect(after.groups - before.groups == 1 && after.writes - before.writes == 2)
    }

    @Test func aWriteArrivingDuringALoneCommitKeepsTheNextWritesOnTheWriterForAWhile() throws {
        let t = try TempStore()
        let db = try t.store.create("g")
        let done = DispatchGroup()
        let loneAnswered = DispatchSemaphore(value: 0)
        db.connections.writeWithoutTransaction { _ in
            // With the writer held here, a write submitted "here" starts committing alone and waits for the writer.
            done.enter()
            Thread.detachNewThread {
                db.submit(.insert(collection: "c", doc: ["_id": "lone"]), here: true) { _ in done.leave() }
                loneAnswered.signal()
            }
            #expect(eventually { db.groupCommitter.isScheduled })
            // A write from elsewhere arrives during that lone commit.
            done.enter()
            db.submit(.insert(collection: "c", doc: ["_id": "meanwhile"])) { _ in done.leave() }
        }
        #expect(loneAnswered.wait(timeout: .now() + 60) == .success)
        #expect(done.wait(timeout: .now() + 60) == .success)
        // Writers are contending: for the next `groupsAfterContention` groups (the first carried "meanwhile"), a write
        // submitted "here" is queued for the writer instead of committing alone.
        func committedHere(_ id: String) -> Bool {
            let answered = Mutex(false)
            let finished = DispatchSemaphore(value: 0)
            db.submit(.insert(collection: "c", doc: ["_id": .string(id)]), here: true) { r in
                answered.withLock { $0 = true }
                #expect((try? r.get())?.id == id)
                finished.signal()
            }
            let before = answered.withLock { $0 }
            #expect(finished.wait(timeout: .now() + 60) == .success)
            return before
        }
        for i in 1..<GroupCommitter.groupsAfterContention { #expect(!committedHere("q\(i)")) }
        // Then writes commit alone again (once the last group has finished: its writes learn their outcome first).
        #expect(eventually { !db.groupCommitter.isScheduled })
        #expect(committedHere("again"))
        #expect(try db.changes(since: VersionVector()).count == GroupCommitter.groupsAfterContention + 2)
    }

    @Test func concurrentWritersEachGetOneDurableChange() throws {
        let t = try TempStore()
        let db = try t.store.create("g")
        let (writers, each) = (8, 150)
        let failures = Mutex<[String]>([])
        DispatchQueue.concurrentPerform(iterations: writers) { w in
            for i in 0..<each {
                do {
                    let id = "w\(w)-\(i)"
                    guard try db.apply(.insert(collection: "c", doc: ["_id": .string(id), "w": .int(Int64(w))])).id == id else {
                        throw StoreError(.internalFailure, kind: "wrong_id", id)
                    }
                    _ = try db.apply(.patch(collection: "c", id: id, incr: ["n": 1]))
                } catch {
                    failures.withLock { $0.append("\(error)") }
                }
            }
        }
        #expect(failures.withLock { $0 }.isEmpty)
        let total = writers * each * 2
        #expect(try db.changes(since: VersionVector()).map(\.seq) == (1...total).map(UInt64.init))
        #expect(try db.count(collection: "c", filter: try Filter.parse(nil)) == writers * each)
        #expect(try db.count(collection: "c", filter: try Filter.parse(["n": 1] as JSONValue)) == writers * each)
        #expect(db.groupCommitCounts.writes == total)
        #expect(try db.feedEntries(after: 0, limit: total, maxEvents: total).count == total)
    }

    /// The version vector local writes start from is kept in memory: after every kind of write it is the table's, and
    /// the next local change takes the next sequence (a vector ahead of the table would leave a gap peers wait on).
    @Test func theCommittedVersionVectorFollowsEveryKindOfWrite() throws {
        let t = try TempStore()
        let db = try t.store.create("g")
        #expect(try db.committedVersionsMatchTheTable())
        _ = try db.apply(.insert(collection: "c", doc: ["_id": "a"]))
        _ = try db.commit([.insert(collection: "c", doc: ["_id": "b"]), .put(collection: "c", id: "c", doc: [:])])
        #expect(try db.committedVersionsMatchTheTable())
        // A group whose middle write fails and is rolled back to its savepoint.
        let results = Self.submitTogether(
            db, [.put(collection: "c", id: "d", doc: [:]), .insert(collection: "c", doc: ["_id": "a"]), .put(collection: "c", id: "e", doc: [:])])
        #expect(results.map { (try? $0.get()) != nil } == [true, false, true])
        #expect(try db.committedVersionsMatchTheTable())
        // Alone, a refused write leaves it as it was.
        #expect(throws: StoreError.self) { try db.apply(.insert(collection: "c", doc: ["_id": "a"])) }
        #expect(try db.committedVersionsMatchTheTable())
        // Changes of another replica.
        let other = try TempStore()
        let remote = try other.store.create("g")
        for i in 0..<3 { _ = try remote.apply(.put(collection: "r", id: "x\(i)", doc: ["i": .int(Int64(i))])) }
        _ = try db.receive(try remote.changes(since: VersionVector()))
        #expect(try db.committedVersionsMatchTheTable())
        #expect(try db.versionVector()[remote.node] == 3)
        _ = try db.apply(.put(collection: "c", id: "f", doc: [:]))
        #expect(try db.changes(since: VersionVector()).filter { $0.origin == db.node }.map(\.seq) == Array(1...5))
        #expect(try db.committedVersionsMatchTheTable())
    }
}

extension BlazeDatabase {
    /// Whether the in-memory committed version vector is the `versions` table's.
    func committedVersionsMatchTheTable() throws -> Bool {
        try connections.writeWithoutTransaction { db in
            let table = try Row.fetchAll(db, sql: "SELECT origin, seq FROM versions").map { (NodeID(hex: $0[0])!, UInt64($0[1] as Int64)) }
            return try committedVersions.value(db) == VersionVector(Dictionary(uniqueKeysWithValues: table))
        }
    }
}
