import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import Foundation
import PostgresNIO

/// Acknowledgements, snapshots and bases in PostgreSQL (SYNC.md §11, Protocol/RELAY.md).
extension PostgresRelayStore {
    // MARK: Acknowledgements

    public func keepAcks(_ acks: [Acknowledgement], space: SpaceID) async throws -> [Acknowledgement] {
        let mine = acks.filter { $0.space == space }
        guard !mine.isEmpty else { return [] }
        return try await bounded { [self] in
            let s = Data(space.bytes)
            return try await transaction { conn in
                // The usage row is the space's lock: "newer than held" holds across processes.
                guard try await conn.query("SELECT 1 FROM relay_usage WHERE space = \(s) FOR UPDATE", logger: self.logger)
                    .decode(Int32.self).all().first != nil
                else { return [] }
                var kept: [Acknowledgement] = []
                for ack in mine {
                    let node = Data(ack.node)
                    let held = try await conn.query(
                        "SELECT issued_ms FROM relay_acks WHERE space = \(s) AND node = \(node)", logger: self.logger
                    ).decode(Int64.self).all().first
                    // Stored as an unsigned value's bits: ordering by it is checked here, not in SQL.
                    if let held, UInt64(bitPattern: held) >= ack.issuedMs { continue }
                    let issued = Int64(bitPattern: ack.issuedMs), bytes = Data(ack.bytes)
                    try await conn.query(
                        """
                        INSERT INTO relay_acks(space, node, issued_ms, bytes) VALUES (\(s), \(node), \(issued), \(bytes)) \
                        ON CONFLICT (space, node) DO UPDATE SET issued_ms = EXCLUDED.issued_ms, bytes = EXCLUDED.bytes
                        """, logger: self.logger)
                    kept.append(ack)
                }
                if !kept.isEmpty { try await self.notify(conn, "a", space: space) }
                return kept
            }
        }
    }

    public func acks(space: SpaceID) async throws -> [Acknowledgement] {
        try await bounded { [self] in
            try await client.query("SELECT bytes FROM relay_acks WHERE space = \(Data(space.bytes)) ORDER BY node", logger: logger)
                .decode(Data.self).all()
                .compactMap { try? Acknowledgement(bytes: Array($0)) }
        }
    }

    // MARK: Snapshots

    func bases(_ conn: PostgresConnection, _ s: Data) async throws -> [NodeID: PrunedHead] {
        var out: [NodeID: PrunedHead] = [:]
        for (origin, seq, hash) in try await conn.query(
            "SELECT origin, seq, hash FROM relay_bases WHERE space = \(s)", logger: logger
        ).decode((Data, Int64, Data).self).all() {
            out[NodeID(bytes: Array(origin))] = PrunedHead(seq: UInt64(seq), hash: Array(hash))
        }
        return out
    }

    public func bases(space: SpaceID) async throws -> [NodeID: PrunedHead] {
        try await bounded { [self] in
            try await client.withConnection { conn in try await self.bases(conn, Data(space.bytes)) }
        }
    }

    public func stageSnapshotPart(_ part: SnapshotPart, upload: [UInt8], space: SpaceID, startedMs: Int64) async throws {
        try await bounded { [self] in
            let (u, idx, s, bytes) = (Data(upload), Int64(part.index), Data(space.bytes), Data(part.bytes))
            _ = try await client.query(
                """
                INSERT INTO relay_snapshot_uploads(upload, idx, space, started_ms, bytes) \
                VALUES (\(u), \(idx), \(s), \(startedMs), \(bytes))
                """, logger: logger)
        }
    }

    public func dropSnapshotUpload(_ upload: [UInt8]) async throws {
        try await bounded { [self] in
            _ = try await client.query("DELETE FROM relay_snapshot_uploads WHERE upload = \(Data(upload))", logger: logger)
        }
    }

    public func dropSnapshotUploads(startedBefore cutoffMs: Int64) async throws -> Int {
        try await bounded { [self] in
            // Other relay processes share the table: only what no upload under way can own goes (by age).
            let gone = try await client.query(
                """
                WITH gone AS (DELETE FROM relay_snapshot_uploads WHERE started_ms < \(cutoffMs) RETURNING 1) \
                SELECT count(*) FROM gone
                """, logger: logger
            ).decode(Int64.self).all().first
            return Int(gone ?? 0)
        }
    }

