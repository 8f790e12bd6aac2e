import BlazeCRDT
import CoreMetrics
import Foundation
import GRDB

/// Group commit: single-operation writes from many callers that arrive while a commit is in flight are committed
/// together, in one SQLite transaction and one WAL fsync, each still its own replicated change.
///
/// The first write to arrive schedules a commit on the writer; every write that arrives before that commit starts
/// joins it, and those arriving during it form the next one. One that fails (a missing document, a limit) fails alone,
/// and only the changes kept publish their feed entries: a group is first committed without savepoints
/// (`commitChained`), and when one of its writes fails it is rolled back and redone with each operation in
/// its own savepoint, so the failing one is rolled back alone. Nothing is acknowledged before the commit that covers
/// it returns (`synchronous = FULL`: after its fsync). The queue, the scheduling state, the savepoint fallback and the
/// statistics are `GroupCommitter`'s (`groupCommitter`); this extension runs the commits it decides on.
extension BlazeDatabase {
    /// Queues `op` as one change for the next group commit; `completion` runs once it is durable (or failed), on the
    /// writer's thread, so it must only hand the result on. With `here`, when no group commit is queued or running,
    /// `op` commits on the calling thread instead (blocking it through the fsync) and `completion` runs before this
    /// returns.
    public func submit(
        _ op: WriteOp, here: Bool = false, completion: @escaping @Sendable (Result<WriteResult, any Error>) -> Void
    ) {
        if here, let result = commitAlone(op) { return completion(result) }
        if groupCommitter.enqueue(PendingWrite(op: op, completion: completion)) { scheduleGroupCommit() }
    }

    /// Runs `op` on the calling thread when no group commit is queued or running (one caller alone pays no thread
    /// hop); nil when one is, and then the caller joins the queue. Writes that arrive meanwhile form the next group.
    ///
    /// A write that commits alone cannot share its commit: one that arrives a moment later waits for it, then commits
    /// in the next group. That is the price of the saved hop for a lone writer; with several writers it would halve
    /// their groups. So once a write arrives while one commits alone, the next `GroupCommitter.groupsAfterContention` group commits
    /// run on the writer (where writes arriving together share one) before a write may commit alone again.
    func commitAlone(_ op: WriteOp) -> Result<WriteResult, any Error>? {
        guard groupCommitter.claimLone() else { return nil }
        let started = ContinuousClock.now
        let result = connections.writeWithoutTransaction { db in commitGroup(db, [op])[0] }
        metrics?.recordGroup(size: 1, started: started)
        groupCommitter.count(writes: 1)
        finishGroup(afterLone: true)
        return result
    }

    private func scheduleGroupCommit() {
        connections.asyncWriteWithoutTransaction { [self] db in
            let group = groupCommitter.takeGroup()
            let started = ContinuousClock.now
            let results = commitGroup(db, group.map(\.op))
            metrics?.recordGroup(size: group.count, started: started)
            // Counted before anyone learns the outcome, so a caller that saw its write done sees it counted.
            groupCommitter.count(writes: group.count)
            for (pending, result) in zip(group, results) { pending.completion(result) }
            finishGroup()
        }
    }

    /// After a group: writes that arrived during its commit form the next one; other writers' work may run between.
    /// After a lone commit (`afterLone`), writes that arrived during it also keep the next ones on the writer.
    private func finishGroup(afterLone: Bool = false) {
        if groupCommitter.finish(afterLone: afterLone) { scheduleGroupCommit() }
    }

    /// Group commits run and the writes they carried since the database was opened.
    public var groupCommitCounts: GroupCommitCounts { groupCommitter.statistics }

    /// Commits each of `ops` as its own change in one transaction; returns each one's outcome (all fail alike when the
    /// transaction cannot commit).
    func commitGroup(_ db: Database, _ ops: [WriteOp]) -> [Result<WriteResult, any Error>] {
        guard !ops.isEmpty else { return [] }
        if ops.count == 1 {
            // Alone in its group: the transaction is its savepoint.
            do {
                return [.success(try localTransaction(db) { try $0.apply(ops[0]) })]
            } catch {
                return [.failure(error)]
            }
        }
        if groupCommitter.nextGroupWithoutSavepoints() {
            switch commitChained(db, ops, savepoints: false) {
            case .committed(let results): return results
            case .failed(let error): return ops.map { _ in .failure(error) }
            case .opFailed:
                // Redone with a savepoint per op; the next groups too, as failures tend to come in runs.
                groupCommitter.writeFailedWithoutSavepoints()
            }
        }
        switch commitChained(db, ops, savepoints: true) {
        case .committed(let results): return results
        case .failed(let error): return ops.map { _ in .failure(error) }
        case .opFailed: preconditionFailure("with savepoints a failing op fails alone")
        }
    }

    /// How `commitChained` ended.
    enum GroupOutcome {
        /// Committed: every op's result (with savepoints, a failed op's error in its place).
        case committed([Result<WriteResult, any Error>])
        /// Without savepoints, an op failed: the transaction was rolled back and nothing of it kept.
        case opFailed
        /// The transaction could not begin or commit: every op failed with `error`.
        case failed(any Error)
    }

