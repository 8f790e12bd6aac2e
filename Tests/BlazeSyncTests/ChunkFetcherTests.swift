import BlazeCrypto
import Foundation
import BlazeProtocol
import BlazeStore
import BlazeTestSupport
import NIOCore
import NIOPosix
import Synchronization
import Testing

@testable import BlazeSync

/// The fetcher on its own: which source is asked for which chunk, and what happens when sources lack, fail, leave or
/// stay silent.
@Suite struct ChunkFetcherTests {
    /// A source that records what it was asked.
    final class Asked: Sendable {
        let ids = Mutex<[ChunkID]>([])
        var ask: @Sendable ([ChunkID]) -> Void { { ids in self.ids.withLock { $0 += ids } } }
        var count: Int { ids.withLock { $0.count } }
        func take() -> [ChunkID] {
            ids.withLock { held in
                defer { held = [] }
                return held
            }
        }
    }

    /// What a fetch ended with.
    final class Outcome: Sendable {
        let result = Mutex<Result<Void, StoreError>?>(nil)
        var done: @Sendable (Result<Void, StoreError>) -> Void { { r in self.result.withLock { $0 = r } } }
        var kind: String? {
            result.withLock { r in
                switch r {
                case .failure(let e)?: return e.kind
                case .success?: return "ok"
                case nil: return nil
                }
            }
        }
    }

    func ids(_ n: Int) -> [ChunkID] { (0..<n).map { _ in ChunkID(bytes: SpaceKey.randomBytes(32))! } }
    let group = MultiThreadedEventLoopGroup.singleton

    @Test func chunksAreSpreadOverSourcesWithinTheirRoomAndCompleteTheFetch() {
        let fetcher = ChunkFetcher(group: group, askTimeout: .seconds(60))
        let (a, b, other) = (Asked(), Asked(), Asked())
        let ta = fetcher.attach(db: "d", ask: a.ask), tb = fetcher.attach(db: "d", ask: b.ask)
        _ = fetcher.attach(db: "e", ask: other.ask)
        let wanted = ids(10)
        let outcome = Outcome()
        fetcher.fetch(db: "d", ids: wanted, timeout: .seconds(60), waitForSource: false, done: outcome.done)
        // Four each at most; the rest wait; another database's source is never asked.
        #expect(a.count == ChunkFetcher.maxInFlightPerSource && b.count == ChunkFetcher.maxInFlightPerSource && other.count == 0)
        var asked = a.take().map { (ta, $0) } + b.take().map { (tb, $0) }
        var served = Set<ChunkID>()
        while let (source, id) = asked.popLast() {
            #expect(fetcher.expects(source, id) && !fetcher.expects(source == ta ? tb : ta, id))
            // Each asked chunk is taken once from the source asked: a second copy while it is stored is not.
            #expect(fetcher.accept(source, id) && !fetcher.accept(source, id) && !fetcher.accept(source == ta ? tb : ta, id))
            fetcher.arrived(source, db: "d", id)
            served.insert(id)
            asked += a.take().map { (ta, $0) } + b.take().map { (tb, $0) }
        }
        #expect(served == Set(wanted) && outcome.kind == "ok" && fetcher.wanted == 0)
    }

    @Test func aChunkOneSourceLacksIsAskedOfAnotherAndOneAllLackFails() {
        let fetcher = ChunkFetcher(group: group, askTimeout: .seconds(60))
        let (a, b) = (Asked(), Asked())
        let ta = fetcher.attach(db: "d", ask: a.ask), tb = fetcher.attach(db: "d", ask: b.ask)
        let id = ids(1)[0]
        let outcome = Outcome()
        fetcher.fetch(db: "d", ids: [id], timeout: .seconds(60), waitForSource: true, done: outcome.done)
        let (first, second, tFirst, tSecond) = a.count == 1 ? (a, b, ta, tb) : (b, a, tb, ta)
        #expect(first.take() == [id] && second.count == 0)
        fetcher.lacks(tFirst, db: "d", [id])
        #expect(second.take() == [id] && outcome.kind == nil)
        // A source's answer for a chunk it was not asked for changes nothing.
        fetcher.lacks(tFirst, db: "d", [id])
        #expect(outcome.kind == nil)
        fetcher.lacks(tSecond, db: "d", [id])
        #expect(outcome.kind == "blob_unavailable" && fetcher.wanted == 0)
    }

