import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeWire
import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import PostgresNIO
import Synchronization

/// The relay's store in PostgreSQL (`blaze-relay serve --postgres URL`), shared by any number of relay processes:
/// the same tables and rules as `RelayStore`, writes of one space serialized by a row lock on its usage, and every
/// change announced on the `blaze_relay` notification channel so that the devices of one space on different relay
/// processes see each other's entries live (Protocol/RELAY.md, "Storage").
public final class PostgresRelayStore: RelayBackend {
    let client: PostgresClient
    private let runner: Task<Void, Never>
    /// Set by `close()`: a connection failing from then on is the store closing, not something to warn about.
    let closed = Atomic<Bool>(false)
    /// Per-space limits.
    public let limits: RelayLimits
    let logger: Logger
    /// Where operations and their deadlines run (see `withDeadline`).
    let executor = EventLoopTaskExecutor(group: MultiThreadedEventLoopGroup.singleton)
    /// This process's id in notifications, so that it skips its own.
    let instance = UUID().uuidString.prefix(8).lowercased()
    /// The notification channel.
    static let channel = "blaze_relay"

    /// How long one store operation may take: a query in flight when the PostgreSQL server goes away can stay
    /// unanswered for good (no error, no end, even when cancelled), and the relay must not wait on it.
    public let operationTimeout: Duration

    /// Connects (a pool of connections, opened as needed) and creates the tables when missing; an operation that takes
    /// longer than `operationTimeout` throws.
    public init(
        configuration: PostgresClient.Configuration, limits: RelayLimits = RelayLimits(), logger: Logger,
        operationTimeout: Duration = .seconds(30)
    ) async throws {
        self.operationTimeout = operationTimeout
        var configuration = configuration
        configuration.options.connectTimeout = .seconds(5)
        let client = PostgresClient(configuration: configuration, backgroundLogger: logger)
        self.client = client
        // Detached: the client must not inherit a caller's graceful-shutdown context (swift-service-lifecycle's task
        // locals). It would close its connections as soon as shutdown begins, before the relay is done with them;
        // `close()` ends it once the relay has stopped.
        self.runner = Task.detached { await client.run() }
        self.limits = limits
        self.logger = logger
        do {
            try await migrate()
        } catch {
            runner.cancel()
            throw error
        }
    }

    /// Closes every connection.
    public func close() {
        closed.store(true, ordering: .relaxed)
        runner.cancel()
    }

    deinit { runner.cancel() }