    /// Commits each of `ops` as its own change in one transaction.
    ///
    /// With `savepoints`, each op runs in its own savepoint, so one that fails is rolled back alone and fails alone.
    /// Without, an op that fails rolls back the whole transaction (`opFailed`), for the caller to redo the group with
    /// savepoints. Most groups have no failing write, and a savepoint is not free: SQLite copies every page a write
    /// changes that an earlier write of the transaction had already changed into a statement journal, which spills to
    /// a temporary file past 64 KiB (with SQL parsed for each savepoint, a fifth of a grouped write's CPU).
    func commitChained(_ db: Database, _ ops: [WriteOp], savepoints: Bool) -> GroupOutcome {
        var results: [Result<WriteResult, any Error>] = []
        results.reserveCapacity(ops.count)
        var afterCommit: [@Sendable () -> Void] = []
        var opFailed = false
        do {
            try Self.inWriteTransaction(db, commitTimer: metrics?.commitDuration) {
                var chain = try ChangeChain(self, db)
                for op in ops {
                    do {
                        let storage = chain.nextStorage(self, db)
                        var kept: WriteResult?
                        if savepoints {
                            try db.inSavepoint {
                                kept = try localChange(storage) { try $0.apply(op) }
                                return .commit
                            }
                        } else {
                            kept = try localChange(storage) { try $0.apply(op) }
                        }
                        if let kept {
                            results.append(.success(kept))
                            try chain.keep(storage)
                        }
                    } catch where savepoints {
                        results.append(.failure(error))
                    } catch {
                        opFailed = true
                        throw error
                    }
                }
                afterCommit = chain.afterCommit
            }
        } catch {
            return opFailed ? .opFailed : .failed(error)
        }
        for action in afterCommit { action() }
        return .committed(results)
    }

    /// Local changes written one after another in one transaction: each starts from the feed position and the
    /// versions the one kept before it left (the committed ones for the first), and their after-commit work is
    /// collected to run once the transaction commits.
    struct ChangeChain {
        private var feedSequence: Int64
        private var feedTotal: Int64
        private var versions: VersionVector
        /// The kept changes' work due after the commit.
        private(set) var afterCommit: [@Sendable () -> Void] = []

        /// Starts from what `database` has committed.
        init(_ database: BlazeDatabase, _ db: Database) throws {
            (feedSequence, feedTotal) = (database.feed.lastSequence, database.feed.totals.last)
            versions = try database.committedVersions.value(db)
        }

        /// The storage of the next change.
        func nextStorage(_ database: BlazeDatabase, _ db: Database) -> SQLStorage {
            let storage = database.makeStorage(db, feedSequence: feedSequence, feedTotal: feedTotal, startVersions: versions)
            storage.collectsAfterCommit = true
            return storage
        }

        /// Takes in the change recorded in `storage` (its savepoint, if any, was released).
        mutating func keep(_ storage: SQLStorage) throws {
            afterCommit += storage.afterCommit
            (feedSequence, feedTotal) = (storage.feedSequence, storage.feedTotal)
            versions = try storage.versionVector()
        }
    }

    /// Runs `body` as one local change in its own transaction on the writer's connection `db` (outside any
    /// transaction); the work due after the commit runs before this returns, so before the writer's next transaction.
    func localTransaction<T>(_ db: Database, _ body: (WriteTransaction) throws -> T) throws -> T {
        let storage = makeStorage(db, startVersions: try committedVersions.value(db))
        // Collected and run here rather than registered with GRDB: each registered hook observes every statement.
        storage.collectsAfterCommit = true
        var result: T?
        try Self.inWriteTransaction(db, commitTimer: metrics?.commitDuration) { result = try localChange(storage, body) }
        for action in storage.afterCommit { action() }
        return result!
    }

    /// Runs `body` in an immediate write transaction begun and ended through SQLite's C API, rolled back if `body` or
    /// the commit throws. (GRDB's `inTransaction` parses its BEGIN statement on every call: a tenth of a single
    /// insert's CPU.) Nothing here is hidden from GRDB that it tracks: it reads the transaction state from SQLite.
    /// `commitTimer` (when given) records the `COMMIT` statement's time.
    static func inWriteTransaction(_ db: Database, commitTimer: CoreMetrics.Timer? = nil, _ body: () throws -> Void) throws {
        try RawStatement(db, "BEGIN IMMEDIATE TRANSACTION").run()
        do {
            try body()
            let committing = commitTimer.map { _ in ContinuousClock.now }
            try RawStatement(db, "COMMIT TRANSACTION").run()
            if let commitTimer, let committing {
                commitTimer.recordNanoseconds(StoreMetrics.nanoseconds(since: committing))
            }
        } catch {
            // SQLite may have rolled back already (some I/O errors do).
            if db.isInsideTransaction { _ = try? RawStatement(db, "ROLLBACK TRANSACTION").run() }
            throw error
        }
    }
}
