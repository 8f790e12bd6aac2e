import Foundation
import GRDB
import GRDBSQLite
import Synchronization

/// A read that ran out of its budget of SQLite steps (`ReadBudget.inline`) before it finished: the caller should run
/// it again where it may take as long as it needs (the daemon's I/O pool rather than an event loop).
public struct ReadBudgetExceeded: Error, Sendable {
    /// Creates the error.
    public init() {}
}

/// How much work one read may do before it gives up with `ReadBudgetExceeded`.
public enum ReadBudget: Sendable {
    /// No bound: the read runs to completion.
    case unbounded
    /// About `ReadConnections.inlineOpcodes` SQLite virtual-machine steps: an indexed page of results or a point
    /// read fits many times over; a scan of a large collection does not.
    case inline
}

/// The read connections of one database: its one read pool, `slotCount` read-only GRDB `DatabaseQueue`s in slots.
///
/// Request-path reads (`doc.get`, `query.find`, `query.count`: `read(budget:)`) use a slot's raw SQLite handle
/// directly, with prepared statements, while holding the slot's lock. Handing a connection over through a dispatch
/// queue and semaphores on every read, as GRDB's `read` does, cost futex waits and context switches per request with
/// two event loops reading at once (measured: 2.4 futex calls per `doc.get` under 8 clients). A thread takes the first
/// slot it finds free, starting from one chosen by its identity, so the threads that read all the time (the event
/// loops) keep to their own connection without waiting. Other reads (`read { Database in … }`) run through the same
/// slot's GRDB queue, in a transaction of their own. When every slot is busy a read waits for one to be freed (an
/// inline-budgeted read throws `ReadBudgetExceeded` instead, for its caller to run it where it may wait).
///
/// GRDB does not mind its handle being used between its own calls: it keeps no transaction state of its own
/// (`isInsideTransaction` asks SQLite) and checks only that no transaction is left open at the end of its own calls,
/// which a GRDB read ensures by ending the raw snapshot first. The slot's lock serializes both uses.
///
/// The connections map the database file into memory (`mmap_size`), so reading a page is a memory access instead of a
/// `pread` into each connection's private cache. Each keeps its prepared statements (at most
/// `BlazeDatabase.maxCachedQueryShapes` query shapes; others are prepared per run). They only read (read-only open).
///
/// Snapshots outlive one fast read while nothing commits. Starting and ending a read transaction takes and drops a WAL
/// read lock (two `fcntl` calls and a lock shared by every connection of the file): a connection instead keeps its
/// read transaction open across reads, tagged with the database's commit count (`committed()`, called by the
/// writer's WAL hook after every commit) when it began. A read whose tag is still the current count sees everything
/// committed, so it runs in that snapshot; otherwise the snapshot is ended and a new one begun. A read that ends
/// with the count moved on ends its snapshot at once. An open snapshot holds back the checkpoint of later frames, so
/// before each checkpoint `releaseIdle()` ends the snapshots of connections nobody is using.
///
/// Every write is acknowledged after its commit returns, so after the WAL hook: a client that was told its write
/// is done reads it, whichever connection answers.
final class ReadConnections: Sendable {
    /// Connection slots: the most reads that run at once on one database; more wait for a slot.
    static let slotCount = 6
    /// SQLite virtual-machine steps between two checks of a read's budget.
    static let progressPeriod: Int32 = 100
    /// The budget of an inline read, in SQLite virtual-machine steps.
    static let inlineOpcodes = 20_000
    /// Bytes of the database file each connection maps into memory.
    static let mmapBytes = 1 << 30

    private let path: String
    private let maxStatements: Int
    private let slots: [Slot]
    private let closed = Atomic<Bool>(false)
    /// Commits of the database since it was opened (`committed()`).
    private let commits = Atomic<UInt64>(0)
    /// Reads waiting for a slot; a read that frees its slot wakes them when there are any.
    private let waiting = Atomic<Int>(0)
    /// Signalled when a slot is freed while reads wait.
    private let freed = SlotSignal()