    public func keepSnapshot(_ manifest: SnapshotManifest, upload: [UInt8], space: SpaceID) async throws -> Bool {
        try await bounded { [self] in
            let (s, u) = (Data(space.bytes), Data(upload))
            return try await transaction { conn in
                // The staged pieces go whatever the outcome; kept, they are copied in the server, never read here.
                func done(_ kept: Bool) async throws -> Bool {
                    try await conn.query("DELETE FROM relay_snapshot_uploads WHERE upload = \(u)", logger: self.logger)
                    return kept
                }
                // The usage row is the space's lock.
                guard try await conn.query("SELECT 1 FROM relay_usage WHERE space = \(s) FOR UPDATE", logger: self.logger)
                    .decode(Int32.self).all().first != nil
                else { return try await done(false) }
                // Every piece the manifest counts, once each (the key makes indexes unique), and the bytes it declares.
                let staged = try await conn.query(
                    """
                    SELECT count(*), coalesce(max(idx), -1), coalesce(sum(octet_length(bytes)), 0)::bigint \
                    FROM relay_snapshot_uploads WHERE upload = \(u) AND space = \(s)
                    """, logger: self.logger
                ).decode((Int64, Int64, Int64).self).all().first
                guard let staged, staged.0 == Int64(manifest.parts), staged.1 == Int64(manifest.parts) - 1,
                    UInt64(staged.2) == manifest.size
                else { return try await done(false) }
                let held = try await conn.query("SELECT manifest FROM relay_snapshots WHERE space = \(s)", logger: self.logger)
                    .decode(Data.self).all().first.flatMap { try? SnapshotManifest(bytes: Array($0)) }
                let bases = try await self.bases(conn, s)
                guard RelayRules.supersedes(manifest, held: held, bases: bases) else { return try await done(false) }
                var reach: [NodeID: UInt64] = bases.mapValues(\.seq)
                for (origin, seq) in try await conn.query(
                    "SELECT origin, max(seq) FROM relay_entries WHERE space = \(s) GROUP BY origin", logger: self.logger
                ).decode((Data, Int64).self).all() {
                    let node = NodeID(bytes: Array(origin))
                    reach[node] = max(reach[node] ?? 0, UInt64(seq))
                }
                for (origin, base) in RelayRules.newBases(manifest, held: reach) {
                    let (o, seq, hash) = (Data(origin.bytes), Int64(base.seq), Data(base.hash))
                    let gone = try await conn.query(
                        """
                        SELECT count(*), coalesce(sum(octet_length(bytes)), 0)::bigint FROM relay_entries \
                        WHERE space = \(s) AND origin = \(o) AND seq <= \(seq)
                        """, logger: self.logger
                    ).decode((Int64, Int64).self).all().first ?? (Int64(0), Int64(0))
                    try await conn.query(
                        "DELETE FROM relay_entries WHERE space = \(s) AND origin = \(o) AND seq <= \(seq)", logger: self.logger)
                    try await conn.query(
                        "DELETE FROM relay_heads WHERE space = \(s) AND origin = \(o) AND seq <= \(seq)", logger: self.logger)
                    try await conn.query(
                        "UPDATE relay_usage SET entries = entries - \(gone.0), bytes = bytes - \(gone.1) WHERE space = \(s)",
                        logger: self.logger)
                    try await conn.query(
                        """
                        INSERT INTO relay_bases(space, origin, seq, hash) VALUES (\(s), \(o), \(seq), \(hash)) \
                        ON CONFLICT (space, origin) DO UPDATE SET seq = EXCLUDED.seq, hash = EXCLUDED.hash
                        """, logger: self.logger)
                }
                try await conn.query("DELETE FROM relay_snapshot_parts WHERE space = \(s)", logger: self.logger)
                try await conn.query(
                    """
                    INSERT INTO relay_snapshot_parts(space, idx, bytes) \
                    SELECT space, idx, bytes FROM relay_snapshot_uploads WHERE upload = \(u)
                    """, logger: self.logger)
                let (created, bytes) = (Int64(clamping: manifest.createdMs), Data(manifest.bytes))
                try await conn.query(
                    """
                    INSERT INTO relay_snapshots(space, created_ms, manifest) VALUES (\(s), \(created), \(bytes)) \
                    ON CONFLICT (space) DO UPDATE SET created_ms = EXCLUDED.created_ms, manifest = EXCLUDED.manifest
                    """, logger: self.logger)
                try await conn.query(
                    "UPDATE relay_usage SET last_write_ms = \(Self.nowMs()) WHERE space = \(s)", logger: self.logger)
                // Other processes' devices may need it: they pump again.
                try await self.notify(conn, "e", space: space)
                return try await done(true)
            }
        }
    }

    public func snapshotManifest(space: SpaceID) async throws -> SnapshotManifest? {
        try await bounded { [self] in
            try await client.query("SELECT manifest FROM relay_snapshots WHERE space = \(Data(space.bytes))", logger: logger)
                // One stored by an earlier layout (before manifests declared their size) is as none.
                .decode(Data.self).all().first.flatMap { try? SnapshotManifest(bytes: Array($0)) }
        }
    }

    public func snapshotPart(space: SpaceID, index: UInt32) async throws -> SnapshotPart? {
        try await bounded { [self] in
            let idx = Int64(index)
            return try await client.query(
                "SELECT bytes FROM relay_snapshot_parts WHERE space = \(Data(space.bytes)) AND idx = \(idx)", logger: logger
            ).decode(Data.self).all().first.map { try SnapshotPart(bytes: Array($0)) }
        }
    }
}
