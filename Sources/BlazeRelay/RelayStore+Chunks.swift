import BlazeProtocol
import Foundation
import GRDB

/// Blob chunks held by the SQLite store (Protocol/RELAY.md, "Blob chunks"): sealed as members uploaded them, counted in
/// their space's bytes.
extension RelayStore {
    /// The table of chunks: an ordinary rowid table, as its rows are large (up to 4 MiB each).
    static let chunksTable = """
        CREATE TABLE relay_chunks(
            space BLOB NOT NULL,
            id BLOB NOT NULL,
            bytes BLOB NOT NULL,
            UNIQUE(space, id)
        )
        """

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

    public func storeChunk(_ id: ChunkID, sealed: [UInt8], space: SpaceID) async throws -> ChunkStored {
        let limits = self.limits
        return try await pool.write { db in
            let s = Data(space.bytes)
            if try Bool.fetchOne(db, sql: "SELECT 1 FROM relay_chunks WHERE space = ? AND id = ?", arguments: [s, Data(id.bytes)]) == true {
                return .held
            }
            let bytes = (try Int.fetchOne(db, sql: "SELECT bytes FROM relay_usage WHERE space = ?", arguments: [s]) ?? 0) + sealed.count
            guard bytes <= limits.maxBytesPerSpace else { return .overQuota }
            try db.execute(
                sql: "INSERT INTO relay_chunks(space, id, bytes) VALUES (?, ?, ?)", arguments: [s, Data(id.bytes), Data(sealed)])
            try db.execute(
                sql: "UPDATE relay_usage SET bytes = ?, last_write_ms = ? WHERE space = ?",
                arguments: [bytes, Int64(Date().timeIntervalSince1970 * 1000), s])
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

    public func dropChunks(_ ids: [ChunkID], space: SpaceID) async throws -> Int {
        try await pool.write { db in
            let s = Data(space.bytes)
            var (dropped, freed) = (0, 0)
            for id in ids {
                guard let length = try Int.fetchOne(
                    db, sql: "SELECT length(bytes) FROM relay_chunks WHERE space = ? AND id = ?", arguments: [s, Data(id.bytes)])
                else { continue }
                try db.execute(sql: "DELETE FROM relay_chunks WHERE space = ? AND id = ?", arguments: [s, Data(id.bytes)])
                (dropped, freed) = (dropped + 1, freed + length)
            }
            if freed > 0 { try db.execute(sql: "UPDATE relay_usage SET bytes = max(0, bytes - ?) WHERE space = ?", arguments: [freed, s]) }
            return dropped
        }
    }
}
