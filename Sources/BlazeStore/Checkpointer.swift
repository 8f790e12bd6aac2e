import GRDB
import GRDBSQLite
import Synchronization

/// Copies a database's write-ahead log back into the database file on its own connection and thread, so that
/// commits do not wait for it.
///
/// SQLite's automatic checkpoint runs inside the commit that crosses its threshold, on the writer. Here the writer's
/// WAL hook (which replaces that automatic checkpoint) only asks this checkpointer to run a passive checkpoint, which
/// copies frames while the writer goes on appending. Durability is unchanged: every commit still syncs the WAL.
///
/// SQLite starts the log over from its first frame only once every frame is copied, which a checkpoint running
/// beside a busy writer never sees: the writer appends while it copies. So once a background checkpoint has copied
/// all but `finishLimit` frames, the writer copies that rest itself after its next commit (a few hundred frames
/// instead of thousands) and the log restarts, reusing the file's pages instead of growing it. If checkpoints fall
/// behind and the WAL reaches `hardLimit` frames, the writer checkpoints itself after its commit, as SQLite would, so
/// the log stays bounded.
final class Checkpointer: Sendable {
    /// WAL frames (pages) after which a checkpoint is requested (SQLite's automatic-checkpoint threshold is 1,000).
    let threshold: Int32
    /// WAL frames after which the writer checkpoints itself.
    let hardLimit: Int32
    /// Frames past a completed background checkpoint that the writer copies itself so that the log can restart.
    let finishLimit: Int32

    private let connection: DatabaseQueue
    /// The request-path read connections: told of every commit, and asked to let go of idle snapshots before a
    /// checkpoint.
    private let readers: ReadConnections?
    /// Whether a checkpoint is queued and not started yet, whether the checkpointer is closed, and the log's size
    /// in frames when the last background checkpoint started if it copied all of them (0 when none did since the
    /// writer last checkpointed).
    private let state = Mutex<(queued: Bool, closed: Bool, copied: Int32)>((false, false, 0))

    /// Opens the checkpointing connection to the database at `path` (its schema must already exist).
    init(path: String, threshold: Int32, hardLimit: Int32, finishLimit: Int32, readers: ReadConnections? = nil) throws {
        self.readers = readers
        self.threshold = threshold
        self.hardLimit = hardLimit
        self.finishLimit = finishLimit
        var config = Configuration()
        config.label = "blazedb.checkpoint"
        connection = try DatabaseQueue(path: path, configuration: config)
        try connection.writeWithoutTransaction { try $0.execute(sql: "PRAGMA synchronous = FULL") }
    }

    /// Makes `writer`'s commits request checkpoints from this checkpointer instead of running them; call on the
    /// writer's queue. The checkpointer must stay alive as long as the writer connection is open.
    func install(on writer: Database) {
        sqlite3_wal_hook(writer.sqliteConnection, walHook, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Called after each commit of the writer with the WAL's size in frames.
    fileprivate func committed(frames: Int32, writer: OpaquePointer?) {
        readers?.committed()
        let copied = state.withLock { s -> Int32 in
            if frames < s.copied { s.copied = 0 }  // the log restarted since
            return s.copied
        }
        switch step(frames: frames, copied: copied) {
        case .none: break
        case .schedule: schedule()
        case .checkpoint:
            state.withLock { $0.copied = 0 }
            readers?.releaseIdle()
            sqlite3_wal_checkpoint_v2(writer, nil, SQLITE_CHECKPOINT_PASSIVE, nil, nil)
        }
    }

    /// What the writer does after a commit.
    enum Step: Equatable {
        /// Nothing: the log is small.
        case none
        /// Ask the background connection for a checkpoint.
        case schedule
        /// Checkpoint on the writer: the log reached the hard limit, or a background checkpoint left little to copy.
        case checkpoint
    }

    /// The writer's step after a commit that left `frames` frames in the log, when the last background checkpoint
    /// copied the first `copied` of them (0 when none did since the writer last checkpointed).
    func step(frames: Int32, copied: Int32) -> Step {
        if frames >= hardLimit { return .checkpoint }
        guard frames >= threshold else { return .none }
        return copied > 0 && frames >= copied && frames - copied <= finishLimit ? .checkpoint : .schedule
    }

    private func schedule() {
        let queue = state.withLock { s -> Bool in
            guard !s.queued, !s.closed else { return false }
            s.queued = true
            return true
        }
        guard queue else { return }
        connection.asyncWriteWithoutTransaction { [self] db in
            // Cleared before running: a commit during this checkpoint queues the next one.
            state.withLock { $0.queued = false }
            readers?.releaseIdle()
            // PASSIVE waits for no one; a busy or partial checkpoint is simply retried after a later commit.
            var log: Int32 = 0
            var copied: Int32 = 0
            let rc = sqlite3_wal_checkpoint_v2(db.sqliteConnection, nil, SQLITE_CHECKPOINT_PASSIVE, &log, &copied)
            state.withLock { $0.copied = rc == SQLITE_OK && log > 0 && copied == log ? log : 0 }
        }
    }

    /// Waits until the checkpoint queued or running now (if any) has finished.
    func drain() {
        connection.inDatabase { _ in }
    }

    /// Waits for a running checkpoint and closes the connection; no checkpoint starts afterwards. Idempotent.
    func close() throws {
        let wasClosed = state.withLock { s in
            defer { s.closed = true }
            return s.closed
        }
        guard !wasClosed else { return }
        drain()
        try connection.close()
    }
}

/// The writer's WAL hook: `context` is the unretained `Checkpointer`.
private func walHook(
    _ context: UnsafeMutableRawPointer?, _ db: OpaquePointer?, _ name: UnsafePointer<CChar>?, _ frames: Int32
) -> Int32 {
    guard let context else { return SQLITE_OK }
    Unmanaged<Checkpointer>.fromOpaque(context).takeUnretainedValue().committed(frames: frames, writer: db)
    return SQLITE_OK
}
