import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import Foundation
import PostgresNIO

/// Acknowledgements, statements of entry formats, snapshots and bases in PostgreSQL (SYNC.md §6, §11,
/// Protocol/RELAY.md).
extension PostgresRelayStore {
    // MARK: Acknowledgements and statements of entry formats

    public func keepAcks(_ acks: [Acknowledgement], space: SpaceID) async throws -> [Acknowledgement] {
        let mine = acks.filter { $0.space == space }
        let kept = try await keepLatest("relay_acks", notify: "a", mine.map { ($0.node, $0.issuedMs, $0.bytes) }, space: space)
        return mine.enumerated().filter { kept.contains($0.offset) }.map(\.element)
    }

    public func acks(space: SpaceID) async throws -> [Acknowledgement] {
        try await latest("relay_acks", space: space).compactMap { try? Acknowledgement(bytes: $0) }
    }

    public func keepFormats(_ statements: [FormatStatement], space: SpaceID) async throws -> [FormatStatement] {
        let mine = statements.filter { $0.space == space }
        let kept = try await keepLatest("relay_formats", notify: "f", mine.map { ($0.node, $0.issuedMs, $0.bytes) }, space: space)
        return mine.enumerated().filter { kept.contains($0.offset) }.map(\.element)
    }

    public func formats(space: SpaceID) async throws -> [FormatStatement] {
        // Kept only once verified (`RelayRules.acceptableFormats`): read back by their shape.
        try await latest("relay_formats", space: space).compactMap { try? FormatStatement(unverified: $0) }
    }

    /// Keeps each of `items` (signer, when issued, signed bytes) newer than the one `table` holds of its signer in
    /// `space`, and tells other relay processes (`notify` names the change); returns the positions of those kept.
    private func keepLatest(
        _ table: String, notify kind: String, _ items: [(node: [UInt8], issuedMs: UInt64, bytes: [UInt8])], space: SpaceID
    ) async throws -> Set<Int> {
        guard !items.isEmpty else { return [] }
        return try await bounded { [self] in
            let s = Data(space.bytes)
            return try await transaction { conn in
                // The usage row is the space's lock: "newer than held" holds across processes.
                guard try await conn.query("SELECT 1 FROM relay_usage WHERE space = \(s) FOR UPDATE", logger: self.logger)
                    .decode(Int32.self).all().first != nil
                else { return [] }
                var kept: Set<Int> = []
                for (i, item) in items.enumerated() {
                    let node = Data(item.node)
                    // The table name is one of this file's constants, never input.
                    let held = try await conn.query(
                        PostgresQuery(unsafeSQL: "SELECT issued_ms FROM \(table) WHERE space = $1 AND node = $2", binds: try Self.binds(s, node)),
                        logger: self.logger
                    ).decode(Int64.self).all().first
                    // Stored as an unsigned value's bits: ordering by it is checked here, not in SQL.
                    if let held, UInt64(bitPattern: held) >= item.issuedMs { continue }
                    try await conn.query(
                        PostgresQuery(
                            unsafeSQL: """
                                INSERT INTO \(table)(space, node, issued_ms, bytes) VALUES ($1, $2, $3, $4) \
                                ON CONFLICT (space, node) DO UPDATE SET issued_ms = EXCLUDED.issued_ms, bytes = EXCLUDED.bytes
                                """,
                            binds: try Self.binds(s, node, Int64(bitPattern: item.issuedMs), Data(item.bytes))),
                        logger: self.logger)
                    kept.insert(i)
                }
                if !kept.isEmpty { try await self.notify(conn, kind, space: space) }
                return kept
            }
        }
    }

    /// The signed bytes `table` holds for `space`, by signer.
    private func latest(_ table: String, space: SpaceID) async throws -> [[UInt8]] {
        try await bounded { [self] in
            try await client.query(
                PostgresQuery(unsafeSQL: "SELECT bytes FROM \(table) WHERE space = $1 ORDER BY node", binds: try Self.binds(Data(space.bytes))),
                logger: logger
            ).decode(Data.self).all().map { Array($0) }
        }
    }

    /// Bindings of `values`, in order.
    private static func binds(_ values: any PostgresEncodable...) throws -> PostgresBindings {
        var b = PostgresBindings()
        for v in values { try b.append(v) }
        return b
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
