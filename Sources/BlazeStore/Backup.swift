import BlazeCRDT
import BlazeProtocol
import BlazeVector
import Foundation
import GRDB

#if canImport(Glibc)
import Glibc
#endif

/// What `backup(to:)` wrote.
public struct BackupReport: Sendable {
    /// The backup file.
    public var path: String
    /// Its size in bytes.
    public var bytes: Int64
    /// Live documents in the snapshot.
    public var documents: Int
    /// `stateHash()` of the snapshot: a restore of this file has exactly this hash.
    public var stateHash: String
    /// The blob chunks it holds.
    public var chunks = BackupChunks.Report()
}

extension BlazeDatabase {
    /// Writes a consistent snapshot of the database to `path` through SQLite's online backup while writers go on.
    ///
    /// The copy runs inside one read transaction, so it is the database as of one commit (WAL readers never block
    /// the writer). It is written to `path.partial`, made a self-contained rollback-journal file, synced, and then
    /// linked to `path`, which must not exist: a reader of `path` never sees half a backup. With `chunks`, the file
    /// also holds the chunks this device holds of every blob the snapshot may refer to (`BackupChunks`), copied after
    /// the snapshot ends while no sweep of the chunk store runs.
    public func backup(to path: String, chunks: BackupChunks.Source? = nil) throws -> BackupReport {
        try Self.checkTarget(path)
        let partial = path + ".partial"
        guard !FileManager.default.fileExists(atPath: partial) else {
            throw StoreError(
                .alreadyExists, kind: "file_exists",
                "\(partial) exists: another backup to \(path) is running, or an interrupted one left it (remove it)")
        }
        var report = BackupReport(path: path, bytes: 0, documents: 0, stateHash: "")
        // No chunk the snapshot's blobs use is swept before `prepare` keeps it (the lock is held from before the
        // snapshot until then; sweeps run again while the chunks are copied).
        if chunks != nil { sweeping.lock() }
        var locked = chunks != nil
        defer { if locked { sweeping.unlock() } }
        var (blobs, referred) = (Set<ChunkID>(), Set<ChunkID>())
        do {
            try connections.read { db in
                let target = try DatabaseQueue(path: partial)
                try target.writeWithoutTransaction { targetDB in
                    try db.backup(to: targetDB)
                    try targetDB.execute(sql: "PRAGMA journal_mode = DELETE")
                }
                try target.close()
                report.stateHash = try Self.stateHash(db)
                report.documents = try Int.fetchOne(db, sql: "SELECT count(*) FROM docs") ?? 0
                if chunks != nil {
                    blobs = try Self.referencedBlobs(db)
                    referred = Set(try Self.documentBlobReferences(db).map(\.reference.id))
                }
            }
            if let chunks {
                let notHeld = try chunks.prepare(blobs, referred)
                sweeping.unlock()
                locked = false
                let target = try DatabaseQueue(path: partial)
                report.chunks = try BackupChunks.write(into: target, from: chunks)
                report.chunks.blobsNotHeld = notHeld
                try target.close()
            }
            try Self.syncFile(partial)
            guard link(partial, path) == 0 else {
                let reason = errno == EEXIST ? "it exists" : String(cString: strerror(errno))
                throw StoreError(.alreadyExists, kind: "file_exists", "cannot create \(path): \(reason)")
            }
            unlink(partial)
            try Self.syncFile((path as NSString).deletingLastPathComponent)
        } catch {
            for suffix in ["", "-journal", "-wal", "-shm"] { unlink(partial + suffix) }
            throw error
        }
        report.bytes = Int64((try? FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)??.int64Value ?? 0)
        return report
    }

    /// `path` must be absolute, not exist, and be in an existing directory.
    static func checkTarget(_ path: String) throws {
        guard path.hasPrefix("/") else {
            throw StoreError.invalid("invalid_path", "the backup path must be absolute, got \(path)")
        }
        guard !FileManager.default.fileExists(atPath: path) else {
            throw StoreError(.alreadyExists, kind: "file_exists", "\(path) exists; a backup never overwrites a file")
        }
        var isDirectory: ObjCBool = false
        let dir = (path as NSString).deletingLastPathComponent
        guard FileManager.default.fileExists(atPath: dir, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw StoreError(.notFound, kind: "directory_not_found", "directory \(dir) does not exist")
        }
        guard access(dir, W_OK) == 0 else {
            throw StoreError.invalid("not_writable", "the daemon cannot write to \(dir): \(String(cString: strerror(errno)))")
        }
    }

