import Foundation
import GRDB

#if canImport(Glibc)
import Glibc
#endif

/// The format version of database files: how many of the schema's migrations a file has had (`Schema.migrator`,
/// append-only). A build opens files of its own version and older, and refuses newer ones.
///
/// Opening a file an older build wrote migrates it, after copying it beside itself as `<file>.format-<N>.bak` (N its
/// old version; kept until the user removes it or drops the database), so an upgrade that goes wrong loses nothing.
/// Opening a file a newer build wrote (one with migrations this build does not know) is refused with
/// `database_too_new`, naming both versions: never a guess at what the unknown migrations changed.
public enum DatabaseFormat {
    /// The format version this build writes.
    public static var current: Int { Schema.migrator.migrations.count }

    /// Checks the database file at `path`, if there is one, before anything opens it for writing: refuses a newer one,
    /// copies an older one. Both look through a read-only connection, so a refused file is not written to at all.
    static func prepare(path: String, migrator: DatabaseMigrator) throws {
        guard FileManager.default.fileExists(atPath: path) else { return }
        var config = Configuration()
        config.readonly = true
        let source = try DatabaseQueue(path: path, configuration: config)
        defer { try? source.close() }
        let (applied, superseded, all) = try source.read { db in
            (
                try migrator.appliedIdentifiers(db), try migrator.hasBeenSuperseded(db),
                try db.tableExists("grdb_migrations") ? try Int.fetchOne(db, sql: "SELECT count(*) FROM grdb_migrations") ?? 0 : 0
            )
        }
        if superseded {
            throw StoreError(
                .invalidArgument, kind: "database_too_new",
                "\(path) is format \(all), written by a newer BlazeDB; this build reads formats up to \(migrator.migrations.count): upgrade blazed to open it",
                details: ["format": .int(Int64(all)), "supported": .int(Int64(migrator.migrations.count))])
        }
        // A file with no migration yet, or one of this version: nothing to keep.
        guard !applied.isEmpty, applied.count < migrator.migrations.count else { return }
        try keepCopy(of: source, as: "\(path).format-\(applied.count)")
    }

    /// Copies `source` to `base.bak` (or, when that name is taken, `base-<Unix time>.bak`): written as `.partial`,
    /// synced, renamed into place and the directory synced, so a copy under its name is whole.
    static func keepCopy(of source: DatabaseQueue, as base: String) throws {
        var copy = base + ".bak"
        if FileManager.default.fileExists(atPath: copy) { copy = "\(base)-\(Int(Date().timeIntervalSince1970)).bak" }
        let partial = copy + ".partial"
        for suffix in ["", "-journal", "-wal", "-shm"] { unlink(partial + suffix) }
        do {
            let target = try DatabaseQueue(path: partial)
            try source.backup(to: target)
            try target.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA journal_mode = DELETE") }
            try target.close()
            try BlazeDatabase.syncFile(partial)
            guard rename(partial, copy) == 0 else {
                throw StoreError(.internalFailure, kind: "io_error", "cannot create \(copy): \(String(cString: strerror(errno)))")
            }
            try BlazeDatabase.syncFile((copy as NSString).deletingLastPathComponent)
        } catch {
            for suffix in ["", "-journal", "-wal", "-shm"] { unlink(partial + suffix) }
            throw error
        }
    }
}
