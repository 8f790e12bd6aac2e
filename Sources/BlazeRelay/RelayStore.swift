import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeWire
import Foundation
import GRDB

/// What a relay keeps, in one SQLite file: per space, its capability (what devices prove in the handshake), its
/// membership log (public and signed), and per origin the sealed entries and the heads their origins signed — all as
/// they travel, none of which the relay can open (Protocol/RELAY.md). One relay process at a time.
public final class RelayStore: RelayBackend {
    let pool: DatabasePool
    /// Per-space limits.
    public let limits: RelayLimits

    /// Opens (creating when needed) the relay's database at `path`.
    public init(path: String, limits: RelayLimits = RelayLimits()) throws {
        var config = Configuration()
        config.busyMode = .timeout(10)
        config.prepareDatabase { db in try db.execute(sql: "PRAGMA synchronous = NORMAL") }
        // Before the pool opens it (which writes): a file of a newer relay is refused, one of an older relay copied.
        try Self.prepareFormat(path: path)
        pool = try DatabasePool(path: path, configuration: config)
        self.limits = limits
        try Self.migrator.migrate(pool)
    }

    /// The relay file's migrations, append-only: never edit a shipped one.
    static var migrator: DatabaseMigrator {
        var m = DatabaseMigrator()
        m.registerMigration("v1") { db in
            try db.execute(
                sql: """
                    CREATE TABLE relay_spaces(
                        id BLOB PRIMARY KEY NOT NULL,
                        capability BLOB NOT NULL,
                        added_at INTEGER NOT NULL
                    ) WITHOUT ROWID;
                    CREATE TABLE relay_ops(
                        space BLOB NOT NULL,
                        hash BLOB NOT NULL,
                        bytes BLOB NOT NULL,
                        PRIMARY KEY(space, hash)
                    ) WITHOUT ROWID;
                    CREATE TABLE relay_entries(
                        space BLOB NOT NULL,
                        origin BLOB NOT NULL,
                        seq INTEGER NOT NULL,
                        hash BLOB NOT NULL,
                        bytes BLOB NOT NULL,
                        PRIMARY KEY(space, origin, seq)
                    ) WITHOUT ROWID;
                    CREATE TABLE relay_heads(
                        space BLOB NOT NULL,
                        origin BLOB NOT NULL,
                        seq INTEGER NOT NULL,
                        head BLOB NOT NULL,
                        PRIMARY KEY(space, origin, seq)
                    ) WITHOUT ROWID;
                    CREATE TABLE relay_usage(
                        space BLOB PRIMARY KEY NOT NULL,
                        entries INTEGER NOT NULL,
                        bytes INTEGER NOT NULL
                    ) WITHOUT ROWID;
                    """)
        }
        m.registerMigration("v2") { db in
            // Unix ms of the space's last write, for retention (0: nothing written since).
            try db.execute(sql: "ALTER TABLE relay_usage ADD COLUMN last_write_ms INTEGER NOT NULL DEFAULT 0")
        }
        m.registerMigration("v3") { db in
            // The latest acknowledgement of each signer per space (SYNC.md §11), passed on to the space's devices.
            try db.execute(
                sql: """
                    CREATE TABLE relay_acks(
                        space BLOB NOT NULL,
                        node BLOB NOT NULL,
                        issued_ms INTEGER NOT NULL,
                        bytes BLOB NOT NULL,
                        PRIMARY KEY(space, node)
                    ) WITHOUT ROWID
                    """)
        }
        m.registerMigration("v4") { db in
            // The latest snapshot a member uploaded per space (SYNC.md §11), and per origin the entry the held ones
            // follow when the snapshot covers what is not held.
            try db.execute(
                sql: """
                    CREATE TABLE relay_snapshots(
                        space BLOB PRIMARY KEY NOT NULL,
                        created_ms INTEGER NOT NULL,
                        manifest BLOB NOT NULL
                    ) WITHOUT ROWID;
                    CREATE TABLE relay_snapshot_parts(
                        space BLOB NOT NULL,
                        idx INTEGER NOT NULL,
                        bytes BLOB NOT NULL,
                        PRIMARY KEY(space, idx)
                    ) WITHOUT ROWID;
                    CREATE TABLE relay_bases(
                        space BLOB NOT NULL,
                        origin BLOB NOT NULL,
                        seq INTEGER NOT NULL,
                        hash BLOB NOT NULL,
                        PRIMARY KEY(space, origin)
                    ) WITHOUT ROWID;
                    """)
        }
        m.registerMigration("v5") { db in try db.execute(sql: RelayStore.joinsTable) }
        m.registerMigration("v6") { db in
            // Pieces of snapshots being uploaded, staged as they come until the last one is in (SYNC.md §11); an
            // ordinary rowid table, as its rows are large.
            try db.execute(
                sql: """
                    CREATE TABLE relay_snapshot_uploads(
                        upload BLOB NOT NULL,
                        idx INTEGER NOT NULL,
                        space BLOB NOT NULL,
                        started_ms INTEGER NOT NULL,
                        bytes BLOB NOT NULL,
                        PRIMARY KEY(upload, idx)
                    )
                    """)
        }
        m.registerMigration("v7") { db in try db.execute(sql: RelayStore.chunksTable) }
        m.registerMigration("v8") { db in try db.execute(sql: RelayStore.leasesTable) }
        m.registerMigration("v9") { db in
            // The latest statement of entry formats of each signer per space (SYNC.md §6, "Entry formats"), passed
            // on to the space's devices like acknowledgements.
            try db.execute(
                sql: """
                    CREATE TABLE relay_formats(
                        space BLOB NOT NULL,
                        node BLOB NOT NULL,
                        issued_ms INTEGER NOT NULL,
                        bytes BLOB NOT NULL,
                        PRIMARY KEY(space, node)
                    ) WITHOUT ROWID
                    """)
        }
        return m
    }

