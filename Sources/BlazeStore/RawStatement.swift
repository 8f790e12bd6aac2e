import GRDB
import GRDBSQLite

/// SQLite's "the value stays valid until it is unbound" destructor marker (`SQLITE_STATIC`, a macro Swift does not
/// import): the buffers bound are used in place, without a copy.
private let unmanaged = unsafeBitCast(OpaquePointer(bitPattern: 0), to: sqlite3_destructor_type.self)

/// A value a `RawStatement` binds in place for the duration of one run.
protocol RawArgument {
    /// Binds this value to parameter `index` of `statement` and calls `body` while the binding is valid.
    func withBinding<R>(_ statement: SQLiteStatement, _ index: Int32, _ body: () throws -> R) rethrows -> R
}

extension String: RawArgument {
    func withBinding<R>(_ statement: SQLiteStatement, _ index: Int32, _ body: () throws -> R) rethrows -> R {
        var text = self
        return try text.withUTF8 { utf8 in
            RawStatement.bind(statement, index, utf8)
            return try body()
        }
    }
}

extension [UInt8]: RawArgument {
    func withBinding<R>(_ statement: SQLiteStatement, _ index: Int32, _ body: () throws -> R) rethrows -> R {
        try withUnsafeBufferPointer { utf8 in
            RawStatement.bind(statement, index, utf8)
            return try body()
        }
    }
}

extension Int64: RawArgument {
    func withBinding<R>(_ statement: SQLiteStatement, _ index: Int32, _ body: () throws -> R) rethrows -> R {
        sqlite3_bind_int64(statement, index, self)
        return try body()
    }
}

/// Bytes bound as a BLOB (a `[UInt8]` binds as text).
struct Blob: RawArgument {
    let bytes: [UInt8]

    func withBinding<R>(_ statement: SQLiteStatement, _ index: Int32, _ body: () throws -> R) rethrows -> R {
        guard !bytes.isEmpty else {
            // A null pointer would bind NULL; an empty BLOB is a zero-length one.
            sqlite3_bind_zeroblob(statement, index, 0)
            return try body()
        }
        return try bytes.withUnsafeBytes { raw in
            sqlite3_bind_blob(statement, index, raw.baseAddress, Int32(raw.count), unmanaged)
            return try body()
        }
    }
}

/// A cached statement run through SQLite's C API, for the statements executed once per document (and the op log's
/// insert, once per change) and the sync log's read of a batch, once per entry.
///
/// GRDB's argument boxing and per-statement bookkeeping cost about as much as SQLite's own work on a small row.
/// These statements only insert, update or read rows inside a transaction that GRDB opened and will end (a write, or
/// the sync log's read through `DatabaseConnections.read`);
/// the database has no GRDB observers of row changes (only commit hooks, which SQLite calls itself), so nothing
/// that GRDB tracks is bypassed. Arguments are bound in place (SQLite copies none of them) for one run, which leaves
/// the statement reset with no bindings, so no binding outlives the buffer it points into. Its SQL text must not
/// also be run through GRDB's own binding: GRDB caches statements by text, so that would be the same statement, whose
/// bindings GRDB believes it set.
struct RawStatement {
    private let connection: SQLiteConnection?
    /// Held so that SQLite's statement stays alive even if GRDB drops it from its cache (after a schema change).
    private let statement: Statement
    private let handle: SQLiteStatement
    private let sql: String

    /// The cached statement for `sql` on `db`.
    init(_ db: Database, _ sql: String) throws {
        connection = db.sqliteConnection
        self.sql = sql
        statement = try db.cachedStatement(sql: sql)
        handle = statement.sqliteStatement
    }

    /// Binds UTF-8 bytes as text to the 1-based parameter `index`, in place (the bytes must outlive the binding).
    fileprivate static func bind(_ handle: SQLiteStatement, _ index: Int32, _ utf8: UnsafeBufferPointer<UInt8>) {
        // An empty buffer may have no address; SQLite reads a null pointer as NULL, so give it a valid one.
        let empty: StaticString = ""
        let base = UnsafeRawPointer(utf8.baseAddress) ?? UnsafeRawPointer(empty.utf8Start)
        sqlite3_bind_text(handle, index, base.assumingMemoryBound(to: CChar.self), Int32(utf8.count), unmanaged)
    }

    /// Runs a statement that takes no parameter and returns no row; returns the number of rows it changed.
    @discardableResult
    func run() throws -> Int { try step() }

    /// Runs a statement that returns no row with parameters `a` and `b`; see `run(_:_:_:)`.
    @discardableResult
    func run(_ a: some RawArgument, _ b: some RawArgument) throws -> Int {
        try a.withBinding(handle, 1) { try b.withBinding(handle, 2) { try step() } }
    }

    /// Runs a statement that returns no row with parameters `a`, `b`, `c` (bound in place and unbound before it
    /// returns); returns the number of rows it inserted, updated or deleted.
    @discardableResult
    func run(_ a: some RawArgument, _ b: some RawArgument, _ c: some RawArgument) throws -> Int {
        try a.withBinding(handle, 1) { try b.withBinding(handle, 2) { try c.withBinding(handle, 3) { try step() } } }
    }

