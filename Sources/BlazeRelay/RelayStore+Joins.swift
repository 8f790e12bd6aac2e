import BlazeCrypto
import BlazeProtocol
import Foundation
import GRDB

/// Joins held by the SQLite store: one process, but the same table and rules as PostgreSQL's.
extension RelayStore {
    /// The table of joins waiting (Protocol/RELAY.md, "Joins"): one per space and joiner, keyed by its Ed25519 key.
    static let joinsTable = """
        CREATE TABLE relay_joins(
            space BLOB NOT NULL,
            device BLOB NOT NULL,
            agreement BLOB NOT NULL,
            invite BLOB NOT NULL,
            proof BLOB NOT NULL,
            holder TEXT NOT NULL,
            expires_ms INTEGER NOT NULL,
            refusal TEXT,
            PRIMARY KEY(space, device)
        ) WITHOUT ROWID
        """

    public func holdJoin(_ join: HeldJoin, space: SpaceID, limit: Int, nowMs: Int64) async throws {
        try await pool.write { db in
            let s = Data(space.bytes)
            try db.execute(sql: "DELETE FROM relay_joins WHERE space = ? AND expires_ms <= ?", arguments: [s, nowMs])
            let others = try Int.fetchOne(
                db, sql: "SELECT COUNT(*) FROM relay_joins WHERE space = ? AND device <> ?",
                arguments: [s, Data(join.device.signing)]) ?? 0
            if others >= limit {
                try db.execute(
                    sql: """
                        DELETE FROM relay_joins WHERE space = ? AND device IN (SELECT device FROM relay_joins WHERE space = ? \
                        AND device <> ? ORDER BY expires_ms LIMIT ?)
                        """,
                    arguments: [s, s, Data(join.device.signing), others - limit + 1])
            }
            try db.execute(
                sql: """
                    INSERT OR REPLACE INTO relay_joins(space, device, agreement, invite, proof, holder, expires_ms, refusal) \
                    VALUES (?, ?, ?, ?, ?, ?, ?, NULL)
                    """,
                arguments: [
                    s, Data(join.device.signing), Data(join.device.agreement), Data(join.invite), Data(join.proof), join.holder,
                    join.expiresMs,
                ])
        }
    }

    public func joins(space: SpaceID, nowMs: Int64) async throws -> [HeldJoin] {
        try await pool.read { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT device, agreement, invite, proof, holder, expires_ms, refusal FROM relay_joins \
                    WHERE space = ? AND expires_ms > ? ORDER BY expires_ms
                    """,
                arguments: [Data(space.bytes), nowMs]
            ).compactMap { row in
                HeldJoin(
                    signing: row[0], agreement: row[1], invite: row[2], proof: row[3], holder: row[4], expiresMs: row[5],
                    refusal: row[6])
            }
        }
    }

    public func refuseJoin(space: SpaceID, invite: [UInt8], device: [UInt8], reason: InviteRefusal) async throws -> Bool {
        try await pool.write { db in
            try db.execute(
                sql: """
                    UPDATE relay_joins SET refusal = ? WHERE space = ? AND device = ? AND invite = ? \
                    AND refusal IS NOT ?
                    """,
                arguments: [reason.rawValue, Data(space.bytes), Data(device), Data(invite), reason.rawValue])
            return db.changesCount > 0
        }
    }

    public func dropJoin(space: SpaceID, device: [UInt8], holder: String) async throws {
        try await pool.write { db in
            try db.execute(
                sql: "DELETE FROM relay_joins WHERE space = ? AND device = ? AND holder = ?",
                arguments: [Data(space.bytes), Data(device), holder])
        }
    }
}

extension HeldJoin {
    /// A join as a store row holds it; nil for a row that does not decode (keys of the wrong length).
    init?(signing: Data, agreement: Data, invite: Data, proof: Data, holder: String, expiresMs: Int64, refusal: String?) {
        guard let device = DevicePublicKeys(signing: Array(signing), agreement: Array(agreement)), invite.count == 16,
            proof.count == 32 || proof.count == 64
        else { return nil }
        self.init(
            invite: Array(invite), device: device, proof: Array(proof), holder: holder, expiresMs: expiresMs,
            refusal: refusal.flatMap(InviteRefusal.init(rawValue:)))
    }
}
