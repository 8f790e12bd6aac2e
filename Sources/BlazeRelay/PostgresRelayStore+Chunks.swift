import BlazeProtocol
import Foundation
import NIOCore
import PostgresNIO

/// Blob chunks held in PostgreSQL (Protocol/RELAY.md, "Blob chunks"), as `RelayStore` holds them: a chunk stored
/// through one relay process is served by every other.
extension PostgresRelayStore {
    /// The table of chunks (sealed, up to 4 MiB each; PostgreSQL keeps large values out of line), and their bytes per
    /// space beside the entries' in `relay_usage`.
    static let chunksStatements: [String] = [
        """
        CREATE TABLE IF NOT EXISTS relay_chunks(space BYTEA NOT NULL, id BYTEA NOT NULL, bytes BYTEA NOT NULL, \
        PRIMARY KEY(space, id))
        """,
        "ALTER TABLE relay_usage ADD COLUMN IF NOT EXISTS chunk_bytes BIGINT NOT NULL DEFAULT 0",
        // When each chunk was last kept, apart from its row (see `RelayStore.leasesTable`); chunks held before leases
        // start now.
        """
        CREATE TABLE IF NOT EXISTS relay_chunk_leases(space BYTEA NOT NULL, id BYTEA NOT NULL, kept_ms BIGINT NOT NULL, \
        PRIMARY KEY(space, id))
        """,
        "CREATE INDEX IF NOT EXISTS relay_chunk_leases_kept ON relay_chunk_leases(kept_ms)",
        // Once: while no lease is held (each stored chunk gets one), not at every start.
        """
        INSERT INTO relay_chunk_leases(space, id, kept_ms) \
        SELECT space, id, (extract(epoch FROM now()) * 1000)::BIGINT FROM relay_chunks \
        WHERE NOT EXISTS (SELECT 1 FROM relay_chunk_leases) ON CONFLICT DO NOTHING
        """,
    ]

    public func keepChunks(_ ids: [ChunkID], space: SpaceID, nowMs: Int64) async throws -> Int {
        guard !ids.isEmpty else { return 0 }
        return try await bounded { [self] in
            let wanted = ids.map { ByteBuffer(bytes: $0.bytes) }
            return try await client.query(
                """
                UPDATE relay_chunk_leases SET kept_ms = \(nowMs) \
                WHERE space = \(Data(space.bytes)) AND id = ANY(\(wanted)) AND kept_ms < \(nowMs - RelayLimits.renewalSlackMs) RETURNING 1
                """, logger: logger
            ).all().count
        }
    }

    public func dropUnkeptChunks(keptBeforeMs cutoff: Int64, limit: Int) async throws -> (chunks: Int, bytes: Int) {
        let stale = try await bounded { [self] in
            try await client.query(
                "SELECT space, id FROM relay_chunk_leases WHERE kept_ms < \(cutoff) ORDER BY kept_ms LIMIT \(Int64(limit))",
                logger: logger
            ).decode((Data, Data).self).all()
        }
        var (dropped, freed) = (0, 0)
        for (space, id) in stale {
            // Each under its space's usage row, as a store takes it: the quota stays exact across processes; each in
            // its own time bound.
            let length: Int = try await bounded { [self] in
                try await transaction { conn in
                    try await conn.query("SELECT 1 FROM relay_usage WHERE space = \(space) FOR UPDATE", logger: self.logger)
                    // Kept again meanwhile (another process): it stays.
                    let lease = try await conn.query(
                        "DELETE FROM relay_chunk_leases WHERE space = \(space) AND id = \(id) AND kept_ms < \(cutoff) RETURNING 1",
                        logger: self.logger
                    ).all().count
                    guard lease > 0 else { return 0 }
                    let lengths = try await conn.query(
                        "DELETE FROM relay_chunks WHERE space = \(space) AND id = \(id) RETURNING length(bytes)", logger: self.logger
                    ).decode(Int32.self).all()
                    let bytes = lengths.reduce(0) { $0 + Int($1) }
                    if bytes > 0 {
                        try await conn.query(
                            "UPDATE relay_usage SET chunk_bytes = GREATEST(0, chunk_bytes - \(Int64(bytes))) WHERE space = \(space)",
                            logger: self.logger)
                    }
                    return bytes
                }
            }
            // A sealed chunk is never empty: 0 is a lease without its chunk, or one kept again meanwhile.
            if length > 0 { (dropped, freed) = (dropped + 1, freed + length) }
        }
        return (dropped, freed)
    }

