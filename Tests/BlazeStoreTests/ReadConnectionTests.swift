import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDB
import Synchronization
import Testing

@testable import BlazeStore

/// The read connections (the database's one read pool): snapshots kept across reads see every acknowledged write,
/// release before checkpoints, budgets that move long reads off the caller, and reads that wait for a busy pool.
@Suite struct ReadConnectionTests {
    func text(_ db: BlazeDatabase, _ id: String) throws -> JSONValue {
        try JSONParser().parse(try db.getText(collection: "c", id: id))
    }

    @Test func aKeptSnapshotStillSeesEveryWriteAcknowledgedBeforeTheRead() throws {
        let t = try TempStore()
        let db = try t.store.create("r")
        _ = try db.apply(.put(collection: "c", id: "a", doc: ["v": .int(0)]))
        for i in 1...50 {
            // The read before keeps its connection's snapshot open; the write after it must still be seen.
            #expect(try text(db, "a")["v"] == .int(Int64(i - 1)))
            _ = try db.apply(.put(collection: "c", id: "a", doc: ["v": .int(Int64(i))]))
            #expect(try text(db, "a")["v"] == .int(Int64(i)))
            let page = try db.findResultText(FindQuery(collection: "c", filter: try Filter.parse(["v": .int(Int64(i))])))
            #expect(try JSONParser().parse(page)["docs"]?.arrayValue?.count == 1)
            #expect(try db.count(collection: "c", filter: try Filter.parse(["v": .int(Int64(i))])) == 1)
        }
        // A document deleted and a collection never written: not found, and nothing to count.
        _ = try db.apply(.delete(collection: "c", id: "a"))
        expectStoreError("document_not_found") { _ = try db.getText(collection: "c", id: "a") }
        expectStoreError("document_not_found") { _ = try db.getText(collection: "nope", id: "a") }
        #expect(try db.count(collection: "nope", filter: .all) == 0)
        expectStoreError("invalid_name") { _ = try db.getText(collection: "no pe", id: "a") }
        expectStoreError("invalid_name") { _ = try db.count(collection: "no pe", filter: .all) }
    }

    @Test func readersOnOtherThreadsSeeWritesAcknowledgedBeforeTheyRead() throws {
        let t = try TempStore()
        let db = try t.store.create("r")
        _ = try db.apply(.put(collection: "c", id: "a", doc: ["v": .int(0)]))
        // Four threads read in a loop (each keeping snapshots) while this one writes; every read started after a
        // write was acknowledged returns that write or a later one.
        let acknowledged = Atomic<Int64>(0)
        let stop = Atomic<Bool>(false)
        let stale = Atomic<Int>(0)
        let reads = Atomic<Int>(0)
        let readers = DispatchGroup()
        for _ in 0..<4 {
            readers.enter()
            Thread.detachNewThread {
                defer { readers.leave() }
                while !stop.load(ordering: .acquiring) {
                    let floor = acknowledged.load(ordering: .acquiring)
                    guard let doc = try? JSONParser().parse(try db.getText(collection: "c", id: "a")),
                        case .int(let v) = doc["v"]
                    else { continue }
                    if v < floor { stale.add(1, ordering: .relaxed) }
                    reads.add(1, ordering: .relaxed)
                }
            }
        }
        for i in 1...200 {
            _ = try db.apply(.put(collection: "c", id: "a", doc: ["v": .int(Int64(i))]))
            acknowledged.store(Int64(i), ordering: .releasing)
        }
        stop.store(true, ordering: .releasing)
        readers.wait()
        #expect(stale.load(ordering: .relaxed) == 0)
        #expect(reads.load(ordering: .relaxed) > 0)
    }

    @Test func anIdleReaderDoesNotKeepTheLogFromStartingOver() throws {
        var limits = StoreLimits()
        (limits.walCheckpointPages, limits.walMaxPages, limits.walFinishPages) = (32, .max, 64)
        let t = try TempStore(limits: limits)
        let db = try t.store.create("w")
        _ = try db.apply(.put(collection: "c", id: "a", doc: ["v": .int(0)]))
        // A read leaves its connection holding a snapshot, and that connection is never used again: only the
        // checkpointer letting go of idle snapshots lets the log start over (without it, every frame written after
        // this read stays in the WAL).
        _ = try db.getText(collection: "c", id: "a")
        let big = JSONValue.string(String(repeating: "x", count: 2000))
        for n in 0..<400 {
            _ = try db.commit((0..<4).map { i in .insert(collection: "c", doc: ["_id": .string("\(n)-\(i)"), "t": big]) })
            // The background checkpoint a commit asked for has run before the next commit, however loaded the
            // machine: on a busy one it could otherwise start only after the last commit.
            db.connections.checkpointer.drain()
        }
        let pages = try db.read { try Int.fetchOne($0, sql: "PRAGMA page_count") } ?? 0
        let pageSize = try db.read { try Int.fetchOne($0, sql: "PRAGMA page_size") } ?? 4096
        let wal = ((try? FileManager.default.attributesOfItem(atPath: db.path + "-wal"))?[.size] as? NSNumber)?.intValue ?? 0
        let frames = (wal - 32) / (pageSize + 24)
        #expect(frames > 0 && frames < pages / 2, "the WAL grew to \(frames) pages for \(pages) database pages")
        #expect(try text(db, "399-3")["t"] == big)
    }