    /// Creates the tables when missing (one process at a time: they may start together).
    private func migrate() async throws {
        try await transaction { conn in
            try await conn.query("SELECT pg_advisory_xact_lock(7400)", logger: self.logger)
            try await self.checkFormat(conn)
            for statement: PostgresQuery in [
                "CREATE TABLE IF NOT EXISTS relay_spaces(id BYTEA PRIMARY KEY, capability BYTEA NOT NULL, added_at BIGINT NOT NULL)",
                "CREATE TABLE IF NOT EXISTS relay_ops(space BYTEA NOT NULL, hash BYTEA NOT NULL, bytes BYTEA NOT NULL, PRIMARY KEY(space, hash))",
                """
                CREATE TABLE IF NOT EXISTS relay_entries(space BYTEA NOT NULL, origin BYTEA NOT NULL, seq BIGINT NOT NULL, \
                hash BYTEA NOT NULL, bytes BYTEA NOT NULL, PRIMARY KEY(space, origin, seq))
                """,
                """
                CREATE TABLE IF NOT EXISTS relay_heads(space BYTEA NOT NULL, origin BYTEA NOT NULL, seq BIGINT NOT NULL, \
                head BYTEA NOT NULL, PRIMARY KEY(space, origin, seq))
                """,
                "CREATE TABLE IF NOT EXISTS relay_usage(space BYTEA PRIMARY KEY, entries BIGINT NOT NULL, bytes BIGINT NOT NULL)",
                "ALTER TABLE relay_usage ADD COLUMN IF NOT EXISTS last_write_ms BIGINT NOT NULL DEFAULT 0",
                """
                CREATE TABLE IF NOT EXISTS relay_snapshots(space BYTEA PRIMARY KEY, created_ms BIGINT NOT NULL, \
                manifest BYTEA NOT NULL)
                """,
                """
                CREATE TABLE IF NOT EXISTS relay_snapshot_parts(space BYTEA NOT NULL, idx BIGINT NOT NULL, \
                bytes BYTEA NOT NULL, PRIMARY KEY(space, idx))
                """,
                """
                CREATE TABLE IF NOT EXISTS relay_snapshot_uploads(upload BYTEA NOT NULL, idx BIGINT NOT NULL, \
                space BYTEA NOT NULL, started_ms BIGINT NOT NULL, bytes BYTEA NOT NULL, PRIMARY KEY(upload, idx))
                """,
                """
                CREATE TABLE IF NOT EXISTS relay_bases(space BYTEA NOT NULL, origin BYTEA NOT NULL, seq BIGINT NOT NULL, \
                hash BYTEA NOT NULL, PRIMARY KEY(space, origin))
                """,
                """
                CREATE TABLE IF NOT EXISTS relay_acks(space BYTEA NOT NULL, node BYTEA NOT NULL, issued_ms BIGINT NOT NULL, \
                bytes BYTEA NOT NULL, PRIMARY KEY(space, node))
                """,
                """
                CREATE TABLE IF NOT EXISTS relay_formats(space BYTEA NOT NULL, node BYTEA NOT NULL, issued_ms BIGINT NOT NULL, \
                bytes BYTEA NOT NULL, PRIMARY KEY(space, node))
                """,
                PostgresQuery(unsafeSQL: Self.joinsTable),
            ] + Self.chunksStatements.map({ PostgresQuery(unsafeSQL: $0) }) {
                try await conn.query(statement, logger: self.logger)
            }
            try await self.recordFormat(conn)
        }
    }

    /// Runs `work` and returns what it returns, or throws once `operationTimeout` passes first (see `withDeadline`).
    func bounded<T: Sendable>(_ work: @escaping @Sendable () async throws -> T) async throws -> T {
        try await withDeadline(operationTimeout, "a PostgreSQL operation", executor: executor, work)
    }

    /// Runs `body` in a transaction; what `body` throws is rethrown as it is (the rollback having succeeded).
    func transaction<T: Sendable>(
        _ body: nonisolated(nonsending) (PostgresConnection) async throws -> sending T
    ) async throws -> T {
        do {
            return try await client.withTransaction(logger: logger, body)
        } catch let error as PostgresTransactionError {
            if let inner = error.closureError, error.rollbackError == nil { throw inner }
            throw error
        }
    }

    /// Announces a change to the other relay processes (delivered when the transaction commits).
    func notify(_ conn: PostgresConnection, _ kind: String, space: SpaceID) async throws {
        let payload = "\(instance) \(kind) \(space.hex)"
        try await conn.query("SELECT pg_notify(\(Self.channel), \(payload))", logger: logger)
    }

    // MARK: Spaces

    public func add(_ capability: RelayCapability) async throws -> Bool {
        try await bounded { [self] in
            let id = Data(capability.space.bytes), cap = Data(capability.capability)
            let now = Int64(Date().timeIntervalSince1970 * 1000)
            return try await transaction { conn in
                let inserted = try await conn.query(
                    "INSERT INTO relay_spaces(id, capability, added_at) VALUES (\(id), \(cap), \(now)) ON CONFLICT DO NOTHING RETURNING id",
                    logger: self.logger
                ).all().count
                if inserted == 0 {
                    let held = try await conn.query("SELECT capability FROM relay_spaces WHERE id = \(id)", logger: self.logger)
                        .decode(Data.self).all()
                    guard held.first == cap else {
                        throw RelayError("space \(capability.space.hex) is served here with another capability")
                    }
                    return false
                }
                try await conn.query(
                    "INSERT INTO relay_usage(space, entries, bytes) VALUES (\(id), 0, 0) ON CONFLICT DO NOTHING", logger: self.logger)
                try await self.notify(conn, "s", space: capability.space)
                return true
            }
        }
    }