    /// Slots for the database file at `path` (opened lazily, on each slot's first use).
    init(path: String, maxStatements: Int) {
        self.path = path
        self.maxStatements = maxStatements
        slots = (0..<Self.slotCount).map { _ in Slot() }
    }

    /// Runs `body` on a connection's raw handle within `budget`, in a snapshot that has every acknowledged commit.
    func read<T>(budget: ReadBudget, _ body: (ReadConnection) throws -> T) throws -> T {
        var result: T?
        try withConnection(wait: budget != .inline) { connection in
            connection.remaining = budget == .inline ? Self.inlineOpcodes / Int(Self.progressPeriod) : Int.max
            try connection.snapshot(current: commits.load(ordering: .acquiring))
            do {
                result = try body(connection)
            } catch {
                connection.endSnapshot()
                throw error
            }
            connection.endSnapshot(unlessCurrent: commits.load(ordering: .acquiring))
        }
        return result!
    }

    /// Runs `body` through a connection's GRDB queue in a read transaction of its own, one snapshot throughout (the
    /// raw snapshot is ended first: GRDB begins its own transaction, and one begun after the read was asked for has
    /// every acknowledged commit).
    func read<T>(_ body: (Database) throws -> T) throws -> T {
        var result: T?
        try withConnection(wait: true) { connection in
            connection.endSnapshot()
            connection.remaining = Int.max
            result = try connection.queue.read { db in
                // Takes the snapshot now, as GRDB's reader pool does: `BEGIN DEFERRED` alone takes none, and work
                // that opens and closes its own (an online backup) would otherwise see another commit than the rest.
                _ = try Int.fetchOne(db.cachedStatement(sql: "SELECT rootpage FROM sqlite_master LIMIT 1"))
                return try body(db)
            }
        }
        return result!
    }

    /// Runs `body` with a free connection, opening it on first use; waits for a slot when every one is busy (unless
    /// `wait` is false: then `ReadBudgetExceeded`).
    private func withConnection(wait: Bool, _ body: (ReadConnection) throws -> Void) throws {
        let first = Self.preferredSlot()
        var waited = false
        defer { if waited { waiting.subtract(1, ordering: .relaxed) } }
        while true {
            guard !closed.load(ordering: .acquiring) else { throw Self.closedError }
            for k in 0..<slots.count {
                let outcome = slots[(first + k) % slots.count].connection.withLockIfAvailable {
                    slot -> Result<Void, any Error> in
                    if closed.load(ordering: .acquiring) { return .failure(Self.closedError) }
                    return Result {
                        let connection = try slot ?? ReadConnection(path: path, maxStatements: maxStatements)
                        slot = connection
                        try body(connection)
                    }
                }
                guard let outcome else { continue }  // busy: try the next slot
                if waiting.load(ordering: .relaxed) > 0 { freed.signal() }
                return try outcome.get()
            }
            guard wait else { throw ReadBudgetExceeded() }
            if !waited {
                waited = true
                waiting.add(1, ordering: .relaxed)
            }
            freed.wait()
        }
    }

    /// The error of a read after `close()`.
    private static var closedError: DatabaseError { DatabaseError(resultCode: .SQLITE_MISUSE, message: "Connection is closed") }

    /// Counts a commit of the database (called by the writer after each one, before it is acknowledged).
    func committed() {
        commits.add(1, ordering: .releasing)
    }

    /// Ends the open snapshot of every connection not in use, so that a checkpoint can copy every frame.
    func releaseIdle() {
        for slot in slots { slot.connection.withLockIfAvailable { $0?.endSnapshot() } }
    }

    /// Closes every connection; later reads fail.
    func close() {
        closed.store(true, ordering: .releasing)
        for slot in slots {
            slot.connection.withLock { connection in
                connection?.close()
                connection = nil
            }
        }
        freed.signal()
    }

    deinit {
        for slot in slots { slot.connection.withLock { $0?.close() } }
    }

