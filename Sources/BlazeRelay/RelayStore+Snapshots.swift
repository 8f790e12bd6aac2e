import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import Foundation
import GRDB

/// Snapshots, bases, acknowledgements and statements of entry formats in the SQLite store (SYNC.md §6, §11,
/// Protocol/RELAY.md).
extension RelayStore {
    // MARK: Snapshots

    static func bases(_ db: Database, _ space: Data) throws -> [NodeID: PrunedHead] {
        var out: [NodeID: PrunedHead] = [:]
        for row in try Row.fetchAll(db, sql: "SELECT origin, seq, hash FROM relay_bases WHERE space = ?", arguments: [space]) {
            out[NodeID(bytes: Array(row[0] as Data))] = PrunedHead(seq: UInt64(row[1] as Int64), hash: Array(row[2] as Data))
        }
        return out
    }

    public func bases(space: SpaceID) async throws -> [NodeID: PrunedHead] {
        try await pool.read { db in try Self.bases(db, Data(space.bytes)) }
    }

    public func stageSnapshotPart(_ part: SnapshotPart, upload: [UInt8], space: SpaceID, startedMs: Int64) async throws {
        try await pool.write { db in
            try db.execute(
                sql: "INSERT INTO relay_snapshot_uploads(upload, idx, space, started_ms, bytes) VALUES (?, ?, ?, ?, ?)",
                arguments: [Data(upload), Int64(part.index), Data(space.bytes), startedMs, Data(part.bytes)])
        }
    }

    public func dropSnapshotUpload(_ upload: [UInt8]) async throws {
        try await pool.write { db in
            try db.execute(sql: "DELETE FROM relay_snapshot_uploads WHERE upload = ?", arguments: [Data(upload)])
        }
    }

    public func dropSnapshotUploads(startedBefore cutoffMs: Int64) async throws -> Int {
        try await pool.write { db in
            try db.execute(sql: "DELETE FROM relay_snapshot_uploads WHERE started_ms < ?", arguments: [cutoffMs])
            return db.changesCount
        }
    }

    public func keepSnapshot(_ manifest: SnapshotManifest, upload: [UInt8], space: SpaceID) async throws -> Bool {
        try await pool.write { db in
            let u = Data(upload)
            let kept = try Self.keepSnapshot(db, manifest, upload: u, space: Data(space.bytes))
            try db.execute(sql: "DELETE FROM relay_snapshot_uploads WHERE upload = ?", arguments: [u])
            return kept
        }
    }

    /// Promotes the staged upload `u` to the space's snapshot within the caller's transaction (`keepSnapshot`).
    private static func keepSnapshot(_ db: Database, _ manifest: SnapshotManifest, upload u: Data, space s: Data) throws -> Bool {
        // Every piece the manifest counts, once each (the key makes indexes unique), and the bytes it declares.
        let staged = try Row.fetchOne(
            db,
            sql: """
                SELECT count(*), coalesce(max(idx), -1), coalesce(sum(length(bytes)), 0) FROM relay_snapshot_uploads
                WHERE upload = ? AND space = ?
                """,
            arguments: [u, s])
        guard let staged, staged[0] as Int64 == Int64(manifest.parts), staged[1] as Int64 == Int64(manifest.parts) - 1,
            UInt64(staged[2] as Int64) == manifest.size
        else { return false }
        let held = try Data.fetchOne(db, sql: "SELECT manifest FROM relay_snapshots WHERE space = ?", arguments: [s])
            .flatMap { try? SnapshotManifest(bytes: Array($0)) }
        let bases = try Self.bases(db, s)
        guard try Data.fetchOne(db, sql: "SELECT space FROM relay_usage WHERE space = ?", arguments: [s]) != nil,
            RelayRules.supersedes(manifest, held: held, bases: bases)
        else { return false }
        var reach: [NodeID: UInt64] = bases.mapValues(\.seq)
        for row in try Row.fetchAll(
            db, sql: "SELECT origin, max(seq) FROM relay_entries WHERE space = ? GROUP BY origin", arguments: [s])
        {
            let origin = NodeID(bytes: Array(row[0] as Data))
            reach[origin] = max(reach[origin] ?? 0, UInt64(row[1] as Int64))
        }
        for (origin, base) in RelayRules.newBases(manifest, held: reach) {
            let (o, seq) = (Data(origin.bytes), Int64(base.seq))
            let gone = try Row.fetchOne(
                db, sql: "SELECT count(*), coalesce(sum(length(bytes)), 0) FROM relay_entries WHERE space = ? AND origin = ? AND seq <= ?",
                arguments: [s, o, seq])
            try db.execute(sql: "DELETE FROM relay_entries WHERE space = ? AND origin = ? AND seq <= ?", arguments: [s, o, seq])
            try db.execute(sql: "DELETE FROM relay_heads WHERE space = ? AND origin = ? AND seq <= ?", arguments: [s, o, seq])
            try db.execute(
                sql: "UPDATE relay_usage SET entries = entries - ?, bytes = bytes - ? WHERE space = ?",
                arguments: [gone?[0] as Int? ?? 0, gone?[1] as Int? ?? 0, s])
            try db.execute(
                sql: "INSERT OR REPLACE INTO relay_bases(space, origin, seq, hash) VALUES (?, ?, ?, ?)",
                arguments: [s, o, seq, Data(base.hash)])
        }
        // Copied within SQLite, a page at a time: the pieces never come into the relay's memory.
        try db.execute(sql: "DELETE FROM relay_snapshot_parts WHERE space = ?", arguments: [s])
        try db.execute(
            sql: "INSERT INTO relay_snapshot_parts(space, idx, bytes) SELECT space, idx, bytes FROM relay_snapshot_uploads WHERE upload = ?",
            arguments: [u])
        try db.execute(
            sql: "INSERT OR REPLACE INTO relay_snapshots(space, created_ms, manifest) VALUES (?, ?, ?)",
            arguments: [s, Int64(clamping: manifest.createdMs), Data(manifest.bytes)])
        try db.execute(
            sql: "UPDATE relay_usage SET last_write_ms = ? WHERE space = ?",
            arguments: [Int64(Date().timeIntervalSince1970 * 1000), s])
        return true
    }

