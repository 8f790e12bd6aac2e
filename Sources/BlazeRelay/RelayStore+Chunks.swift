import BlazeProtocol
import Foundation
import GRDB

/// Blob chunks held by the SQLite store (Protocol/RELAY.md, "Blob chunks"): sealed as members uploaded them, counted
/// per space in a quota of their own, so chunks never crowd out entries.
extension RelayStore {
    /// The table of chunks (an ordinary rowid table, as its rows are large: up to 4 MiB each), and their bytes per
    /// space beside the entries' in `relay_usage`.
    static let chunksTable = """
        CREATE TABLE relay_chunks(
            space BLOB NOT NULL,
            id BLOB NOT NULL,
            bytes BLOB NOT NULL,
            UNIQUE(space, id)
        );
        ALTER TABLE relay_usage ADD COLUMN chunk_bytes INTEGER NOT NULL DEFAULT 0;
        """

    /// When each chunk was last kept (stored, offered by a writing member or named in a member's `CHUNK_KEEP`),
    /// apart from the chunk's row: renewing a lease must not rewrite a 4 MiB row. Chunks held before leases start now.
    static let leasesTable = """
        CREATE TABLE relay_chunk_leases(
            space BLOB NOT NULL,
            id BLOB NOT NULL,
            kept_ms INTEGER NOT NULL,
            PRIMARY KEY(space, id)
        ) WITHOUT ROWID;
        CREATE INDEX relay_chunk_leases_kept ON relay_chunk_leases(kept_ms);
        INSERT INTO relay_chunk_leases(space, id, kept_ms)
            SELECT space, id, CAST(strftime('%s', 'now') AS INTEGER) * 1000 FROM relay_chunks;
        """

    public func keepChunks(_ ids: [ChunkID], space: SpaceID, nowMs: Int64) async throws -> Int {
        guard !ids.isEmpty else { return 0 }
        return try await pool.write { db in
            var kept = 0
            // A lease renewed within the last `renewalSlackMs` is left as it is: a device that reconnects often
            // makes the relay read its leases, not write them.
            for id in ids {
                try db.execute(
                    sql: "UPDATE relay_chunk_leases SET kept_ms = ? WHERE space = ? AND id = ? AND kept_ms < ?",
                    arguments: [nowMs, Data(space.bytes), Data(id.bytes), nowMs - RelayLimits.renewalSlackMs])
                kept += db.changesCount
            }
            return kept
        }
    }

    public func dropUnkeptChunks(keptBeforeMs cutoff: Int64, limit: Int) async throws -> (chunks: Int, bytes: Int) {
        try await pool.write { db in
            let stale = try Row.fetchAll(
                db, sql: "SELECT space, id FROM relay_chunk_leases WHERE kept_ms < ? ORDER BY kept_ms LIMIT ?", arguments: [cutoff, limit])
            var freed: [Data: Int] = [:]
            var dropped = 0
            for row in stale {
                let space: Data = row[0], id: Data = row[1]
                if let length = try Int.fetchOne(
                    db, sql: "SELECT length(bytes) FROM relay_chunks WHERE space = ? AND id = ?", arguments: [space, id])
                {
                    try db.execute(sql: "DELETE FROM relay_chunks WHERE space = ? AND id = ?", arguments: [space, id])
                    freed[space, default: 0] += length
                    dropped += 1
                }
                try db.execute(sql: "DELETE FROM relay_chunk_leases WHERE space = ? AND id = ?", arguments: [space, id])
            }
            for (space, bytes) in freed {
                try db.execute(
                    sql: "UPDATE relay_usage SET chunk_bytes = max(0, chunk_bytes - ?) WHERE space = ?", arguments: [bytes, space])
            }
            return (dropped, freed.values.reduce(0, +))
        }
    }

    public func heldChunks(_ ids: [ChunkID], space: SpaceID) async throws -> Set<ChunkID> {
        try await pool.read { db in
            var held: Set<ChunkID> = []
            for id in ids
            where try Bool.fetchOne(
                db, sql: "SELECT 1 FROM relay_chunks WHERE space = ? AND id = ?", arguments: [Data(space.bytes), Data(id.bytes)]) == true
            {
                held.insert(id)
            }
            return held
        }
    }

    public func chunkBytes(space: SpaceID) async throws -> Int {
        try await pool.read { db in
            try Int.fetchOne(db, sql: "SELECT chunk_bytes FROM relay_usage WHERE space = ?", arguments: [Data(space.bytes)]) ?? 0
        }
    }

    public func storeChunk(_ id: ChunkID, sealed: [UInt8], space: SpaceID) async throws -> ChunkStored {
        let limits = self.limits
        return try await pool.write { db in
            let s = Data(space.bytes)
            if try Bool.fetchOne(db, sql: "SELECT 1 FROM relay_chunks WHERE space = ? AND id = ?", arguments: [s, Data(id.bytes)]) == true {
                return .held
            }
            guard let used = try Int.fetchOne(db, sql: "SELECT chunk_bytes FROM relay_usage WHERE space = ?", arguments: [s]) else {
                throw RelayError("space \(space.hex) has no usage row")
            }
            guard used + sealed.count <= limits.maxChunkBytesPerSpace else { return .overQuota }
            try db.execute(
                sql: "INSERT INTO relay_chunks(space, id, bytes) VALUES (?, ?, ?)", arguments: [s, Data(id.bytes), Data(sealed)])
            try db.execute(
                sql: "INSERT OR REPLACE INTO relay_chunk_leases(space, id, kept_ms) VALUES (?, ?, ?)",
                arguments: [s, Data(id.bytes), Int64(Date().timeIntervalSince1970 * 1000)])
            try db.execute(
                sql: "UPDATE relay_usage SET chunk_bytes = ?, last_write_ms = ? WHERE space = ?",
                arguments: [used + sealed.count, Int64(Date().timeIntervalSince1970 * 1000), s])
            return .stored
        }
    }

    public func chunk(_ id: ChunkID, space: SpaceID) async throws -> [UInt8]? {
        try await pool.read { db in
            try Data.fetchOne(
                db, sql: "SELECT bytes FROM relay_chunks WHERE space = ? AND id = ?", arguments: [Data(space.bytes), Data(id.bytes)]
            ).map { Array($0) }
        }
    }

    public func dropChunks(_ copies: [ChunkCopy], space: SpaceID) async throws -> Int {
        try await pool.write { db in
            let s = Data(space.bytes)
            var (dropped, freed) = (0, 0)
            for copy in copies {
                // Only the copy that was served: one a holder uploaded again since stays.
                let match = "space = ? AND id = ? AND substr(bytes, 1, ?) = ?"
                let arguments: StatementArguments = [s, Data(copy.id.bytes), copy.prefix.count, Data(copy.prefix)]
                guard let length = try Int.fetchOne(db, sql: "SELECT length(bytes) FROM relay_chunks WHERE \(match)", arguments: arguments)
                else { continue }
                try db.execute(sql: "DELETE FROM relay_chunks WHERE \(match)", arguments: arguments)
                try db.execute(sql: "DELETE FROM relay_chunk_leases WHERE space = ? AND id = ?", arguments: [s, Data(copy.id.bytes)])
                (dropped, freed) = (dropped + 1, freed + length)
            }
            if freed > 0 {
                try db.execute(
                    sql: "UPDATE relay_usage SET chunk_bytes = max(0, chunk_bytes - ?) WHERE space = ?", arguments: [freed, s])
            }
            return dropped
        }
    }
}
