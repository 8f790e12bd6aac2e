import BlazeCrypto
import BlazeProtocol
import Foundation
import PostgresNIO

/// Joins held in PostgreSQL, where every relay process sees them: each change is announced (`j`), so the process a
/// member is connected to passes on a join another process received, and the process holding the joiner's connection
/// passes on the refusal another process received (Protocol/RELAY.md, "Joins").
extension PostgresRelayStore {
    /// The table of joins waiting, as `RelayStore.joinsTable`.
    static let joinsTable = """
        CREATE TABLE IF NOT EXISTS relay_joins(space BYTEA NOT NULL, device BYTEA NOT NULL, agreement BYTEA NOT NULL, \
        invite BYTEA NOT NULL, proof BYTEA NOT NULL, holder TEXT NOT NULL, expires_ms BIGINT NOT NULL, refusal TEXT, \
        PRIMARY KEY(space, device))
        """

    public func holdJoin(_ join: HeldJoin, space: SpaceID, limit: Int, nowMs: Int64) async throws {
        try await bounded { [self] in
            let s = Data(space.bytes), device = Data(join.device.signing)
            try await transaction { conn in
                // The space's row is its lock for joins: the count below holds across processes.
                try await conn.query("SELECT 1 FROM relay_spaces WHERE id = \(s) FOR UPDATE", logger: self.logger)
                try await conn.query("DELETE FROM relay_joins WHERE space = \(s) AND expires_ms <= \(nowMs)", logger: self.logger)
                let others = Int(
                    try await conn.query(
                        "SELECT count(*) FROM relay_joins WHERE space = \(s) AND device <> \(device)", logger: self.logger
                    ).decode(Int64.self).all().first ?? 0)
                if others >= limit {
                    try await conn.query(
                        """
                        DELETE FROM relay_joins WHERE space = \(s) AND device IN (SELECT device FROM relay_joins \
                        WHERE space = \(s) AND device <> \(device) ORDER BY expires_ms LIMIT \(others - limit + 1))
                        """, logger: self.logger)
                }
                try await conn.query(
                    """
                    INSERT INTO relay_joins(space, device, agreement, invite, proof, holder, expires_ms, refusal) \
                    VALUES (\(s), \(device), \(Data(join.device.agreement)), \(Data(join.invite)), \(Data(join.proof)), \
                    \(join.holder), \(join.expiresMs), NULL) ON CONFLICT (space, device) DO UPDATE SET \
                    agreement = EXCLUDED.agreement, invite = EXCLUDED.invite, proof = EXCLUDED.proof, \
                    holder = EXCLUDED.holder, expires_ms = EXCLUDED.expires_ms, refusal = NULL
                    """, logger: self.logger)
                try await self.notify(conn, "j", space: space)
            }
        }
    }

    public func joins(space: SpaceID, nowMs: Int64) async throws -> [HeldJoin] {
        try await bounded { [self] in
            try await client.query(
                """
                SELECT device, agreement, invite, proof, holder, expires_ms, refusal FROM relay_joins \
                WHERE space = \(Data(space.bytes)) AND expires_ms > \(nowMs) ORDER BY expires_ms
                """, logger: logger
            ).decode((Data, Data, Data, Data, String, Int64, String?).self).all().compactMap { row in
                HeldJoin(
                    signing: row.0, agreement: row.1, invite: row.2, proof: row.3, holder: row.4, expiresMs: row.5, refusal: row.6)
            }
        }
    }

    public func refuseJoin(space: SpaceID, invite: [UInt8], device: [UInt8], reason: InviteRefusal) async throws -> Bool {
        try await bounded { [self] in
            try await transaction { conn in
                let changed = try await conn.query(
                    """
                    UPDATE relay_joins SET refusal = \(reason.rawValue) WHERE space = \(Data(space.bytes)) \
                    AND device = \(Data(device)) AND invite = \(Data(invite)) AND refusal IS DISTINCT FROM \(reason.rawValue) \
                    RETURNING device
                    """, logger: self.logger
                ).all().count
                if changed > 0 { try await self.notify(conn, "j", space: space) }
                return changed > 0
            }
        }
    }

    public func dropJoin(space: SpaceID, device: [UInt8], holder: String) async throws {
        try await bounded { [self] in
            _ = try await client.query(
                "DELETE FROM relay_joins WHERE space = \(Data(space.bytes)) AND device = \(Data(device)) AND holder = \(holder)",
                logger: logger)
        }
    }
}