    public func snapshotManifest(space: SpaceID) async throws -> SnapshotManifest? {
        try await pool.read { db in
            try Data.fetchOne(db, sql: "SELECT manifest FROM relay_snapshots WHERE space = ?", arguments: [Data(space.bytes)])
                // One stored by an earlier layout (before manifests declared their size) is as none: the next upload
                // replaces it.
                .flatMap { try? SnapshotManifest(bytes: Array($0)) }
        }
    }

    public func snapshotPart(space: SpaceID, index: UInt32) async throws -> SnapshotPart? {
        try await pool.read { db in
            try Data.fetchOne(
                db, sql: "SELECT bytes FROM relay_snapshot_parts WHERE space = ? AND idx = ?", arguments: [Data(space.bytes), Int64(index)]
            ).map { try SnapshotPart(bytes: Array($0)) }
        }
    }

    // MARK: Acknowledgements and statements of entry formats

    public func keepAcks(_ acks: [Acknowledgement], space: SpaceID) async throws -> [Acknowledgement] {
        let mine = acks.filter { $0.space == space }
        let kept = try await keepLatest("relay_acks", mine.map { ($0.node, $0.issuedMs, $0.bytes) }, space: space)
        return mine.enumerated().filter { kept.contains($0.offset) }.map(\.element)
    }

    public func acks(space: SpaceID) async throws -> [Acknowledgement] {
        try await latest("relay_acks", space: space).compactMap { try? Acknowledgement(bytes: $0) }
    }

    public func keepFormats(_ statements: [FormatStatement], space: SpaceID) async throws -> [FormatStatement] {
        let mine = statements.filter { $0.space == space }
        let kept = try await keepLatest("relay_formats", mine.map { ($0.node, $0.issuedMs, $0.bytes) }, space: space)
        return mine.enumerated().filter { kept.contains($0.offset) }.map(\.element)
    }

    public func formats(space: SpaceID) async throws -> [FormatStatement] {
        // Kept only once verified (`RelayRules.acceptableFormats`): read back by their shape.
        try await latest("relay_formats", space: space).compactMap { try? FormatStatement(unverified: $0) }
    }

    /// Keeps each of `items` (signer, when issued, signed bytes) newer than the one `table` holds of its signer in
    /// `space`; returns the positions of those kept.
    private func keepLatest(_ table: String, _ items: [(node: [UInt8], issuedMs: UInt64, bytes: [UInt8])], space: SpaceID) async throws -> Set<Int> {
        guard !items.isEmpty else { return [] }
        return try await pool.write { db in
            var kept: Set<Int> = []
            for (i, item) in items.enumerated() {
                // Stored as an unsigned value's bits: ordering by it is checked here, not in SQL.
                let held = try Int64.fetchOne(
                    db, sql: "SELECT issued_ms FROM \(table) WHERE space = ? AND node = ?", arguments: [Data(space.bytes), Data(item.node)])
                if let held, UInt64(bitPattern: held) >= item.issuedMs { continue }
                try db.execute(
                    sql: "INSERT OR REPLACE INTO \(table)(space, node, issued_ms, bytes) VALUES (?, ?, ?, ?)",
                    arguments: [Data(space.bytes), Data(item.node), Int64(bitPattern: item.issuedMs), Data(item.bytes)])
                kept.insert(i)
            }
            return kept
        }
    }

    /// The signed bytes `table` holds for `space`, by signer.
    private func latest(_ table: String, space: SpaceID) async throws -> [[UInt8]] {
        try await pool.read { db in
            try Data.fetchAll(db, sql: "SELECT bytes FROM \(table) WHERE space = ? ORDER BY node", arguments: [Data(space.bytes)]).map { Array($0) }
        }
    }
}