    public func spaces() async throws -> [SpaceKey] {
        try await bounded { [self] in
            try await client.query("SELECT id, capability FROM relay_spaces ORDER BY id", logger: logger)
                .decode((Data, Data).self).all()
                .map { try SpaceKey(id: try RelayError.storedSpace($0.0), capability: Array($0.1)) }
        }
    }

    public func usage(space: SpaceID) async throws -> (entries: Int, bytes: Int) {
        try await bounded { [self] in
            let rows = try await client.query("SELECT entries, bytes FROM relay_usage WHERE space = \(Data(space.bytes))", logger: logger)
                .decode((Int64, Int64).self).all()
            return rows.first.map { (Int($0.0), Int($0.1)) } ?? (0, 0)
        }
    }

    // MARK: Membership log

    public func ops(space: SpaceID) async throws -> [MembershipOp] {
        try await bounded { [self] in
            try await client.query("SELECT bytes FROM relay_ops WHERE space = \(Data(space.bytes))", logger: logger)
                .decode(Data.self).all()
                .map { try MembershipOp(bytes: Array($0)) }
        }
    }

    public func addOps(_ ops: [MembershipOp], space: SpaceID) async throws -> [MembershipOp] {
        try await bounded { [self] in
            let s = Data(space.bytes)
            let mine = ops.filter { $0.space == space }
            guard !mine.isEmpty else { return [] }
            return try await transaction { conn in
                // The usage row is the space's lock: the count below holds across processes.
                try await conn.query("SELECT 1 FROM relay_usage WHERE space = \(s) FOR UPDATE", logger: self.logger)
                var count = Int(
                    try await conn.query("SELECT count(*) FROM relay_ops WHERE space = \(s)", logger: self.logger)
                        .decode(Int64.self).all().first ?? 0)
                var fresh: [MembershipOp] = []
                for op in mine where count < self.limits.maxOps {
                    let added = try await conn.query(
                        """
                        INSERT INTO relay_ops(space, hash, bytes) VALUES (\(s), \(Data(op.hash.bytes)), \(Data(op.bytes))) \
                        ON CONFLICT DO NOTHING RETURNING hash
                        """, logger: self.logger
                    ).all().count
                    if added > 0 {
                        fresh.append(op)
                        count += 1
                    }
                }
                if !fresh.isEmpty {
                    // Operations count in the space's bytes (never refused for it: a removal must always get through).
                    let bytes = Int64(fresh.reduce(0) { $0 + $1.bytes.count })
                    try await conn.query(
                        "UPDATE relay_usage SET bytes = bytes + \(bytes), last_write_ms = \(Self.nowMs()) WHERE space = \(s)",
                        logger: self.logger)
                    try await self.notify(conn, "o", space: space)
                }
                return fresh
            }
        }
    }

    // MARK: Entries

    public func vector(space: SpaceID) async throws -> [NodeID: UInt64] {
        try await bounded { [self] in
            try await client.withConnection { conn in
                var out: [NodeID: UInt64] = [:]
                for (origin, seq) in try await conn.query(
                    "SELECT origin, max(seq) FROM relay_heads WHERE space = \(Data(space.bytes)) GROUP BY origin", logger: self.logger
                ).decode((Data, Int64).self).all() {
                    out[NodeID(bytes: Array(origin))] = UInt64(seq)
                }
                // What a snapshot covers counts as held: a device needing it gets the snapshot.
                for (origin, base) in try await self.bases(conn, Data(space.bytes)) { out[origin] = max(out[origin] ?? 0, base.seq) }
                return out
            }
        }
    }