    public func heldChunks(_ ids: [ChunkID], space: SpaceID) async throws -> Set<ChunkID> {
        guard !ids.isEmpty else { return [] }
        return try await bounded { [self] in
            let s = Data(space.bytes)
            let wanted = ids.map { ByteBuffer(bytes: $0.bytes) }
            return Set(
                try await client.query("SELECT id FROM relay_chunks WHERE space = \(s) AND id = ANY(\(wanted))", logger: logger)
                    .decode(Data.self).all().compactMap { ChunkID(bytes: Array($0)) })
        }
    }

    public func chunkBytes(space: SpaceID) async throws -> Int {
        try await bounded { [self] in
            Int(
                try await client.query("SELECT chunk_bytes FROM relay_usage WHERE space = \(Data(space.bytes))", logger: logger)
                    .decode(Int64.self).all().first ?? 0)
        }
    }

    public func storeChunk(_ id: ChunkID, sealed: [UInt8], space: SpaceID) async throws -> ChunkStored {
        try await bounded { [self] in
            let s = Data(space.bytes), key = Data(id.bytes)
            return try await transaction { conn in
                // The usage row is the space's lock: the quota holds across processes.
                guard let used = try await conn.query(
                    "SELECT chunk_bytes FROM relay_usage WHERE space = \(s) FOR UPDATE", logger: self.logger
                ).decode(Int64.self).all().first
                else { throw RelayError("space \(space.hex) has no usage row") }
                let held = try await conn.query("SELECT 1 FROM relay_chunks WHERE space = \(s) AND id = \(key)", logger: self.logger)
                    .all().count
                if held > 0 { return ChunkStored.held }
                let bytes = Int(used) + sealed.count
                guard bytes <= self.limits.maxChunkBytesPerSpace else { return .overQuota }
                try await conn.query(
                    "INSERT INTO relay_chunks(space, id, bytes) VALUES (\(s), \(key), \(Data(sealed)))", logger: self.logger)
                try await conn.query(
                    """
                    INSERT INTO relay_chunk_leases(space, id, kept_ms) VALUES (\(s), \(key), \(Self.nowMs())) \
                    ON CONFLICT (space, id) DO UPDATE SET kept_ms = EXCLUDED.kept_ms
                    """, logger: self.logger)
                try await conn.query(
                    "UPDATE relay_usage SET chunk_bytes = \(Int64(bytes)), last_write_ms = \(Self.nowMs()) WHERE space = \(s)",
                    logger: self.logger)
                return .stored
            }
        }
    }

    public func chunk(_ id: ChunkID, space: SpaceID) async throws -> [UInt8]? {
        try await bounded { [self] in
            try await client.query(
                "SELECT bytes FROM relay_chunks WHERE space = \(Data(space.bytes)) AND id = \(Data(id.bytes))", logger: logger
            ).decode(Data.self).all().first.map { Array($0) }
        }
    }

    public func dropChunks(_ copies: [ChunkCopy], space: SpaceID) async throws -> Int {
        guard !copies.isEmpty else { return 0 }
        return try await bounded { [self] in
            let s = Data(space.bytes)
            return try await transaction { conn in
                try await conn.query("SELECT 1 FROM relay_usage WHERE space = \(s) FOR UPDATE", logger: self.logger)
                var (dropped, freed) = (0, Int64(0))
                for copy in copies {
                    // Only the copy that was served: one a holder uploaded again since stays.
                    let lengths = try await conn.query(
                        """
                        DELETE FROM relay_chunks WHERE space = \(s) AND id = \(Data(copy.id.bytes)) \
                        AND substring(bytes FROM 1 FOR \(Int32(copy.prefix.count))) = \(Data(copy.prefix)) RETURNING length(bytes)
                        """, logger: self.logger
                    ).decode(Int32.self).all()
                    dropped += lengths.count
                    freed += lengths.reduce(0) { $0 + Int64($1) }
                    if !lengths.isEmpty {
                        try await conn.query(
                            "DELETE FROM relay_chunk_leases WHERE space = \(s) AND id = \(Data(copy.id.bytes))", logger: self.logger)
                    }
                }
                if freed > 0 {
                    try await conn.query(
                        "UPDATE relay_usage SET chunk_bytes = GREATEST(0, chunk_bytes - \(freed)) WHERE space = \(s)",
                        logger: self.logger)
                }
                return dropped
            }
        }
    }
}