    /// The relay file's format version this build writes: how many migrations it has had.
    public static var formatVersion: Int { migrator.migrations.count }

    // MARK: Spaces

    public func add(_ capability: RelayCapability) async throws -> Bool {
        try await pool.write { db in
            if let held = try Data.fetchOne(db, sql: "SELECT capability FROM relay_spaces WHERE id = ?", arguments: [Data(capability.space.bytes)]) {
                guard Array(held) == capability.capability else {
                    throw RelayError("space \(capability.space.hex) is served here with another capability")
                }
                return false
            }
            try db.execute(
                sql: "INSERT INTO relay_spaces(id, capability, added_at) VALUES (?, ?, ?)",
                arguments: [Data(capability.space.bytes), Data(capability.capability), Int64(Date().timeIntervalSince1970 * 1000)])
            try db.execute(sql: "INSERT INTO relay_usage(space, entries, bytes) VALUES (?, 0, 0)", arguments: [Data(capability.space.bytes)])
            return true
        }
    }

    public func spaces() async throws -> [SpaceKey] {
        try await pool.read { db in
            try Row.fetchAll(db, sql: "SELECT id, capability FROM relay_spaces ORDER BY id").map {
                try SpaceKey(id: try RelayError.storedSpace($0[0] as Data), capability: Array($0[1] as Data))
            }
        }
    }

    public func usage(space: SpaceID) async throws -> (entries: Int, bytes: Int) {
        try await pool.read { db in
            let row = try Row.fetchOne(db, sql: "SELECT entries, bytes FROM relay_usage WHERE space = ?", arguments: [Data(space.bytes)])
            return (row?[0] ?? 0, row?[1] ?? 0)
        }
    }

    // MARK: Membership log

    public func ops(space: SpaceID) async throws -> [MembershipOp] {
        try await pool.read { db in
            try Data.fetchAll(db, sql: "SELECT bytes FROM relay_ops WHERE space = ?", arguments: [Data(space.bytes)]).map {
                try MembershipOp(bytes: Array($0))
            }
        }
    }

    public func addOps(_ ops: [MembershipOp], space: SpaceID) async throws -> [MembershipOp] {
        let maxOps = limits.maxOps
        return try await pool.write { db in
            var count = try Int.fetchOne(db, sql: "SELECT count(*) FROM relay_ops WHERE space = ?", arguments: [Data(space.bytes)]) ?? 0
            var fresh: [MembershipOp] = []
            for op in ops where op.space == space && count < maxOps {
                try db.execute(
                    sql: "INSERT OR IGNORE INTO relay_ops(space, hash, bytes) VALUES (?, ?, ?)",
                    arguments: [Data(space.bytes), Data(op.hash.bytes), Data(op.bytes)])
                if db.changesCount > 0 {
                    fresh.append(op)
                    count += 1
                }
            }
            if !fresh.isEmpty {
                // Operations count in the space's bytes (they are never refused for it: a removal must always get
                // through), so entries meet the quota sooner when the log is large.
                try db.execute(
                    sql: "UPDATE relay_usage SET bytes = bytes + ?, last_write_ms = ? WHERE space = ?",
                    arguments: [fresh.reduce(0) { $0 + $1.bytes.count }, Int64(Date().timeIntervalSince1970 * 1000), Data(space.bytes)])
            }
            return fresh
        }
    }