    public func batch(space: SpaceID, origin: NodeID, after: UInt64, maxEntries: Int, maxBytes: Int) async throws -> EntryBatch? {
        try await bounded { [self] in
            guard RelayRules.readable(after: after, maxEntries: maxEntries) else { return nil }
            let (s, o, a) = (Data(space.bytes), Data(origin.bytes), Int64(after))
            let reach = a + Int64(maxEntries)
            return try await client.withConnection { conn in
                // Not held: what a snapshot covers comes with the snapshot.
                if let base = try await self.bases(conn, s)[origin], after < base.seq { return nil }
                let heads = try await conn.query(
                    "SELECT seq FROM relay_heads WHERE space = \(s) AND origin = \(o) AND seq > \(a) AND seq <= \(reach) ORDER BY seq",
                    logger: self.logger
                ).decode(Int64.self).all()
                var nearest = heads.first
                if nearest == nil {
                    nearest = try await conn.query(
                        "SELECT min(seq) FROM relay_heads WHERE space = \(s) AND origin = \(o) AND seq > \(a)", logger: self.logger
                    ).decode(Int64?.self).all().first ?? nil
                }
                guard let nearest else { return nil }
                let sizes = try await conn.query(
                    """
                    SELECT seq, octet_length(bytes) FROM relay_entries \
                    WHERE space = \(s) AND origin = \(o) AND seq > \(a) AND seq <= \(reach) ORDER BY seq
                    """, logger: self.logger
                ).decode((Int64, Int32).self).all().map { (seq: $0.0, length: Int($0.1)) }
                let end = RelayRules.batchEnd(heads: heads, nearest: nearest, sizes: sizes, maxBytes: maxBytes)
                guard let head = try await conn.query(
                    "SELECT head FROM relay_heads WHERE space = \(s) AND origin = \(o) AND seq = \(end)", logger: self.logger
                ).decode(Data.self).all().first
                else { return nil }
                let rows = try await conn.query(
                    "SELECT bytes, hash FROM relay_entries WHERE space = \(s) AND origin = \(o) AND seq > \(a) AND seq <= \(end) ORDER BY seq",
                    logger: self.logger
                ).decode((Data, Data).self).all()
                guard rows.count == Int(end - a) else {
                    throw RelayError("entries of \(origin) after \(after) are missing from the relay's store")
                }
                return EntryBatch(
                    origin: origin, entries: try rows.map { try SealedEntry(stored: Array($0.0), hash: Array($0.1)) },
                    head: try SignedHead(bytes: Array(head)[...]))
            }
        }
    }