    @Test func aSourceThatLeavesHandsItsChunksOnAndWithNoSourceAFetchWaitsOrFails() {
        let fetcher = ChunkFetcher(group: group, askTimeout: .seconds(60))
        let wanted = ids(3)
        // Nothing attached: one that waits for a source waits, one that does not fails at once.
        let waits = Outcome(), fails = Outcome()
        fetcher.fetch(db: "d", ids: wanted, timeout: .seconds(60), waitForSource: true, done: waits.done)
        fetcher.fetch(db: "d", ids: ids(1), timeout: .seconds(60), waitForSource: false, done: fails.done)
        #expect(waits.kind == nil && fails.kind == "blob_unavailable")
        let a = Asked()
        let ta = fetcher.attach(db: "d", ask: a.ask)
        #expect(Set(a.take()) == Set(wanted))
        fetcher.arrived(ta, db: "d", wanted[0])
        fetcher.detach(ta)
        // Its two unanswered chunks go to the next source to attach.
        let b = Asked()
        let tb = fetcher.attach(db: "d", ask: b.ask)
        #expect(Set(b.take()) == Set(wanted[1...]))
        for id in wanted[1...] { fetcher.arrived(tb, db: "d", id) }
        #expect(waits.kind == "ok")
    }

    @Test func aSilentSourceIsPassedOverAndAFetchEndsAtItsDeadline() {
        let fetcher = ChunkFetcher(group: group, askTimeout: .milliseconds(50))
        let (a, b) = (Asked(), Asked())
        let ta = fetcher.attach(db: "d", ask: a.ask)
        let id = ids(1)[0]
        let outcome = Outcome()
        fetcher.fetch(db: "d", ids: [id], timeout: .seconds(60), waitForSource: true, done: outcome.done)
        #expect(a.take() == [id])
        let tb = fetcher.attach(db: "d", ask: b.ask)
        // A never answers: after its time the chunk is asked of B. A still owes it: its late answer is taken, and it
        // is asked for nothing more until it answers.
        #expect(eventually(timeout: .seconds(30)) { b.ids.withLock { $0 == [id] } })
        #expect(fetcher.expects(ta, id) && b.take() == [id])
        let more = Outcome()
        fetcher.fetch(db: "d", ids: ids(8), timeout: .seconds(60), waitForSource: true, done: more.done)
        // Each has one chunk in flight (A's owed): three more each, and two wait.
        #expect(a.take().count == ChunkFetcher.maxInFlightPerSource - 1 && b.take().count == ChunkFetcher.maxInFlightPerSource - 1)
        #expect(fetcher.accept(ta, id))
        fetcher.arrived(ta, db: "d", id)
        #expect(outcome.kind == "ok" && !fetcher.expects(ta, id) && fetcher.expects(tb, id), "B owes its answer still")
        // A fetch nobody can serve ends at its deadline, and its chunks are no longer wanted.
        let late = Outcome()
        let (c, silent) = (ids(1)[0], ChunkFetcher(group: group, askTimeout: .seconds(60)))
        _ = silent.attach(db: "d", ask: Asked().ask)
        silent.fetch(db: "d", ids: [c], timeout: .milliseconds(100), waitForSource: true, done: late.done)
        #expect(eventually(timeout: .seconds(30)) { late.kind == "blob_fetch_timeout" })
        #expect(silent.wanted(db: "d", among: [c]) == 1, "asked already: it may still arrive and is stored")
    }

    @Test func aCancelledFetchDropsWhatNobodyElseWaitsFor() {
        let fetcher = ChunkFetcher(group: group, askTimeout: .seconds(60))
        let wanted = ids(2)
        let (first, second) = (Outcome(), Outcome())
        let t1 = fetcher.fetch(db: "d", ids: wanted, timeout: .seconds(60), waitForSource: true, done: first.done)
        fetcher.fetch(db: "d", ids: [wanted[1]], timeout: .seconds(60), waitForSource: true, done: second.done)
        fetcher.cancel(t1)
        #expect(fetcher.wanted(db: "d", among: wanted) == 1 && first.kind == nil)
        let a = Asked()
        let ta = fetcher.attach(db: "d", ask: a.ask)
        #expect(a.take() == [wanted[1]])
        fetcher.arrived(ta, db: "d", wanted[1])
        #expect(second.kind == "ok" && first.kind == nil)
    }

    /// A chunk nobody waits for any more (its get was cancelled) is not asked of another source when the source
    /// asked stays silent: the want goes at the ask's timeout, and the silent source still owes it.
    @Test func aChunkNobodyWaitsForIsNotAskedAgainWhenItsSourceIsSilent() {
        let fetcher = ChunkFetcher(group: group, askTimeout: .milliseconds(50))
        let (a, b) = (Asked(), Asked())
        let (ta, tb) = (fetcher.attach(db: "d", ask: a.ask), fetcher.attach(db: "d", ask: b.ask))
        let id = ids(1)[0]
        let token = fetcher.fetch(db: "d", ids: [id], timeout: .seconds(60), waitForSource: true, done: Outcome().done)
        #expect(a.count + b.count == 1)
        fetcher.cancel(token)
        #expect(fetcher.wanted(db: "d", among: [id]) == 1, "asked already: it may still arrive")
        #expect(eventually(timeout: .seconds(30)) { fetcher.asksTimedOut == 1 && fetcher.wanted(db: "d", among: [id]) == 0 })
        #expect(a.count + b.count == 1, "a chunk nobody waits for was asked of another source")
        #expect(fetcher.expects(ta, id) || fetcher.expects(tb, id))
    }

