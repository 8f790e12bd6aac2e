import Foundation
import GRDB

#if canImport(Glibc)
import Glibc
#endif

/// The format of a SQLite file kept by GRDB migrations (a database, a relay's file): the number of migrations it has
/// had (README, "Upgrades and file formats"). Shared by the store and the relay, each of which names its own errors.
public enum MigratedFile {
    /// What `prepare` found.
    public enum Outcome: Sendable, Equatable {
        /// No file, a file with no migration yet, or one of this build's format: nothing to do.
        case current
        /// A newer build wrote it: `format` migrations, `supported` known here. Nothing was written to it.
        case newer(format: Int, supported: Int)
        /// An older build wrote it (format `from`): copied to `copy` before it is migrated.
        case copied(from: Int, copy: String)
    }

    /// Looks at the file at `path` through a read-only connection, before anything opens it for writing: reports a
    /// newer one, and copies an older one to `<path>.format-N.bak` (`…format-N-<Unix time>.bak` when that name is
    /// taken; written as `.partial`, synced, renamed into place, the directory synced), so a copy under its name is
    /// whole. Throws `MigratedFileError` when the copy fails (nothing is left of it).
    public static func prepare(path: String, migrator: DatabaseMigrator) throws -> Outcome {
        guard FileManager.default.fileExists(atPath: path) else { return .current }
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
        if superseded { return .newer(format: all, supported: migrator.migrations.count) }
        guard !applied.isEmpty, applied.count < migrator.migrations.count else { return .current }
        var copy = "\(path).format-\(applied.count).bak"
        if FileManager.default.fileExists(atPath: copy) { copy = "\(path).format-\(applied.count)-\(Int(Date().timeIntervalSince1970)).bak" }
        let partial = copy + ".partial"
        for suffix in ["", "-journal", "-wal", "-shm"] { unlink(partial + suffix) }
        do {
            let target = try DatabaseQueue(path: partial)
            try source.backup(to: target)
            try target.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA journal_mode = DELETE") }
            try target.close()
            try sync(partial)
            guard rename(partial, copy) == 0 else { throw MigratedFileError("cannot create \(copy): \(String(cString: strerror(errno)))") }
            try sync((copy as NSString).deletingLastPathComponent)
        } catch {
            for suffix in ["", "-journal", "-wal", "-shm"] { unlink(partial + suffix) }
            throw error as? MigratedFileError ?? MigratedFileError("cannot copy \(path) to \(copy) before migrating it: \(error)")
        }
        return .copied(from: applied.count, copy: copy)
    }

    /// fsync of the file or directory at `path`.
    private static func sync(_ path: String) throws {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0, fsync(fd) == 0 else {
            let code = errno
            if fd >= 0 { close(fd) }
            throw MigratedFileError("cannot sync \(path): \(String(cString: strerror(code)))")
        }
        close(fd)
    }
}

/// A copy made before a migration that failed.
public struct MigratedFileError: Error, Sendable, CustomStringConvertible {
    /// What failed.
    public let description: String

    /// An error saying `description`.
    public init(_ description: String) { self.description = description }
}