    /// Runs a statement that returns no row with parameters `a` to `d`; see `run(_:_:_:)`.
    @discardableResult
    func run(_ a: some RawArgument, _ b: some RawArgument, _ c: some RawArgument, _ d: some RawArgument) throws -> Int {
        try a.withBinding(handle, 1) {
            try b.withBinding(handle, 2) { try c.withBinding(handle, 3) { try d.withBinding(handle, 4) { try step() } } }
        }
    }

    /// Runs a statement that returns no row with parameters `a` to `e`; see `run(_:_:_:)`.
    @discardableResult
    func run(
        _ a: some RawArgument, _ b: some RawArgument, _ c: some RawArgument, _ d: some RawArgument, _ e: some RawArgument
    ) throws -> Int {
        try a.withBinding(handle, 1) {
            try b.withBinding(handle, 2) {
                try c.withBinding(handle, 3) { try d.withBinding(handle, 4) { try e.withBinding(handle, 5) { try step() } } }
            }
        }
    }

    /// Binds integers to the parameters from `first` on, for the next run (which clears them).
    func bind(_ values: Int64..., from first: Int32) {
        for (i, v) in values.enumerated() { sqlite3_bind_int64(handle, first + Int32(i), v) }
    }

    private func step() throws -> Int {
        defer { clear() }
        let code = sqlite3_step(handle)
        guard code == SQLITE_DONE else { throw failure(code) }
        return Int(sqlite3_changes(connection))
    }

    /// The rowid of the connection's last inserted row.
    var lastInsertedRowID: Int64 { sqlite3_last_insert_rowid(connection) }

    /// Runs a query without parameters and reads its first row with `read`; nil when it returns none.
    func firstRow<T>(_ read: (Row) -> T) throws -> T? {
        defer { clear() }
        switch sqlite3_step(handle) {
        case SQLITE_ROW: return read(Row(handle: handle))
        case SQLITE_DONE: return nil
        case let code: throw failure(code)
        }
    }

    /// Runs a query with parameter `a` (bound in place and unbound before it returns) and reads its first row with
    /// `read`; nil when it returns none.
    func firstRow<T>(_ a: some RawArgument, _ read: (Row) -> T) throws -> T? {
        try a.withBinding(handle, 1) { try firstRow(read) }
    }

    /// Runs a query with parameters `a` and `b` (bound in place and unbound before it returns) and reads its first
    /// row with `read`; nil when it returns none.
    func firstRow<T>(_ a: some RawArgument, _ b: some RawArgument, _ read: (Row) -> T) throws -> T? {
        try a.withBinding(handle, 1) {
            try b.withBinding(handle, 2) {
                defer { clear() }
                switch sqlite3_step(handle) {
                case SQLITE_ROW: return read(Row(handle: handle))
                case SQLITE_DONE: return nil
                case let code: throw failure(code)
                }
            }
        }
    }

    /// Runs a query with parameters `a` to `c` (bound in place and unbound before it returns) and reads each row it
    /// returns with `read`, in order.
    func forEachRow(_ a: some RawArgument, _ b: some RawArgument, _ c: some RawArgument, _ read: (Row) throws -> Void) throws {
        try a.withBinding(handle, 1) {
            try b.withBinding(handle, 2) {
                try c.withBinding(handle, 3) {
                    defer { clear() }
                    while true {
                        switch sqlite3_step(handle) {
                        case SQLITE_ROW: try read(Row(handle: handle))
                        case SQLITE_DONE: return
                        case let code: throw failure(code)
                        }
                    }
                }
            }
        }
    }

    /// Columns of the current row, valid only inside `firstRow`'s or `forEachRow`'s closure.
    struct Row {
        let handle: SQLiteStatement

        /// True when column `index` (0-based) is NULL.
        func isNull(_ index: Int32) -> Bool { sqlite3_column_type(handle, index) == SQLITE_NULL }

        /// Column `index` (0-based) as an integer.
        func int64(_ index: Int32) -> Int64 { sqlite3_column_int64(handle, index) }

        /// Column `index` (0-based) as text; nil when NULL.
        func text(_ index: Int32) -> String? {
            // Ask for the text before its length: the length is of the value as converted.
            guard sqlite3_column_type(handle, index) != SQLITE_NULL, let bytes = sqlite3_column_text(handle, index)
            else { return nil }
            let count = Int(sqlite3_column_bytes(handle, index))
            return String(decoding: UnsafeBufferPointer(start: bytes, count: count), as: UTF8.self)
        }

        /// Column `index` (0-based) as the bytes of its blob (empty when NULL or empty).
        func blob(_ index: Int32) -> [UInt8] {
            let count = Int(sqlite3_column_bytes(handle, index))
            guard count > 0, let bytes = sqlite3_column_blob(handle, index) else { return [] }
            return Array(UnsafeRawBufferPointer(start: bytes, count: count))
        }

        /// Column `index` (0-based) as the bytes of its text; nil when NULL.
        func textBytes(_ index: Int32) -> [UInt8]? {
            guard sqlite3_column_type(handle, index) != SQLITE_NULL, let bytes = sqlite3_column_text(handle, index)
            else { return nil }
            return Array(UnsafeBufferPointer(start: bytes, count: Int(sqlite3_column_bytes(handle, index))))
        }
    }

    private func clear() {
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
    }

    private func failure(_ code: Int32) -> DatabaseError {
        DatabaseError(
            resultCode: ResultCode(rawValue: code), message: String(cString: sqlite3_errmsg(connection)), sql: sql)
    }
}