    @Test func aFetchOfMoreThanAWindowIsRefusedAndAChunkStoredAfterItsSourceLeftStillCompletes() {
        let fetcher = ChunkFetcher(group: group, askTimeout: .seconds(60))
        let tooMany = Outcome()
        fetcher.fetch(db: "d", ids: ids(ChunkFetcher.maxPerFetch + 1), timeout: .seconds(60), waitForSource: true, done: tooMany.done)
        #expect(tooMany.kind == "internal" && fetcher.wanted == 0)
        let a = Asked()
        let ta = fetcher.attach(db: "d", ask: a.ask)
        let id = ids(1)[0]
        let outcome = Outcome()
        fetcher.fetch(db: "d", ids: [id], timeout: .seconds(60), waitForSource: true, done: outcome.done)
        #expect(fetcher.accept(ta, id))
        // The session closes while the chunk is being stored; once stored, the caller still completes.
        fetcher.detach(ta)
        fetcher.arrived(ta, db: "d", id)
        #expect(outcome.kind == "ok" && fetcher.wanted == 0)
    }

    @Test func aLoneSlowSourceIsWaitedForAndAFolderThatLacksAChunkDoesNotEndTheWaitForAPeer() {
        let fetcher = ChunkFetcher(group: group, askTimeout: .milliseconds(50))
        let a = Asked()
        let ta = fetcher.attach(db: "d", ask: a.ask)
        let id = ids(1)[0]
        let outcome = Outcome(), again = Outcome()
        fetcher.fetch(db: "d", ids: [id], timeout: .seconds(60), waitForSource: true, done: outcome.done)
        #expect(a.take() == [id])
        // A is slow: its time passes, nobody else can give the chunk, and the caller waits for A's answer; a second
        // caller of the same chunk waits for it too, without A being asked again.
        #expect(eventually(timeout: .seconds(30)) { fetcher.asksTimedOut >= 1 })
        #expect(fetcher.wanted(db: "d", among: [id]) == 1 && outcome.kind == nil && fetcher.expects(ta, id))
        fetcher.fetch(db: "d", ids: [id], timeout: .seconds(60), waitForSource: true, done: again.done)
        #expect(outcome.kind == nil && again.kind == nil && a.count == 0)
        #expect(fetcher.accept(ta, id))
        fetcher.arrived(ta, db: "d", id)
        #expect(outcome.kind == "ok" && again.kind == "ok")

        // Only a folder is attached, and it lacks the chunk: a caller that waits for a source keeps waiting for a peer.
        let folder = Asked(), peer = Asked()
        let tf = fetcher.attach(db: "e", folder: true, ask: folder.ask)
        let other = ids(1)[0]
        let waits = Outcome(), quick = Outcome()
        fetcher.fetch(db: "e", ids: [other], timeout: .seconds(60), waitForSource: true, done: waits.done)
        fetcher.fetch(db: "e", ids: [ids(1)[0]], timeout: .seconds(60), waitForSource: false, done: quick.done)
        for asked in folder.take() { fetcher.lacks(tf, db: "e", [asked]) }
        #expect(waits.kind == nil && quick.kind == "blob_unavailable")
        let tp = fetcher.attach(db: "e", ask: peer.ask)
        #expect(peer.take() == [other])
        #expect(fetcher.accept(tp, other))
        fetcher.arrived(tp, db: "e", other)
        #expect(waits.kind == "ok")
    }

    @Test func cancellingAPendingFetchWakesItsWaiter() async throws {
        let device = try Device()
        let db = try device.store.create("files")
        _ = try device.engine.share(db: db)
        // No source will ever answer: without `cancel`, `wait` would block until its 10 minutes end.
        let pending = device.engine.startFetch(db: db, ids: [ChunkID(bytes: [UInt8](repeating: 7, count: 32))!], timeout: .minutes(10))
        let outcome = Outcome()
        let waited = DispatchSemaphore(value: 0)
        Thread {
            outcome.done(Result { () throws(StoreError) in
                do { try pending.wait() } catch let error as StoreError { throw error } catch { fatalError("\(error)") }
            })
            waited.signal()
        }.start()
        pending.cancel()
        #expect(waited.wait(timeout: .now() + 60) == .success)
        #expect(outcome.kind == "fetch_cancelled")
        // A second cancel changes nothing (the first outcome stays, and the waiter was woken once).
        pending.cancel()
        #expect(outcome.kind == "fetch_cancelled")
        await device.close()
    }
}
