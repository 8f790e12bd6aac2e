import BlazeFileFormat
import Foundation
import GRDB

/// The relay file's format (README, "Upgrades and file formats"): the number of its migrations.
extension RelayStore {
    /// Refuses a relay file a newer build wrote (migrations this build does not know: never a guess), and copies one
    /// an older build wrote beside itself (`relay.db.format-N.bak`) before it is migrated (`MigratedFile`: through a
    /// read-only connection, so a refused file is not written to).
    static func prepareFormat(path: String) throws {
        let outcome: MigratedFile.Outcome
        do {
            outcome = try MigratedFile.prepare(path: path, migrator: Self.migrator)
        } catch let error as MigratedFileError {
            throw RelayFormatError(error.description)
        }
        if case .newer(let format, let supported) = outcome {
            throw RelayFormatError(
                "\(path) is format \(format), written by a newer blaze-relay; this build reads formats up to \(supported): upgrade blaze-relay to open it")
        }
    }
}

/// A relay file (or PostgreSQL schema) this build cannot open: a newer build wrote it.
public struct RelayFormatError: Error, CustomStringConvertible {
    /// What was found and what to do.
    public let description: String

    /// An error saying `description`.
    init(_ description: String) { self.description = description }
}
