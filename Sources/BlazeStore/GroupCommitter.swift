import Foundation
import Synchronization

/// A single-operation write waiting for a group commit, and who to tell when it is durable.
struct PendingWrite: Sendable {
    /// The operation, committed as its own change.
    let op: WriteOp
    /// Told the outcome once the commit that carried the write returned (on the writer's thread).
    let completion: @Sendable (Result<WriteResult, any Error>) -> Void
}

/// Group commits run and the writes they carried (kept or failed) since a database was opened.
public struct GroupCommitCounts: Sendable, Equatable {
    /// Group commits run (a lone commit counts as a group of one).
    public var groups = 0
    /// Writes they carried.
    public var writes = 0

    /// Counts (zero by default).
    public init(groups: Int = 0, writes: Int = 0) {
        self.groups = groups
        self.writes = writes
    }
}

/// The owner of group commit's state (ARCHITECTURE.md, "Storage"): the queue of single-operation writes waiting for
/// the next group, whether a commit is scheduled or running, how many groups must run before a write may commit alone
/// again, the savepoint fallback after a failing write, and the statistics. It decides; `BlazeDatabase` (its
/// `+GroupCommit` extension) runs the commits it decides on, on the writer.
///
/// Each decision takes one lock, as the database's fields did before this type held them: the write path pays no
/// extra lock or allocation for the indirection.
final class GroupCommitter: Sendable {
    /// Writes in one group commit at most; more wait for the next. Bounds the memory and the time one transaction
    /// holds the writer (a group of 1024 small writes commits in milliseconds) while keeping fsyncs per write low.
    static let maxGroupSize = 1024

    /// Group commits run on the writer after another write arrived during a lone one, before the next lone one.
    ///
    /// A write that commits alone (on its caller's thread) cannot share its commit with one arriving a moment later,
    /// so contending writers committing alone would halve their groups. 64 is the value measured with the change that
    /// introduced it (commit fe8b559, Benchmarks/README.md): with 8 client loops, 8 inserting clients went from
    /// 0.77–0.86× PostgreSQL committing alone to 0.88–0.94×. It is long enough to outlast a burst of contending
    /// writers (64 fsyncs) and short enough that a writer left alone soon saves its thread hop again.
    static let groupsAfterContention = 64

    /// Groups committed with a savepoint per write after one whose writes, committed without, had one fail.
    ///
    /// Failing writes come in runs (a client retrying against a missing document, a batch hitting a limit), and a
    /// failure without savepoints costs its group's transaction twice; without this run of savepoint groups, a run of
    /// failures would redo every group. After 16 groups commit without savepoints again, so a lone failure costs at
    /// most 16 groups their savepoints. The value is a judgement from commit cc4bcb3, not a fitted measurement.
    static let savepointGroupsAfterFailure = 16

    /// The queue of writes and the scheduling state, under one lock.
    struct Queue {
        /// Writes waiting for the next group, in arrival order.
        var waiting: [PendingWrite] = []
        /// Whether a commit (a group on the writer, or a lone one) is scheduled or running.
        var scheduled = false
        /// Group commits that must run before a write may commit alone again.
        var groupsBeforeAlone = 0
    }

    /// The queue of writes and the scheduling state.
    private let queue = Mutex(Queue())
    /// Group commits run and the writes they carried.
    private let counts = Mutex(GroupCommitCounts())
    /// How many more groups commit with a savepoint per write (set after a group had a failing write).
    private let savepointGroupsLeft = Mutex(0)

    /// An idle committer: nothing queued, nothing counted.
    init() {}

    /// Queues `write`; true when no commit was scheduled, and the caller must now schedule one (it is marked
    /// scheduled).
    func enqueue(_ write: PendingWrite) -> Bool {
        queue.withLock { state -> Bool in
            state.waiting.append(write)
            guard !state.scheduled else { return false }
            state.scheduled = true
            return true
        }
    }

    /// True when a write may commit alone now: nothing queued or running, and no contention seen in the last
    /// `groupsAfterContention` groups. It is then marked scheduled, so that writes arriving meanwhile queue.
    func claimLone() -> Bool {
        queue.withLock { state -> Bool in
            guard !state.scheduled, state.waiting.isEmpty, state.groupsBeforeAlone == 0 else { return false }
            state.scheduled = true
            return true
        }
    }

    /// Takes the next group (at most `maxGroupSize` writes, oldest first) and counts one group toward a lone commit.
    func takeGroup() -> [PendingWrite] {
        queue.withLock { state -> [PendingWrite] in
            let taken = Array(state.waiting.prefix(Self.maxGroupSize))
            state.waiting.removeFirst(taken.count)
            state.groupsBeforeAlone = max(0, state.groupsBeforeAlone - 1)
            return taken
        }
    }

    /// Counts a commit that carried `writes` writes (before anyone learns the outcome, so a caller that saw its
    /// write done sees it counted).
    func count(writes: Int) {
        counts.withLock {
            $0.groups += 1
            $0.writes += writes
        }
    }

    /// Ends a commit; true when writes arrived during it, and the caller must schedule the next group. After a lone
    /// commit (`afterLone`) such writes also keep the next `groupsAfterContention` groups on the writer.
    func finish(afterLone: Bool) -> Bool {
        queue.withLock { state -> Bool in
            state.scheduled = !state.waiting.isEmpty
            if afterLone && state.scheduled { state.groupsBeforeAlone = Self.groupsAfterContention }
            return state.scheduled
        }
    }

    /// Whether the next group of several writes commits without savepoints (else one of the groups after a failure
    /// is used up).
    func nextGroupWithoutSavepoints() -> Bool {
        savepointGroupsLeft.withLock { left -> Bool in
            guard left > 0 else { return true }
            left -= 1
            return false
        }
    }

    /// A group committed without savepoints had a write fail: it and the next `savepointGroupsAfterFailure` groups
    /// commit with a savepoint per write.
    func writeFailedWithoutSavepoints() {
        savepointGroupsLeft.withLock { $0 = Self.savepointGroupsAfterFailure }
    }

    /// Group commits run and the writes they carried so far.
    var statistics: GroupCommitCounts { counts.withLock { $0 } }

    /// Whether a commit is scheduled or running.
    var isScheduled: Bool { queue.withLock { $0.scheduled } }

    /// Writes waiting for the next group.
    var queuedCount: Int { queue.withLock { $0.waiting.count } }

    /// Groups still to commit with savepoints after a failure.
    var savepointGroupsRemaining: Int { savepointGroupsLeft.withLock { $0 } }
}
