import Foundation
import GRDB

#if canImport(Glibc)
import Glibc
#endif

/// The relay file's format (README, "Upgrades and file formats"): the number of its migrations.
extension RelayStore {
    /// Refuses a relay file a newer build wrote (migrations this build does not know: never a guess), and copies one
    /// an older build wrote beside itself (`relay.db.format-N.bak`, or `…format-N-<Unix time>.bak` when that name is
    /// taken) before it is migrated. Both look through a read-only connection, so a refused file is not written to.
    static func prepareFormat(path: String) throws {
        guard FileManager.default.fileExists(atPath: path) else { return }
        let migrator = Self.migrator
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
            throw RelayFormatError(
                "\(path) is format \(all), written by a newer blaze-relay; this build reads formats up to \(migrator.migrations.count): upgrade blaze-relay to open it")
        }
        guard !applied.isEmpty, applied.count < migrator.migrations.count else { return }
        var copy = "\(path).format-\(applied.count).bak"
        if FileManager.default.fileExists(atPath: copy) { copy = "\(path).format-\(applied.count)-\(Int(Date().timeIntervalSince1970)).bak" }
        let partial = copy + ".partial"
        for suffix in ["", "-journal", "-wal", "-shm"] { unlink(partial + suffix) }
        do {
            let target = try DatabaseQueue(path: partial)
            try source.backup(to: target)
            try target.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA journal_mode = DELETE") }
            try target.close()
            try syncPath(partial)
            guard rename(partial, copy) == 0 else { throw RelayFormatError("cannot create \(copy): \(String(cString: strerror(errno)))") }
            try syncPath((copy as NSString).deletingLastPathComponent)
        } catch {
            for suffix in ["", "-journal", "-wal", "-shm"] { unlink(partial + suffix) }
            throw error
        }
    }

    /// fsync of the file or directory at `path`.
    private static func syncPath(_ path: String) throws {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0, fsync(fd) == 0 else {
            let code = errno
            if fd >= 0 { close(fd) }
            throw RelayFormatError("cannot sync \(path): \(String(cString: strerror(code)))")
        }
        close(fd)
    }
}

/// A relay file (or PostgreSQL schema) this build cannot open: a newer build wrote it.
public struct RelayFormatError: Error, CustomStringConvertible {
    /// What was found and what to do.
    public let description: String

    /// An error saying `description`.
    init(_ description: String) { self.description = description }
}
