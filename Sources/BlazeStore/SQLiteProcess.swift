import CBlazeSQLiteConfig

/// SQLite's process-wide settings, made once before it opens its first database.
enum SQLiteProcess {
    /// Applies the settings (idempotent: `Store.init` calls it, and so does the first database's connection set-up,
    /// `WALWriteBuffer.install`) and returns SQLite's result code: `SQLITE_OK`, or `SQLITE_MISUSE` when something in
    /// the process had already opened a database. Not thread-safe against other threads starting SQLite (SQLite's
    /// rule for `sqlite3_config`): a daemon makes its `Store` before any thread opens a database.
    ///
    /// Memory statistics are turned off: they take a process-wide mutex around every allocation SQLite makes, and
    /// nothing here reads them (no soft heap limit is set). A writer storing a group of received batches spent about 4 %
    /// of its time in that mutex.
    @discardableResult
    static func configure() -> Int32 { configured }

    private static let configured: Int32 = blaze_sqlite_disable_memstatus()
}