    /// fsync of a file or directory.
    static func syncFile(_ path: String) throws {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            throw StoreError(.internalFailure, kind: "io_error", "cannot open \(path): \(String(cString: strerror(errno)))")
        }
        defer { Glibc.close(fd) }
        guard fsync(fd) == 0 else {
            throw StoreError(.internalFailure, kind: "io_error", "fsync \(path): \(String(cString: strerror(errno)))")
        }
    }

    /// True when the database holds changes authored elsewhere. An unshared database holds such changes only when it
    /// was restored from a backup of a shared one: they cannot be sealed again (only their author signs its log).
    public func holdsChangesOfOtherDevices() throws -> Bool {
        try read { db in
            try Bool.fetchOne(db, sql: "SELECT EXISTS(SELECT 1 FROM versions WHERE origin != ?)", arguments: [node.hex]) ?? false
        }
    }
}

extension Store {
    /// Creates the database `name` from a backup file made by `BlazeDatabase.backup(to:)`.
    ///
    /// The file is checked first (SQLite integrity, BlazeDB tables, a schema this version knows, and every schema
    /// object against the one BlazeDB's migrations create: a trigger, a view, an unknown or altered table is refused)
    /// and copied, never moved or modified. In the copy, unknown indexes are dropped, user indexes rebuilt from their
    /// definitions, and every stored document state, change and index definition validated like data from another
    /// device (`RestoreCheck`); anything out of bounds refuses the restore (`backup_invalid`). The copy is detached from sync: its space binding, peers, sealed entries and heads are
    /// removed, so it is a local database that can be shared anew (`db.share`) and never forks the log of the
    /// space it came from.
    public func restore(from backupPath: String, as name: String) throws -> BlazeDatabase {
        try restore(from: backupPath, as: name, chunks: nil).db
    }

