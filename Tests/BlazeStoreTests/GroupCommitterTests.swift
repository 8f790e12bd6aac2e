import BlazeCRDT
import Testing

@testable import BlazeStore

/// `GroupCommitter` alone, without a database: its scheduling, its bounds and its savepoint fallback.
@Suite struct GroupCommitterTests {
    /// A pending write whose outcome goes nowhere.
    static func write(_ id: String) -> PendingWrite {
        PendingWrite(op: .insert(collection: "c", doc: ["_id": .string(id)]), completion: { _ in })
    }

    /// The first write schedules a commit; writes arriving before it runs join the same group.
    @Test func theFirstWriteSchedulesAndLaterOnesJoin() {
        let c = GroupCommitter()
        #expect(!c.isScheduled)
        #expect(c.enqueue(Self.write("a")))
        #expect(!c.enqueue(Self.write("b")))
        #expect(c.isScheduled && c.queuedCount == 2)
        #expect(c.takeGroup().count == 2)
        #expect(c.queuedCount == 0)
        // Nothing arrived during the commit: nothing more is scheduled.
        #expect(!c.finish(afterLone: false))
        #expect(!c.isScheduled)
    }

    /// Writes arriving during a commit form the next group, which the finishing commit asks to schedule.
    @Test func writesArrivingDuringACommitFormTheNextGroup() {
        let c = GroupCommitter()
        #expect(c.enqueue(Self.write("a")))
        #expect(c.takeGroup().count == 1)
        #expect(!c.enqueue(Self.write("b")))
        #expect(c.finish(afterLone: false))
        #expect(c.isScheduled)
        #expect(c.takeGroup().count == 1)
    }

    /// A group carries at most `maxGroupSize` writes, oldest first; the rest wait for the next.
    @Test func aGroupIsBoundedAndTakesTheOldestFirst() {
        let c = GroupCommitter()
        for i in 0..<(GroupCommitter.maxGroupSize + 3) { _ = c.enqueue(Self.write("w\(i)")) }
        let first = c.takeGroup()
        #expect(first.count == GroupCommitter.maxGroupSize)
        guard case .insert(_, let doc) = first[0].op else {
            Issue.record("not an insert")
            return
        }
        #expect(doc["_id"] == "w0")
        #expect(c.takeGroup().count == 3)
    }

    /// A write may commit alone only when nothing is queued or running; while it does, others queue.
    @Test func aLoneCommitOnlyWhenIdle() {
        let c = GroupCommitter()
        #expect(c.claimLone())
        #expect(!c.claimLone())
        #expect(!c.enqueue(Self.write("meanwhile")))
        #expect(c.finish(afterLone: true))
        // Contention was seen: the next `groupsAfterContention` groups run on the writer before a lone commit.
        for i in 0..<GroupCommitter.groupsAfterContention {
            #expect(c.takeGroup().count == (i == 0 ? 1 : 0))
            #expect(!c.finish(afterLone: false))
            if i < GroupCommitter.groupsAfterContention - 1 { #expect(!c.claimLone()) }
        }
        #expect(c.claimLone())
    }

    /// A lone commit during which nothing arrived leaves lone commits allowed.
    @Test func anUncontendedLoneCommitKeepsLoneCommitsAllowed() {
        let c = GroupCommitter()
        #expect(c.claimLone())
        #expect(!c.finish(afterLone: true))
        #expect(c.claimLone())
    }

    /// After a failure without savepoints, the next `savepointGroupsAfterFailure` groups use savepoints.
    @Test func aFailureWithoutSavepointsTurnsThemOnForSomeGroups() {
        let c = GroupCommitter()
        #expect(c.nextGroupWithoutSavepoints())
        c.writeFailedWithoutSavepoints()
        #expect(c.savepointGroupsRemaining == GroupCommitter.savepointGroupsAfterFailure)
        for _ in 0..<GroupCommitter.savepointGroupsAfterFailure { #expect(!c.nextGroupWithoutSavepoints()) }
        #expect(c.savepointGroupsRemaining == 0)
        #expect(c.nextGroupWithoutSavepoints())
    }

    /// Counts add up groups and the writes they carried.
    @Test func countsAddUp() {
        let c = GroupCommitter()
        c.count(writes: 1)
        c.count(writes: 5)
        #expect(c.statistics == GroupCommitCounts(groups: 2, writes: 6))
    }
}
