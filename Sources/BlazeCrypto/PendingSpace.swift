import BlazeProtocol
import Foundation

/// The space a database not yet shared will create: its salt and epoch-1 secret, chosen when the database first
/// needed them (its first blob, whose chunks are named with keys derived from that secret) and used by the share.
///
/// So blobs put before a database is shared keep their ids once it is: the space's secret is the one they were
/// named under. Kept in the keystore (one file per database name, mode 0600, like space keys), never in the database
/// file, and removed when the database is shared or dropped.
public struct PendingSpace: Sendable, Equatable {
    /// The salt the space's id will be derived from (with the creating device's keys).
    public let salt: [UInt8]
    /// The space's epoch-1 secret.
    public let genesis: [UInt8]

    /// A fresh pending space.
    public static func generate() -> PendingSpace {
        PendingSpace(salt: SpaceKey.randomBytes(16), genesis: SpaceKey.randomSecret())
    }

    /// The file of database `db`'s pending space in `directory`.
    static func path(directory: String, db: String) -> String { directory + "/pending-\(db).json" }

    /// Writes the pending space of database `db` durably.
    public func save(directory: String, db: String) throws {
        let json = "{\"salt\":\"\(Data(salt).base64EncodedString())\",\"genesis\":\"\(Data(genesis).base64EncodedString())\"}"
        try KeyFile.write(json, to: Self.path(directory: directory, db: db))
    }

    /// The pending space of database `db`, nil when there is none.
    public static func load(directory: String, db: String) throws -> PendingSpace? {
        let path = path(directory: directory, db: db)
        guard let o = try KeyFile.object(path, what: "pending space") else { return nil }
        guard case .string(let s)? = o["salt"], case .string(let g)? = o["genesis"],
            let salt = Data(base64Encoded: s), let genesis = Data(base64Encoded: g), salt.count == 16, genesis.count == 32
        else { throw KeystoreError(description: "\(path) is not a BlazeDB pending space") }
        return PendingSpace(salt: Array(salt), genesis: Array(genesis))
    }

    /// Removes the pending space of database `db` (no error when there is none).
    public static func remove(directory: String, db: String) {
        try? FileManager.default.removeItem(atPath: path(directory: directory, db: db))
    }
}
