import GRDB
import Synchronization

/// The one place a database's SQLite file is opened and talked to: one writer connection, one pool of read
/// connections, and the checkpointer's connection.
///
/// - The writer is a GRDB `DatabaseQueue` in WAL mode with `synchronous = FULL`, the WAL write buffer
///   (`WALWriteBuffer`) and the checkpointer's WAL hook: every write, group commit and migration runs on it.
/// - Reads run on `ReadConnections`, `ReadConnections.slotCount` read-only GRDB `DatabaseQueue`s in slots. A
///   request-path read (`read(budget:)`: `doc.get`, `query.find`, `query.count`) uses a slot's raw SQLite handle
///   directly with prepared statements and snapshots kept across reads (no dispatch to GRDB's queue: that hand-over
///   cost futex waits per request); every other read (`read { Database in … }`) runs through the same slot's GRDB
///   queue in its own transaction. When every slot is busy a read waits for one (an inline-budgeted one gives up).
/// - The checkpointer (`Checkpointer`) has its own connection, and copies the WAL back off the writer's commit path.
final class DatabaseConnections: Sendable {
    /// The writer connection.
    private let writer: DatabaseQueue
    /// The read connections.
    let readers: ReadConnections
    /// Runs WAL checkpoints off the writer's commit path.
    let checkpointer: Checkpointer
    /// Rewrites of the whole file since it was opened (`vacuum`): each may give rows of tables without an `INTEGER
    /// PRIMARY KEY` new rowids, so a rowid noted before one names no particular row after it.
    let rewrites = Atomic<UInt64>(0)
    /// Writes queued for the writer that have not started: a writer with long transactions (a sync session storing
    /// groups of batches) keeps them short while any wait.
    let writesWaiting = Atomic<Int>(0)

    /// Opens the database file at `path` (creating it), migrates it with `migrator`, and sets up the writer's WAL
    /// buffering and checkpoints.
    init(path: String, label: String, limits: StoreLimits, migrator: DatabaseMigrator, analysisLimit: Int) throws {
        WALWriteBuffer.install()
        var config = Configuration()
        config.label = label
        config.busyMode = .timeout(10)
        // The vector indexes' triggers decode vectors with it (VectorIndexSQL).
        config.prepareDatabase { db in db.add(function: VectorIndexSQL.function) }
        // Before anything writes to it: a file of a newer build is refused, one of an older build copied.
        try DatabaseFormat.prepare(path: path, migrator: migrator)
        writer = try DatabaseQueue(path: path, configuration: config)
        readers = ReadConnections(path: path, maxStatements: BlazeDatabase.maxCachedQueryShapes + 8)
        // WAL: readers never wait for the writer, and the writer's commits append to the log.
        let mode = try writer.writeWithoutTransaction { db in try String.fetchOne(db, sql: "PRAGMA journal_mode = WAL") }
        guard mode?.lowercased() == "wal" else {
            throw DatabaseError(resultCode: .SQLITE_ERROR, message: "could not set WAL mode on \(path): \(mode ?? "nil")")
        }
        try Self.enableIncrementalVacuum(writer)
        // Acknowledged writes are durable: fsync the WAL on every commit (ARCHITECTURE.md, "Storage"). The writer's
        // page cache holds `writerCacheKiB`: it reads back the pages it wrote to the WAL, which SQLite's 2 MiB default
        // drops between transactions (readers map the file instead, `ReadConnections`).
        try writer.writeWithoutTransaction { db in
            try db.execute(
                sql: "PRAGMA synchronous = FULL; PRAGMA analysis_limit = \(analysisLimit); PRAGMA cache_size = -\(limits.writerCacheKiB)")
        }
        try migrator.migrate(writer)
        // The writer's commits sync the WAL (above), so its WAL writes may be gathered until that sync.
        _ = writer.writeWithoutTransaction { db in WALWriteBuffer.enable(on: db.sqliteConnection!) }
        let checkpointer = try Checkpointer(
            path: path, threshold: limits.walCheckpointPages, hardLimit: limits.walMaxPages,
            finishLimit: limits.walFinishPages, readers: readers)
        self.checkpointer = checkpointer
        writer.writeWithoutTransaction { checkpointer.install(on: $0) }
    }

    /// Makes freed pages returnable (`PRAGMA auto_vacuum = INCREMENTAL`, which compaction uses): set before the first
    /// table of a new file, and by one `VACUUM` for a file from before it.
    private static func enableIncrementalVacuum(_ writer: DatabaseQueue) throws {
        try writer.writeWithoutTransaction { db in
            guard try Int.fetchOne(db, sql: "PRAGMA auto_vacuum") != 2 else { return }
            try db.execute(sql: "PRAGMA auto_vacuum = INCREMENTAL")
            if try Int.fetchOne(db, sql: "PRAGMA page_count") ?? 0 > 0 { try db.execute(sql: "VACUUM") }
        }
    }

    /// Runs `updates` in one immediate write transaction on the writer; blocks until it commits.
    func write<T>(_ updates: (Database) throws -> T) throws -> T {
        writesWaiting.add(1, ordering: .relaxed)
        var started = false
        defer { if !started { writesWaiting.subtract(1, ordering: .relaxed) } }
        return try writer.write { db in
            started = true
            writesWaiting.subtract(1, ordering: .relaxed)
            return try updates(db)
        }
    }

    /// Runs `updates` on the writer outside any transaction (it begins and commits its own).
    func writeWithoutTransaction<T>(_ updates: (Database) throws -> T) rethrows -> T {
        writesWaiting.add(1, ordering: .relaxed)
        var started = false
        defer { if !started { writesWaiting.subtract(1, ordering: .relaxed) } }
        return try writer.writeWithoutTransaction { db in
            started = true
            writesWaiting.subtract(1, ordering: .relaxed)
            return try updates(db)
        }
    }

    /// Rewrites the whole file (`VACUUM`) on the writer's connection `db`, counting it in `rewrites`.
    func vacuum(_ db: Database) throws {
        rewrites.add(1, ordering: .sequentiallyConsistent)
        try db.execute(sql: "VACUUM")
    }

    /// Runs `updates` on the writer later, outside any transaction, without waiting for it.
    func asyncWriteWithoutTransaction(_ updates: @escaping @Sendable (Database) -> Void) {
        writesWaiting.add(1, ordering: .relaxed)
        writer.asyncWriteWithoutTransaction { [self] db in
            writesWaiting.subtract(1, ordering: .relaxed)
            updates(db)
        }
    }

    /// Runs `body` through GRDB in a read transaction of its own on a read connection: it sees every commit
    /// acknowledged before it started (WAL readers never wait for the writer).
    func read<T>(_ body: (Database) throws -> T) throws -> T {
        try readers.read(body)
    }

    /// Runs `body` on a read connection's raw handle within `budget` (the request-path fast reads).
    func read<T>(budget: ReadBudget, _ body: (ReadConnection) throws -> T) throws -> T {
        try readers.read(budget: budget, body)
    }

    /// Closes the read connections, the writer and the checkpointer; further use fails.
    func close() throws {
        readers.close()
        try writer.close()
        try checkpointer.close()
    }
}