    public func store(_ batch: EntryBatch, space: SpaceID, membership: MembershipState?) async throws -> Int {
        try await bounded { [self] in
            try RelayRules.checkAuthor(batch, membership: membership)
            let (s, o) = (Data(space.bytes), Data(batch.origin.bytes))
            return try await transaction { conn in
                // One writer per space at a time, across processes: the usage row is the lock.
                guard let usage = try await conn.query(
                    "SELECT entries, bytes FROM relay_usage WHERE space = \(s) FOR UPDATE", logger: self.logger
                ).decode((Int64, Int64).self).all().first
                else { throw SyncRejection.notMember }
                let base = try await self.bases(conn, s)[batch.origin]
                let held = max(
                    base?.seq ?? 0,
                    UInt64(
                        try await conn.query(
                            "SELECT coalesce(max(seq), 0) FROM relay_entries WHERE space = \(s) AND origin = \(o)", logger: self.logger
                        ).decode(Int64.self).all().first ?? 0))
                var hashes: [UInt64: [UInt8]] = [:]
                if let base { hashes[base.seq] = base.hash }
                if let range = try RelayRules.seqsToCheck(batch, held: held, base: base) {
                    let (low, high) = (Int64(range.lowerBound), Int64(range.upperBound))
                    for (seq, hash) in try await conn.query(
                        "SELECT seq, hash FROM relay_entries WHERE space = \(s) AND origin = \(o) AND seq BETWEEN \(low) AND \(high)",
                        logger: self.logger
                    ).decode((Int64, Data).self).all() {
                        hashes[UInt64(seq)] = Array(hash)
                    }
                }
                let fresh = try RelayRules.fresh(batch, space: space, held: held, hashes: hashes)
                guard !fresh.isEmpty else { return 0 }
                let entries = Int(usage.0) + fresh.count
                let bytes = Int(usage.1) + fresh.reduce(0) { $0 + $1.bytes.count }
                try RelayRules.checkQuota(entries: entries, bytes: bytes, limits: self.limits)
                let seqs = fresh.map { Int64($0.header.seq) }
                let entryHashes = fresh.map { ByteBuffer(bytes: $0.hash) }
                let entryBytes = fresh.map { ByteBuffer(bytes: $0.bytes) }
                try await conn.query(
                    """
                    INSERT INTO relay_entries(space, origin, seq, hash, bytes) \
                    SELECT \(s), \(o), t.seq, t.hash, t.bytes FROM unnest(\(seqs)::bigint[], \(entryHashes)::bytea[], \(entryBytes)::bytea[]) \
                    AS t(seq, hash, bytes)
                    """, logger: self.logger)
                let (e64, b64) = (Int64(entries), Int64(bytes))
                try await conn.query(
                    "UPDATE relay_usage SET entries = \(e64), bytes = \(b64), last_write_ms = \(Self.nowMs()) WHERE space = \(s)",
                    logger: self.logger)
                let (headSeq, head) = (Int64(batch.head.seq), Data(batch.head.bytes))
                try await conn.query(
                    "INSERT INTO relay_heads(space, origin, seq, head) VALUES (\(s), \(o), \(headSeq), \(head)) ON CONFLICT DO NOTHING",
                    logger: self.logger)
                try await self.notify(conn, "e", space: space)
                return fresh.count
            }
        }
    }

    public func expire(idleBefore cutoffMs: Int64) async throws -> [SpaceID] {
        try await bounded { [self] in
            try await transaction { conn in
                let idle = try await conn.query(
                    "SELECT space FROM relay_usage WHERE last_write_ms > 0 AND last_write_ms < \(cutoffMs) FOR UPDATE",
                    logger: self.logger
                ).decode(Data.self).all()
                for space in idle {
                    try await conn.query("DELETE FROM relay_entries WHERE space = \(space)", logger: self.logger)
                    try await conn.query("DELETE FROM relay_heads WHERE space = \(space)", logger: self.logger)
                    try await conn.query("DELETE FROM relay_ops WHERE space = \(space)", logger: self.logger)
                    try await conn.query("DELETE FROM relay_acks WHERE space = \(space)", logger: self.logger)
                    try await conn.query("DELETE FROM relay_formats WHERE space = \(space)", logger: self.logger)
                    try await conn.query("DELETE FROM relay_snapshots WHERE space = \(space)", logger: self.logger)
                    try await conn.query("DELETE FROM relay_snapshot_parts WHERE space = \(space)", logger: self.logger)
                    try await conn.query("DELETE FROM relay_bases WHERE space = \(space)", logger: self.logger)
                    try await conn.query("DELETE FROM relay_snapshot_uploads WHERE space = \(space)", logger: self.logger)
                    try await conn.query("DELETE FROM relay_chunks WHERE space = \(space)", logger: self.logger)
                    try await conn.query("DELETE FROM relay_chunk_leases WHERE space = \(space)", logger: self.logger)
                    try await conn.query(
                        "UPDATE relay_usage SET entries = 0, bytes = 0, chunk_bytes = 0, last_write_ms = 0 WHERE space = \(space)",
                        logger: self.logger)
                    if let id = SpaceID(bytes: space) { try await self.notify(conn, "x", space: id) }
                }
                return idle.compactMap { SpaceID(bytes: $0) }
            }
        }
    }

    /// Unix milliseconds now.
    static func nowMs() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }
}

extension AsyncSequence {
    /// Every element, in order.
    func all() async throws -> [Element] {
        var out: [Element] = []
        for try await element in self { out.append(element) }
        return out
    }
}