    /// One connection, opened on first use, behind its own lock.
    private final class Slot: Sendable {
        let connection = Mutex<ReadConnection?>(nil)
    }

    /// The slot this thread tries first: a hash of its identity, so two threads rarely start at the same one.
    private static func preferredSlot() -> Int { threadShard(slotCount) }
}

/// Wakes the reads that wait for a slot (they also look again every few milliseconds, so a wake-up that comes
/// between a look and the wait costs that long at most).
private final class SlotSignal: @unchecked Sendable {
    private let condition = NSCondition()

    /// Wakes every waiting read.
    func signal() {
        condition.lock()
        condition.broadcast()
        condition.unlock()
    }

    /// Waits until a slot is freed, or a few milliseconds.
    func wait() {
        condition.lock()
        _ = condition.wait(until: Date(timeIntervalSinceNow: 0.002))
        condition.unlock()
    }
}

/// One read-only SQLite connection and its prepared statements.
///
/// `@unchecked Sendable`: it lives in a `ReadConnections` slot and is used only while that slot's lock is held (the
/// lock is the synchronization; the type system cannot see that a closure given the connection does not keep it).
final class ReadConnection: @unchecked Sendable {
    /// The GRDB queue that owns the connection: GRDB-style reads run through it.
    let queue: DatabaseQueue
    /// The queue's SQLite handle, used directly by the fast reads (only while the slot's lock is held).
    private var handle: OpaquePointer?
    private var statements: [String: OpaquePointer] = [:]
    private let maxStatements: Int
    /// The commit count when the open read transaction began; nil when none is open.
    private var snapshotTag: UInt64?
    /// Progress-handler calls left before the running statement is interrupted.
    fileprivate var remaining = Int.max

    /// Opens a read-only connection to the database file at `path`.
    init(path: String, maxStatements: Int) throws {
        self.maxStatements = maxStatements
        var config = Configuration()
        // Read-only: opening never creates the file (a request still holding a dropped database must not bring it
        // back), and the connection cannot write.
        config.readonly = true
        config.label = "blazedb.read"
        // The writer waits at most this long for a lock; a reader in WAL mode waits only while the log restarts.
        config.busyMode = .timeout(10)
        queue = try DatabaseQueue(path: path, configuration: config)
        let db = queue.inDatabase { $0.sqliteConnection }
        handle = db
        try execute("PRAGMA mmap_size = \(ReadConnections.mmapBytes)")
        sqlite3_progress_handler(db, ReadConnections.progressPeriod, progressCheck, Unmanaged.passUnretained(self).toOpaque())
    }

    /// Makes the connection read in a snapshot that has every commit counted up to `current`.
    fileprivate func snapshot(current: UInt64) throws {
        if let tag = snapshotTag {
            if tag == current { return }
            endSnapshot()
        }
        // The snapshot itself is taken by the first read after BEGIN, which comes after `current` was loaded.
        try execute("BEGIN DEFERRED")
        snapshotTag = current
    }

    /// Ends the open read transaction, if any (always when `unlessCurrent` is nil, else only when it is stale).
    fileprivate func endSnapshot(unlessCurrent current: UInt64? = nil) {
        if let current, snapshotTag == current { return }
        snapshotTag = nil
        remaining = Int.max  // a read that ran out of its budget must not have its COMMIT interrupted too
        guard let handle, sqlite3_get_autocommit(handle) == 0 else { return }
        _ = try? execute("COMMIT")
    }

    /// Finalizes the prepared statements, ends the snapshot and closes the connection.
    fileprivate func close() {
        for (_, statement) in statements { sqlite3_finalize(statement) }
        statements = [:]
        endSnapshot()
        if handle != nil { try? queue.close() }
        handle = nil
    }

    private func execute(_ sql: String) throws {
        var message: UnsafeMutablePointer<CChar>?
        let code = sqlite3_exec(handle, sql, nil, nil, &message)
        defer { sqlite3_free(message) }
        guard code == SQLITE_OK else {
            throw DatabaseError(resultCode: ResultCode(rawValue: code), message: message.map { String(cString: $0) }, sql: sql)
        }
    }