    // MARK: Entries

    public func vector(space: SpaceID) async throws -> [NodeID: UInt64] {
        try await pool.read { db in
            var out: [NodeID: UInt64] = [:]
            for row in try Row.fetchAll(
                db, sql: "SELECT origin, max(seq) FROM relay_heads WHERE space = ? GROUP BY origin", arguments: [Data(space.bytes)])
            {
                out[NodeID(bytes: Array(row[0] as Data))] = UInt64(row[1] as Int64)
            }
            // What a snapshot covers counts as held: a device needing it gets the snapshot.
            for (origin, base) in try Self.bases(db, Data(space.bytes)) { out[origin] = max(out[origin] ?? 0, base.seq) }
            return out
        }
    }

    public func batch(space: SpaceID, origin: NodeID, after: UInt64, maxEntries: Int, maxBytes: Int) async throws -> EntryBatch? {
        guard RelayRules.readable(after: after, maxEntries: maxEntries) else { return nil }
        return try await pool.read { db in
            let (s, o) = (Data(space.bytes), Data(origin.bytes))
            // Not held: what a snapshot covers comes with the snapshot.
            if let base = try Self.bases(db, s)[origin], after < base.seq { return nil }
            // The heads within reach, and the nearest one (which may lie beyond it).
            let heads = try Int64.fetchAll(
                db, sql: "SELECT seq FROM relay_heads WHERE space = ? AND origin = ? AND seq > ? AND seq <= ? ORDER BY seq",
                arguments: [s, o, Int64(after), Int64(after) + Int64(maxEntries)])
            guard let nearest = try heads.first ?? Int64.fetchOne(
                db, sql: "SELECT min(seq) FROM relay_heads WHERE space = ? AND origin = ? AND seq > ?",
                arguments: [s, o, Int64(after)])
            else { return nil }
            let sizes = try Row.fetchAll(
                db, sql: "SELECT seq, length(bytes) FROM relay_entries WHERE space = ? AND origin = ? AND seq > ? AND seq <= ? ORDER BY seq",
                arguments: [s, o, Int64(after), Int64(after) + Int64(maxEntries)]
            ).map { (seq: $0[0] as Int64, length: $0[1] as Int) }
            let end = RelayRules.batchEnd(heads: heads, nearest: nearest, sizes: sizes, maxBytes: maxBytes)
            guard let headBytes = try Data.fetchOne(
                db, sql: "SELECT head FROM relay_heads WHERE space = ? AND origin = ? AND seq = ?", arguments: [s, o, end])
            else { return nil }
            let rows = try Row.fetchAll(
                db, sql: "SELECT bytes, hash FROM relay_entries WHERE space = ? AND origin = ? AND seq > ? AND seq <= ? ORDER BY seq",
                arguments: [s, o, Int64(after), end])
            guard rows.count == Int(end - Int64(after)) else {
                throw RelayError("entries of \(origin) after \(after) are missing from the relay's store")
            }
            return EntryBatch(
                origin: origin, entries: try rows.map { try SealedEntry(stored: Array($0[0] as Data), hash: Array($0[1] as Data)) },
                head: try SignedHead(bytes: Array(headBytes)[...]))
        }
    }

