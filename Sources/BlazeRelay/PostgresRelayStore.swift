import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeSync
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
/// processes see each other's entries live (Protocol/RELAY.md, "Several relay processes").
public final class PostgresRelayStore: RelayBackend {
    let client: PostgresClient
    private let runner: Task<Void, Never>
    /// Per-space limits.
    public let limits: RelayLimits
    let logger: Logger
    /// Where operations and their deadlines run (see `withDeadline`).
    private let executor = EventLoopTaskExecutor(group: MultiThreadedEventLoopGroup.singleton)
    /// This process's id in notifications, so that it skips its own.
    private let instance = UUID().uuidString.prefix(8).lowercased()
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
        self.runner = Task { await client.run() }
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
        runner.cancel()
    }

    deinit { runner.cancel() }

    /// A client configuration from a `postgres://user[:password]@host[:port]/database` URL; `?host=/directory` (as
    /// libpq has it) reaches the server on its Unix socket in that directory, `?sslmode=require` asks for TLS.
    public static func configuration(url text: String) throws -> PostgresClient.Configuration {
        guard let url = URLComponents(string: text), ["postgres", "postgresql"].contains(url.scheme ?? "") else {
            throw RelayError("--postgres must be a postgres:// URL, got \(text)")
        }
        let query = Dictionary((url.queryItems ?? []).map { ($0.name, $0.value ?? "") }, uniquingKeysWith: { $1 })
        let user = url.percentEncodedUser.flatMap { $0.removingPercentEncoding } ?? "postgres"
        let password = url.percentEncodedPassword.flatMap { $0.removingPercentEncoding }
        let path = url.path.hasPrefix("/") ? String(url.path.dropFirst()) : url.path
        let database = path.isEmpty ? user : path
        let port = url.port ?? Int(query["port"] ?? "") ?? 5432
        guard (1...65535).contains(port) else { throw RelayError("--postgres: port \(port) is out of range") }
        if let socketDirectory = query["host"], socketDirectory.hasPrefix("/") {
            return .init(
                unixSocketPath: "\(socketDirectory)/.s.PGSQL.\(port)", username: user, password: password, database: database)
        }
        guard let host = url.host, !host.isEmpty else { throw RelayError("--postgres: the URL names no host") }
        let tls: PostgresClient.Configuration.TLS
        switch query["sslmode"] ?? "disable" {
        case "disable": tls = .disable
        case "require", "verify-full": tls = .require(.makeClientConfiguration())
        case let mode: throw RelayError("--postgres: sslmode \(mode) is not supported (disable, require, verify-full)")
        }
        return .init(host: host, port: port, username: user, password: password, database: database, tls: tls)
    }

    /// Creates the tables when missing (one process at a time: they may start together).
    private func migrate() async throws {
        try await transaction { conn in
            try await conn.query("SELECT pg_advisory_xact_lock(7400)", logger: self.logger)
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
                CREATE TABLE IF NOT EXISTS relay_bases(space BYTEA NOT NULL, origin BYTEA NOT NULL, seq BIGINT NOT NULL, \
                hash BYTEA NOT NULL, PRIMARY KEY(space, origin))
                """,
                """
                CREATE TABLE IF NOT EXISTS relay_acks(space BYTEA NOT NULL, node BYTEA NOT NULL, issued_ms BIGINT NOT NULL, \
                bytes BYTEA NOT NULL, PRIMARY KEY(space, node))
                """,
                PostgresQuery(unsafeSQL: Self.joinsTable),
            ] {
                try await conn.query(statement, logger: self.logger)
            }
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
    func notify(_ conn: PostgresConnection, _ kind: String, space: [UInt8]) async throws {
        let payload = "\(instance) \(kind) \(hexString(space))"
        try await conn.query("SELECT pg_notify(\(Self.channel), \(payload))", logger: logger)
    }

    // MARK: Spaces

    public func add(_ capability: RelayCapability) async throws -> Bool {
        try await bounded { [self] in
            let id = Data(capability.space), cap = Data(capability.capability)
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
                        throw RelayError("space \(hexString(capability.space)) is served here with another capability")
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
                .map { try SpaceKey(id: Array($0.0), capability: Array($0.1)) }
        }
    }

    public func usage(space: [UInt8]) async throws -> (entries: Int, bytes: Int) {
        try await bounded { [self] in
            let rows = try await client.query("SELECT entries, bytes FROM relay_usage WHERE space = \(Data(space))", logger: logger)
                .decode((Int64, Int64).self).all()
            return rows.first.map { (Int($0.0), Int($0.1)) } ?? (0, 0)
        }
    }

    // MARK: Membership log

    public func ops(space: [UInt8]) async throws -> [MembershipOp] {
        try await bounded { [self] in
            try await client.query("SELECT bytes FROM relay_ops WHERE space = \(Data(space))", logger: logger)
                .decode(Data.self).all()
                .map { try MembershipOp(bytes: Array($0)) }
        }
    }

    public func addOps(_ ops: [MembershipOp], space: [UInt8]) async throws -> [MembershipOp] {
        try await bounded { [self] in
            let s = Data(space)
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
                        INSERT INTO relay_ops(space, hash, bytes) VALUES (\(s), \(Data(op.hash)), \(Data(op.bytes))) \
                        ON CONFLICT DO NOTHING RETURNING hash
                        """, logger: self.logger
                    ).all().count
                    if added > 0 {
                        fresh.append(op)
                        count += 1
                    }
                }
                if !fresh.isEmpty {
                    try await conn.query(
                        "UPDATE relay_usage SET last_write_ms = \(Self.nowMs()) WHERE space = \(s)", logger: self.logger)
                    try await self.notify(conn, "o", space: space)
                }
                return fresh
            }
        }
    }

    // MARK: Acknowledgements

    public func keepAcks(_ acks: [Acknowledgement], space: [UInt8]) async throws -> [Acknowledgement] {
        let mine = acks.filter { $0.space == space }
        guard !mine.isEmpty else { return [] }
        return try await bounded { [self] in
            let s = Data(space)
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

    public func acks(space: [UInt8]) async throws -> [Acknowledgement] {
        try await bounded { [self] in
            try await client.query("SELECT bytes FROM relay_acks WHERE space = \(Data(space)) ORDER BY node", logger: logger)
                .decode(Data.self).all()
                .compactMap { try? Acknowledgement(bytes: Array($0)) }
        }
    }

    // MARK: Snapshots

    private func bases(_ conn: PostgresConnection, _ s: Data) async throws -> [NodeID: PrunedHead] {
        var out: [NodeID: PrunedHead] = [:]
        for (origin, seq, hash) in try await conn.query(
            "SELECT origin, seq, hash FROM relay_bases WHERE space = \(s)", logger: logger
        ).decode((Data, Int64, Data).self).all() {
            out[NodeID(bytes: Array(origin))] = PrunedHead(seq: UInt64(seq), hash: Array(hash))
        }
        return out
    }

    public func bases(space: [UInt8]) async throws -> [NodeID: PrunedHead] {
        try await bounded { [self] in
            try await client.withConnection { conn in try await self.bases(conn, Data(space)) }
        }
    }

    public func keepSnapshot(_ manifest: SnapshotManifest, parts: [SnapshotPart], space: [UInt8]) async throws -> Bool {
        try await bounded { [self] in
            let s = Data(space)
            return try await transaction { conn in
                // The usage row is the space's lock.
                guard try await conn.query("SELECT 1 FROM relay_usage WHERE space = \(s) FOR UPDATE", logger: self.logger)
                    .decode(Int32.self).all().first != nil
                else { return false }
                let held = try await conn.query("SELECT manifest FROM relay_snapshots WHERE space = \(s)", logger: self.logger)
                    .decode(Data.self).all().first.flatMap { try? SnapshotManifest(bytes: Array($0)) }
                let bases = try await self.bases(conn, s)
                guard RelayRules.supersedes(manifest, held: held, bases: bases) else { return false }
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
                for part in parts {
                    let (idx, bytes) = (Int64(part.index), Data(part.bytes))
                    try await conn.query(
                        "INSERT INTO relay_snapshot_parts(space, idx, bytes) VALUES (\(s), \(idx), \(bytes))", logger: self.logger)
                }
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
                return true
            }
        }
    }

    public func snapshotManifest(space: [UInt8]) async throws -> SnapshotManifest? {
        try await bounded { [self] in
            try await client.query("SELECT manifest FROM relay_snapshots WHERE space = \(Data(space))", logger: logger)
                .decode(Data.self).all().first.map { try SnapshotManifest(bytes: Array($0)) }
        }
    }

    public func snapshotPart(space: [UInt8], index: UInt32) async throws -> SnapshotPart? {
        try await bounded { [self] in
            let idx = Int64(index)
            return try await client.query(
                "SELECT bytes FROM relay_snapshot_parts WHERE space = \(Data(space)) AND idx = \(idx)", logger: logger
            ).decode(Data.self).all().first.map { try SnapshotPart(bytes: Array($0)) }
        }
    }

    // MARK: Entries

    public func vector(space: [UInt8]) async throws -> [NodeID: UInt64] {
        try await bounded { [self] in
            try await client.withConnection { conn in
                var out: [NodeID: UInt64] = [:]
                for (origin, seq) in try await conn.query(
                    "SELECT origin, max(seq) FROM relay_heads WHERE space = \(Data(space)) GROUP BY origin", logger: self.logger
                ).decode((Data, Int64).self).all() {
                    out[NodeID(bytes: Array(origin))] = UInt64(seq)
                }
                // What a snapshot covers counts as held: a device needing it gets the snapshot.
                for (origin, base) in try await self.bases(conn, Data(space)) { out[origin] = max(out[origin] ?? 0, base.seq) }
                return out
            }
        }
    }

    public func batch(space: [UInt8], origin: NodeID, after: UInt64, maxEntries: Int, maxBytes: Int) async throws -> EntryBatch? {
        try await bounded { [self] in
            guard RelayRules.readable(after: after, maxEntries: maxEntries) else { return nil }
            let (s, o, a) = (Data(space), Data(origin.bytes), Int64(after))
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

    public func store(_ batch: EntryBatch, space: [UInt8], membership: MembershipState?) async throws -> Int {
        try await bounded { [self] in
            try RelayRules.checkAuthor(batch, membership: membership)
            let (s, o) = (Data(space), Data(batch.origin.bytes))
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

    public func expire(idleBefore cutoffMs: Int64) async throws -> [[UInt8]] {
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
                    try await conn.query("DELETE FROM relay_snapshots WHERE space = \(space)", logger: self.logger)
                    try await conn.query("DELETE FROM relay_snapshot_parts WHERE space = \(space)", logger: self.logger)
                    try await conn.query("DELETE FROM relay_bases WHERE space = \(space)", logger: self.logger)
                    try await conn.query(
                        "UPDATE relay_usage SET entries = 0, bytes = 0, last_write_ms = 0 WHERE space = \(space)",
                        logger: self.logger)
                    try await self.notify(conn, "x", space: Array(space))
                }
                return idle.map { Array($0) }
            }
        }
    }

    /// Unix milliseconds now.
    static func nowMs() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    // MARK: Notifications

    public func watch(_ onChange: @escaping @Sendable (RelayChange) -> Void) async {
        var listenedBefore = false
        while !Task.isCancelled {
            let listening = ListenState()
            // What others wrote while this process was not listening is caught up on.
            let resync = listenedBefore
            let attempt = Task(executorPreference: executor) { [client, logger] in
                defer { listening.end() }
                do {
                    try await client.withConnection { conn in
                        try await conn.listen(on: Self.channel) { notifications in
                            listening.begin()
                            if resync { onChange(.resync) }
                            for try await n in notifications {
                                if let change = self.change(from: n.payload) { onChange(change) }
                            }
                        }
                    }
                } catch {
                    if !Task.isCancelled {
                        logger.warning("Relay lost its PostgreSQL notifications; reconnecting", metadata: ["error": "\(error)"])
                    }
                }
            }
            // A lease or LISTEN asked for while the server went away may never answer: one that has not begun within
            // `operationTimeout` is abandoned and asked for again.
            let deadline = ContinuousClock.now + operationTimeout
            while listening.waiting, ContinuousClock.now < deadline, !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(50))
            }
            if listening.began { listenedBefore = true }
            if listening.waiting && !Task.isCancelled {
                logger.warning("Relay's PostgreSQL notifications did not start in time; asking again")
                attempt.cancel()
            } else {
                await withTaskCancellationHandler { await attempt.value } onCancel: { attempt.cancel() }
            }
            if Task.isCancelled { attempt.cancel(); return }
            // Not a tight loop while the server is down.
            try? await Task.sleep(for: .milliseconds(500))
        }
    }

    /// The change a notification of another process announces; nil for this process's own or a malformed one.
    private func change(from payload: String) -> RelayChange? {
        let parts = payload.split(separator: " ")
        guard parts.count == 3, parts[0] != instance, let space = hexBytes(String(parts[2])) else { return nil }
        switch parts[1] {
        case "e": return .entries(space: space)
        case "o": return .ops(space: space)
        case "a": return .acks(space: space)
        case "s": return .spaces
        case "x": return .expired(space: space)
        case "j": return .joins(space: space)
        default: return nil
        }
    }
}

extension AsyncSequence {
    /// Every element, in order.
    func all() async throws -> [Element] {
        var out: [Element] = []
        for try await element in self { out.append(element) }
        return out
    }
}

/// Where one attempt of `PostgresRelayStore.watch` to listen is: waiting for its connection, listening, or ended.
private final class ListenState: Sendable {
    private let state = Mutex<(began: Bool, ended: Bool)>((false, false))
    /// The LISTEN is in place.
    func begin() { state.withLock { $0.began = true } }
    /// The attempt ended (its connection failed or the task was cancelled).
    func end() { state.withLock { $0.ended = true } }
    /// Neither listening yet nor ended.
    var waiting: Bool { state.withLock { !$0.began && !$0.ended } }
    /// The LISTEN was in place at some point.
    var began: Bool { state.withLock { $0.began } }
}