    @Test func aReadOverItsBudgetStopsAndRunsWhole() throws {
        let t = try TempStore()
        let db = try t.store.create("r")
        for chunk in 0..<4 {
            _ = try db.commit(
                (0..<2500).map { i in
                    .insert(collection: "c", doc: ["_id": .string("d\(chunk)-\(i)"), "n": .int(Int64(chunk * 2500 + i)), "k": .int(Int64(i % 10))])
                })
        }
        _ = try db.write { tx in try tx.createIndex(collection: "c", fields: ["k"], name: nil) }
        // An unindexed scan of 10,000 documents for one match does not fit an inline budget...
        let scan = FindQuery(collection: "c", filter: try Filter.parse(["n": .int(9999)]), limit: 10)
        #expect(throws: ReadBudgetExceeded.self) { _ = try db.findResultText(scan, budget: .inline) }
        #expect(throws: ReadBudgetExceeded.self) { _ = try db.count(collection: "c", filter: scan.filter, budget: .inline) }
        var projected = scan
        projected.fields = [try FieldPath("n")]
        #expect(throws: ReadBudgetExceeded.self) { _ = try db.findResultText(projected, budget: .inline) }
        #expect(try JSONParser().parse(try db.findResultText(projected))["docs"] == [["_id": "d3-2499", "n": 9999]])
        // ...and runs whole without one, on the same connections afterwards.
        let found = try JSONParser().parse(try db.findResultText(scan))
        #expect(found["docs"]?.arrayValue?.map { $0["_id"] } == [.string("d3-2499")])
        #expect(try db.count(collection: "c", filter: scan.filter) == 1)
        // An indexed page fits, and so does a point read.
        let indexed = FindQuery(collection: "c", filter: try Filter.parse(["k": .int(3)]), limit: 10)
        let page = try JSONParser().parse(try db.findResultText(indexed, budget: .inline))
        #expect(page["docs"]?.arrayValue?.count == 10)
        #expect(page["docs"]?.arrayValue?.allSatisfy { $0["k"] == .int(3) } == true)
        #expect(page["cursor"]?.stringValue != nil)
        #expect(try text(db, "d2-7")["n"] == .int(5007))
    }

