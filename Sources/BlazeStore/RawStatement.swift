import GRDB
import GRDBSQLite

/// SQLite's "copy the value now" destructor marker (`SQLITE_TRANSIENT`, a macro Swift does not import).
private let transient = unsafeBitCast(OpaquePointer(bitPattern: -1), to: sqlite3_destructor_type.self)

/// A cached statement of the write path run through SQLite's C API, for the statements executed once per document.
///
/// GRDB's argument boxing and per-statement bookkeeping cost about as much as SQLite's own work on a small row.
/// These statements only insert, update or read rows inside a write transaction that GRDB opened and will end;
/// the database has no GRDB observers of row changes (only commit hooks, which SQLite calls itself), so nothing
/// that GRDB tracks is bypassed. Each run leaves the statement reset with no bindings.
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

    /// Binds text to the 1-based parameter `index` (copied by SQLite).
    func bind(_ index: Int32, _ text: String) {
        var text = text
        text.withUTF8 { bind(index, $0) }
    }

    /// Binds UTF-8 bytes as text to the 1-based parameter `index` (copied by SQLite).
    func bind(_ index: Int32, _ utf8: [UInt8]) {
        utf8.withUnsafeBufferPointer { bind(index, $0) }
    }

    private func bind(_ index: Int32, _ utf8: UnsafeBufferPointer<UInt8>) {
        // An empty buffer may have no address; SQLite reads a null pointer as NULL, so give it a valid one.
        let empty: StaticString = ""
        let base = UnsafeRawPointer(utf8.baseAddress) ?? UnsafeRawPointer(empty.utf8Start)
        sqlite3_bind_text(handle, index, base.assumingMemoryBound(to: CChar.self), Int32(utf8.count), transient)
    }

    /// Binds an integer to the 1-based parameter `index`.
    func bind(_ index: Int32, _ value: Int64) {
        sqlite3_bind_int64(handle, index, value)
    }

    /// Runs a statement that returns no row; returns the number of rows it inserted, updated or deleted.
    @discardableResult
    func run() throws -> Int {
        defer { clear() }
        let code = sqlite3_step(handle)
        guard code == SQLITE_DONE else { throw failure(code) }
        return Int(sqlite3_changes(connection))
    }

    /// The rowid of the connection's last inserted row.
    var lastInsertedRowID: Int64 { sqlite3_last_insert_rowid(connection) }

    /// Runs a query and reads its first row with `read`; nil when it returns none.
    func firstRow<T>(_ read: (Row) -> T) throws -> T? {
        defer { clear() }
        switch sqlite3_step(handle) {
        case SQLITE_ROW: return read(Row(handle: handle))
        case SQLITE_DONE: return nil
        case let code: throw failure(code)
        }
    }

    /// Columns of the current row, valid only inside `firstRow`'s closure.
    struct Row {
        let handle: SQLiteStatement

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