    /// Runs `sql` with `arguments` bound and calls `row` for each result row until it returns false.
    func query(_ sql: String, _ arguments: [DatabaseValue], row: (Row) throws -> Bool) throws {
        let (statement, cached) = try prepare(sql)
        defer {
            if cached {
                sqlite3_reset(statement)
                sqlite3_clear_bindings(statement)
            } else {
                sqlite3_finalize(statement)
            }
        }
        for (i, value) in arguments.enumerated() { bind(statement, Int32(i + 1), value) }
        while true {
            switch sqlite3_step(statement) {
            case SQLITE_ROW:
                if try !row(Row(handle: statement)) { return }
            case SQLITE_DONE:
                return
            case SQLITE_INTERRUPT where remaining <= 0:
                throw ReadBudgetExceeded()
            case let code:
                throw DatabaseError(
                    resultCode: ResultCode(rawValue: code), message: String(cString: sqlite3_errmsg(handle)), sql: sql)
            }
        }
    }

    /// Runs `sql` with `arguments` bound and reads its first row with `read`; nil when it returns none.
    func first<T>(_ sql: String, _ arguments: [DatabaseValue], _ read: (Row) -> T) throws -> T? {
        var result: T?
        try query(sql, arguments) { row in
            result = read(row)
            return false
        }
        return result
    }

    private func prepare(_ sql: String) throws -> (OpaquePointer, cached: Bool) {
        if let statement = statements[sql] { return (statement, true) }
        var statement: OpaquePointer?
        let code = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard code == SQLITE_OK, let statement else {
            throw DatabaseError(resultCode: ResultCode(rawValue: code), message: String(cString: sqlite3_errmsg(handle)), sql: sql)
        }
        guard statements.count < maxStatements else { return (statement, false) }
        statements[sql] = statement
        return (statement, true)
    }

    private func bind(_ statement: OpaquePointer, _ index: Int32, _ value: DatabaseValue) {
        switch value.storage {
        case .null: sqlite3_bind_null(statement, index)
        case .int64(let i): sqlite3_bind_int64(statement, index, i)
        case .double(let d): sqlite3_bind_double(statement, index, d)
        case .string(let s): sqlite3_bind_text(statement, index, s, -1, transient)
        case .blob(let data):
            _ = data.withUnsafeBytes { sqlite3_bind_blob(statement, index, $0.baseAddress, Int32($0.count), transient) }
        }
    }

    /// The columns of the current result row; valid only inside the `row` closure of `query`.
    struct Row {
        let handle: OpaquePointer

        /// Column `index` (0-based) as the bytes of its text; nil when NULL.
        func textBytes(_ index: Int32) -> [UInt8]? {
            guard sqlite3_column_type(handle, index) != SQLITE_NULL, let bytes = sqlite3_column_text(handle, index)
            else { return nil }
            return Array(UnsafeBufferPointer(start: bytes, count: Int(sqlite3_column_bytes(handle, index))))
        }

        /// Column `index` (0-based) as an integer.
        func int64(_ index: Int32) -> Int64 { sqlite3_column_int64(handle, index) }

        /// Column `index` (0-based) as GRDB's value.
        func value(_ index: Int32) -> DatabaseValue { DatabaseValue(sqliteStatement: handle, index: index) }
    }
}

/// SQLite's "copy the value now" destructor marker (`SQLITE_TRANSIENT`, a macro Swift does not import).
private let transient = unsafeBitCast(OpaquePointer(bitPattern: -1), to: sqlite3_destructor_type.self)

/// Interrupts the running statement once its connection's budget is spent.
private func progressCheck(_ context: UnsafeMutableRawPointer?) -> Int32 {
    guard let context else { return 0 }
    let connection = Unmanaged<ReadConnection>.fromOpaque(context).takeUnretainedValue()
    connection.remaining -= 1
    return connection.remaining < 0 ? 1 : 0
}