    @Test func whenEveryConnectionIsBusyReadsWaitForOne() throws {
        let t = try TempStore()
        let db = try t.store.create("r")
        _ = try db.apply(.put(collection: "c", id: "a", doc: ["v": .int(1)]))
        let inside = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let holders = DispatchGroup()
        for _ in 0..<ReadConnections.slotCount {
            holders.enter()
            Thread.detachNewThread {
                _ = try? db.connections.read(budget: .unbounded) { _ in
                    inside.signal()
                    release.wait()
                }
                holders.leave()
            }
        }
        for _ in 0..<ReadConnections.slotCount { inside.wait() }
        // Every slot is held: an inline-budgeted query is refused for its caller to run elsewhere, and the other reads
        // wait until a slot is freed.
        #expect(throws: ReadBudgetExceeded.self) { _ = try db.count(collection: "c", filter: .all, budget: .inline) }
        let answered = Atomic<Int>(0)
        let waiters = DispatchGroup()
        waiters.enter()
        Thread.detachNewThread {
            defer { waiters.leave() }
            if (try? db.getText(collection: "c", id: "a")) != nil { answered.add(1, ordering: .relaxed) }
            if (try? db.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM docs") }) == 1 { answered.add(1, ordering: .relaxed) }
        }
        Thread.sleep(forTimeInterval: 0.05)
        #expect(answered.load(ordering: .relaxed) == 0)
        release.signal()
        waiters.wait()
        #expect(answered.load(ordering: .relaxed) == 2)
        for _ in 1..<ReadConnections.slotCount { release.signal() }
        holders.wait()
        #expect(try db.connections.read(budget: .unbounded) { _ in 1 } == 1)
    }

    @Test func oneReadPoolServesMoreConcurrentReadsThanSlotsAndSeesEveryAcknowledgedWrite() throws {
        let t = try TempStore()
        let db = try t.store.create("r")
        _ = try db.apply(.put(collection: "c", id: "a", doc: ["v": .int(0)]))
        // Four times as many threads as slots read through GRDB and the fast path at once, while this thread writes:
        // every read completes, and none misses a write acknowledged before it started.
        let acknowledged = Atomic<Int64>(0)
        let stop = Atomic<Bool>(false)
        let stale = Atomic<Int>(0)
        let failed = Atomic<Int>(0)
        let reads = Atomic<Int>(0)
        let readers = DispatchGroup()
        for n in 0..<(4 * ReadConnections.slotCount) {
            readers.enter()
            Thread.detachNewThread {
                defer { readers.leave() }
                while !stop.load(ordering: .acquiring) {
                    let floor = acknowledged.load(ordering: .acquiring)
                    do {
                        let v: Int64
                        if n % 2 == 0 {
                            v = try db.read { d in
                                try String.fetchOne(d, sql: "SELECT body FROM docs WHERE id = 'a'")
                                    .flatMap { try JSONParser().parse($0)["v"]?.intValue } ?? -1
                            }
                        } else {
                            v = try JSONParser().parse(try db.getText(collection: "c", id: "a"))["v"]?.intValue ?? -1
                        }
                        if v < floor { stale.add(1, ordering: .relaxed) }
                        reads.add(1, ordering: .relaxed)
                    } catch {
                        failed.add(1, ordering: .relaxed)
                    }
                }
            }
        }
        for i in 1...100 {
            _ = try db.apply(.put(collection: "c", id: "a", doc: ["v": .int(Int64(i))]))
            acknowledged.store(Int64(i), ordering: .releasing)
        }
        stop.store(true, ordering: .releasing)
        readers.wait()
        #expect(stale.load(ordering: .relaxed) == 0)
        #expect(failed.load(ordering: .relaxed) == 0)
        #expect(reads.load(ordering: .relaxed) >= 4 * ReadConnections.slotCount)
        // After the last acknowledged write, a read on every slot (each held in turn while the others are) sees it.
        let seen = Mutex<[Int64]>([])
        let hold = DispatchSemaphore(value: 0)
        let held = DispatchSemaphore(value: 0)
        let all = DispatchGroup()
        for _ in 0..<ReadConnections.slotCount {
            all.enter()
            Thread.detachNewThread {
                defer { all.leave() }
                _ = try? db.connections.read(budget: .unbounded) { c in
                    let text = try c.first(BlazeDatabase.documentSQL, ["c".databaseValue, "a".databaseValue]) { $0.textBytes(0) }
                    let v = text.flatMap { $0 }.flatMap { try? JSONParser().parse($0)["v"]?.intValue } ?? -1
                    seen.withLock { $0.append(v) }
                    held.signal()
                    hold.wait()
                }
            }
        }
        for _ in 0..<ReadConnections.slotCount { held.wait() }
        for _ in 0..<ReadConnections.slotCount { hold.signal() }
        all.wait()
        #expect(seen.withLock { $0 } == Array(repeating: 100, count: ReadConnections.slotCount))
    }

    @Test func aReadOnADroppedDatabaseDoesNotBringItsFileBack() throws {
        let t = try TempStore()
        let db = try t.store.create("gone")
        _ = try db.apply(.put(collection: "c", id: "a", doc: ["v": .int(1)]))
        try t.store.drop("gone")
        // A request that still holds the database reads after the drop: its connections open lazily, and opening
        // one must not create the file again.
        _ = try? db.getText(collection: "c", id: "a")
        _ = try? db.count(collection: "c", filter: .all)
        #expect(!FileManager.default.fileExists(atPath: db.path))
        #expect(try t.store.list() == [])
    }

    @Test func readsAfterCloseFailCleanly() throws {
        let t = try TempStore()
        let db = try t.store.create("r")
        _ = try db.apply(.put(collection: "c", id: "a", doc: ["v": .int(1)]))
        #expect(try text(db, "a")["v"] == .int(1))
        try db.close()
        #expect(throws: (any Error).self) { _ = try db.connections.read(budget: .unbounded) { _ in 1 } }
        #expect(throws: (any Error).self) { _ = try db.read { _ in 1 } }
        #expect(throws: (any Error).self) { _ = try db.getText(collection: "c", id: "a") }
    }
}