    public func store(_ batch: EntryBatch, space: SpaceID, membership: MembershipState?) async throws -> Int {
        try RelayRules.checkAuthor(batch, membership: membership)
        let limits = self.limits
        return try await pool.write { db -> Int in
            let (s, o) = (Data(space.bytes), Data(batch.origin.bytes))
            let base = try Self.bases(db, s)[batch.origin]
            let held = max(
                base?.seq ?? 0,
                UInt64(
                    try Int64.fetchOne(db, sql: "SELECT max(seq) FROM relay_entries WHERE space = ? AND origin = ?", arguments: [s, o])
                        ?? 0))
            var hashes: [UInt64: [UInt8]] = [:]
            if let base { hashes[base.seq] = base.hash }
            if let range = try RelayRules.seqsToCheck(batch, held: held, base: base) {
                for row in try Row.fetchAll(
                    db, sql: "SELECT seq, hash FROM relay_entries WHERE space = ? AND origin = ? AND seq BETWEEN ? AND ?",
                    arguments: [s, o, Int64(range.lowerBound), Int64(range.upperBound)])
                {
                    hashes[UInt64(row[0] as Int64)] = Array(row[1] as Data)
                }
            }
            let fresh = try RelayRules.fresh(batch, space: space, held: held, hashes: hashes)
            guard !fresh.isEmpty else { return 0 }
            let usage = try Row.fetchOne(db, sql: "SELECT entries, bytes FROM relay_usage WHERE space = ?", arguments: [s])
            let entries = (usage?[0] as Int? ?? 0) + fresh.count
            let total = (usage?[1] as Int? ?? 0) + fresh.reduce(0) { $0 + $1.bytes.count }
            try RelayRules.checkQuota(entries: entries, bytes: total, limits: limits)
            for e in fresh {
                try db.execute(
                    sql: "INSERT INTO relay_entries(space, origin, seq, hash, bytes) VALUES (?, ?, ?, ?, ?)",
                    arguments: [s, o, Int64(e.header.seq), Data(e.hash), Data(e.bytes)])
            }
            try db.execute(
                sql: "UPDATE relay_usage SET entries = ?, bytes = ?, last_write_ms = ? WHERE space = ?",
                arguments: [entries, total, Int64(Date().timeIntervalSince1970 * 1000), s])
            try db.execute(
                sql: "INSERT OR IGNORE INTO relay_heads(space, origin, seq, head) VALUES (?, ?, ?, ?)",
                arguments: [s, o, Int64(batch.head.seq), Data(batch.head.bytes)])
            return fresh.count
        }
    }

    public func expire(idleBefore cutoffMs: Int64) async throws -> [SpaceID] {
        try await pool.write { db in
            let idle = try Data.fetchAll(
                db, sql: "SELECT space FROM relay_usage WHERE last_write_ms > 0 AND last_write_ms < ?", arguments: [cutoffMs])
            for space in idle {
                for table in [
                    "relay_entries", "relay_heads", "relay_ops", "relay_acks", "relay_formats", "relay_snapshots",
                    "relay_snapshot_parts", "relay_bases", "relay_snapshot_uploads", "relay_chunks", "relay_chunk_leases",
                ] {
                    try db.execute(sql: "DELETE FROM \(table) WHERE space = ?", arguments: [space])
                }
                try db.execute(
                    sql: "UPDATE relay_usage SET entries = 0, bytes = 0, chunk_bytes = 0, last_write_ms = 0 WHERE space = ?",
                    arguments: [space])
            }
            return idle.compactMap { SpaceID(bytes: $0) }
        }
    }

    /// One process owns the file: there is no one else to watch.
    public func watch(_ onChange: @escaping @Sendable (RelayChange) -> Void) async {}
}

/// Limits a relay holds each space to.
public struct RelayLimits: Sendable {
    /// Most entries stored per space.
    public var maxEntriesPerSpace = 10_000_000
    /// Most entry bytes stored per space (membership operations count in them).
    public var maxBytesPerSpace = 10 << 30
    /// Most bytes of blob chunks stored per space, apart from the entries' (so chunks never crowd out entries).
    public var maxChunkBytesPerSpace = 10 << 30
    /// A chunk lease renewed within this many milliseconds is not renewed again (`keepChunks` reads, not writes).
    public static let renewalSlackMs: Int64 = 3_600_000
    /// Most membership operations per space.
    public var maxOps = 100_000

    /// The defaults.
    public init() {}
}

/// A relay failure with a message for its operator.
public struct RelayError: Error, CustomStringConvertible {
    /// What went wrong.
    public let description: String
    /// An error saying `description`.
    public init(_ description: String) { self.description = description }

    /// The space id a row holds; throws for one of another length (a damaged store), never traps.
    static func storedSpace(_ bytes: Data) throws(RelayError) -> SpaceID {
        guard let id = SpaceID(bytes: bytes) else { throw RelayError("a stored space id has \(bytes.count) bytes, not 16") }
        return id
    }
}