    /// `restore(from:as:)`, and the blob chunks the backup holds handed to `chunks` (checked: `BackupChunks`) before
    /// the database appears; without `chunks` they are left out. A failed restore discards what `chunks` took.
    public func restore(
        from backupPath: String, as name: String, chunks: BackupChunks.Sink?
    ) throws -> (db: BlazeDatabase, chunks: BackupChunks.Report) {
        try Names.validateDatabase(name)
        guard backupPath.hasPrefix("/") else {
            throw StoreError.invalid("invalid_path", "the backup path must be absolute, got \(backupPath)")
        }
        guard FileManager.default.fileExists(atPath: backupPath) else {
            throw StoreError(.notFound, kind: "file_not_found", "backup file \(backupPath) does not exist")
        }
        var config = Configuration()
        config.readonly = true
        let source: DatabaseQueue
        do {
            source = try DatabaseQueue(path: backupPath, configuration: config)
        } catch {
            throw StoreError.invalid("not_a_backup", "\(backupPath) is not a SQLite database: \(error)")
        }
        defer { try? source.close() }
        try source.read { db in
            let problems: [String]
            do {
                problems = try String.fetchAll(db, sql: "PRAGMA integrity_check")
            } catch {
                throw StoreError.invalid("not_a_backup", "\(backupPath) is not a SQLite database: \(error)")
            }
            guard problems == ["ok"] else {
                throw StoreError.invalid(
                    "backup_corrupt", "\(backupPath) fails SQLite's integrity check: \(problems.prefix(3).joined(separator: "; "))")
            }
            for table in ["meta", "docs", "changes"] where try !db.tableExists(table) {
                throw StoreError.invalid("not_a_backup", "\(backupPath) is not a BlazeDB database (it has no \(table) table)")
            }
            guard try !Schema.migrator.hasBeenSuperseded(db) else {
                throw StoreError.invalid("backup_too_new", "\(backupPath) was written by a newer BlazeDB; upgrade blazed to restore it")
            }
        }
        let (extraIndexes, extraTriggers) = try source.read { db in try RestoreCheck.schemaObjects(db, path: backupPath) }
        let path = self.path(name)
        let partial = path + ".partial"
        try reserve(name)
        defer { release(name) }
        var installed = BackupChunks.Report()
        do {
            unlink(partial)
            var targetConfig = Configuration()
            targetConfig.prepareDatabase { db in db.add(function: VectorIndexSQL.function) }
            let target = try DatabaseQueue(path: partial, configuration: targetConfig)
            try source.backup(to: target)
            try target.write { db in
                // The backup's blob chunks go to the chunk store, not the database (their pages are given back below).
                try db.execute(sql: "DROP TABLE IF EXISTS backup_chunks")
                // Vector indexes' triggers go before anything writes (the file's are not trusted: they are built
                // again from the definitions below).
                for name in extraTriggers { try db.execute(sql: "DROP TRIGGER \(name.quotedDatabaseIdentifier)") }
                // Indexes are derived data: any the schema check did not recognize is dropped and the user
                // indexes are rebuilt from their definitions below.
                for name in extraIndexes { try db.execute(sql: "DROP INDEX \(name.quotedDatabaseIdentifier)") }
                try db.execute(sql: "DELETE FROM meta WHERE key = 'space_id'")
                // A restored copy is detached from its space: it keeps none of its sync state, its membership log (so
                // a new share starts a new log) or the invites it issued (so a copy of the file redeems none).
                for table in [
                    "sync_entries", "sync_heads", "sync_peers", "sync_forks", "sync_folders", "sync_folder_heads", "sync_pruned",
                    "sync_acks", "sync_formats", "sync_membership", "sync_invites",
                ] where try db.tableExists(table) {
                    try db.execute(sql: "DELETE FROM \(table)")
                }
            }
            // Our own migrations bring an older backup up to date (the schema check has refused triggers, so
            // nothing runs but them), then every row is validated like data from another device.
            try Schema.migrator.migrate(target)
            try target.write { db in
                try RestoreCheck.rows(db, path: backupPath, limits: limits)
                try RestoreCheck.rebuildUserIndexes(db, limits: limits)
                // The feed's events are the original database's history for its subscribers, and nothing validates
                // them: the new database starts its feed empty, after the last sequence the original used.
                let last = try Int64.fetchOne(db, sql: "SELECT max(seq) FROM feed") ?? 0
                let floor = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'feed_floor'").flatMap { Int64($0) }
                try db.execute(sql: "DELETE FROM feed")
                try db.execute(
                    sql: "INSERT INTO meta(key, value) VALUES ('feed_floor', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    arguments: [String(max(last, max(0, floor ?? 0)))])
            }
            try target.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA incremental_vacuum") }
            try target.close()
            if let chunks { installed = try source.read { db in try BackupChunks.read(db, path: backupPath, into: chunks) } }
            try BlazeDatabase.syncFile(partial)
            try chunks?.finish()
            guard link(partial, path) == 0 else {
                let code = errno
                guard code == EEXIST else {
                    throw StoreError(.internalFailure, kind: "io_error", "cannot create \(path): \(String(cString: strerror(code)))")
                }
                throw StoreError(.alreadyExists, kind: "database_exists", "database \(Names.quoted(name)) already exists")
            }
            unlink(partial)
            // The new names (the file, and the chunk directory moved beside it) are durable once the directory is.
            try? BlazeDatabase.syncFile((path as NSString).deletingLastPathComponent)
        } catch {
            for suffix in ["", "-journal", "-wal", "-shm"] { unlink(partial + suffix) }
            chunks?.discard()
            throw error
        }
        return (try database(name), installed)
    }
}

/// The checks of `BlazeDatabase.validate` (bounds, names, sizes) and the clock window, as a predicate over stored changes.
struct ChangeValidator {
    let limits: StoreLimits
    let now: UInt64

    func accepts(_ change: Change) -> Bool {
        (try? ChangeBounds.check(change)) != nil
            && (try? ChangeBounds.checkClock(change, now: now, maxAhead: limits.maxClockAheadMilliseconds)) != nil
            && (try? BlazeDatabase.validate(change, size: nil, limits: limits)) != nil
    }
}
