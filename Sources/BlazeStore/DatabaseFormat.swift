import BlazeFileFormat
import BlazeProtocol
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
    /// copies an older one (`MigratedFile`: through a read-only connection, so a refused file is not written to).
    static func prepare(path: String, migrator: DatabaseMigrator) throws {
        let outcome: MigratedFile.Outcome
        do {
            outcome = try MigratedFile.prepare(path: path, migrator: migrator)
        } catch let error as MigratedFileError {
            throw StoreError(.internalFailure, kind: "io_error", error.description)
        }
        if case .newer(let format, let supported) = outcome {
            throw StoreError(
                .invalidArgument, kind: "database_too_new",
                "\(path) is format \(format), written by a newer BlazeDB; this build reads formats up to \(supported): upgrade blazed to open it",
                details: ["format": .int(Int64(format)), "supported": .int(Int64(supported))])
        }
    }
}
