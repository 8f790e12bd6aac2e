import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDB
import Synchronization

/// One database: a SQLite file in WAL mode, talked to through its `DatabaseConnections` (one writer, one read pool).
public final class BlazeDatabase: Sendable {
    /// The database name.
    public let name: String
    /// The SQLite file path.
    public let path: String
    /// Limits applied to writes and queries.
    public let limits: StoreLimits
    /// This replica's node id (the author of its local changes).
    public let node: NodeID
    /// The writer, the read connections and the checkpointer: every access to the SQLite file goes through it.
    let connections: DatabaseConnections
    let clock: Mutex<HybridClock>
    let knownCollections = KnownCollections()
    /// The live change feed: committed changes, in commit order, for subscribers.
    public let feed: ChangeFeed
    /// How stored states write stamp origins: the database's home node (kept in `meta`) as `0`.
    let coding: StampCoding
    /// The highest causal length of a tombstone compaction dropped here (0: none): a document this replica creates
    /// where no state exists starts above it, so it never starts below a tombstone another replica still holds.
    let droppedCausalLength: Mutex<Int64>
    /// Group commit's state: the writes waiting for the next group, the scheduling, the savepoint fallback and the
    /// statistics (`BlazeDatabase+GroupCommit` runs the commits).
    let groupCommitter = GroupCommitter()
    /// The durable feed's retention: prunes its rows and moves the floor.
    let feedPruner: FeedPruner
    /// The committed version vector, so that a local write need not read `versions`.
    let committedVersions = CommittedVersions()
    /// The vector indexes searched so far, held in memory and caught up from `vector_rows` before each search.
    let vectorIndexes: VectorIndexes
    /// Where group commits and local commits are reported (nil: nowhere).
    let metrics: StoreMetrics?
    /// Held while this replica's own changes are sealed (`SyncLogStore.sealPending`): sealers take turns.
    let sealing = Mutex<Void>(())
    /// Decoded states of documents the writer wrote lately, checked against their rows' texts before use.
    let stateCache: StateCache
    /// Held by a sweep of the chunk store through both its steps (`withReferencedBlobs`): one at a time.
    let sweeping = NSLock()

    init(name: String, path: String, limits: StoreLimits, node: NodeID, metrics: StoreMetrics? = nil) throws {
        self.metrics = metrics
        self.stateCache = StateCache(budget: limits.stateCacheBytes)
        self.vectorIndexes = VectorIndexes(databasePath: path)
        self.name = name
        self.path = path
        self.limits = limits
        self.node = node
        Self.removeLeftoverStaging(path: path)
        connections = try DatabaseConnections(
            path: path, label: "blazedb.\(name)", limits: limits, migrator: Schema.migrator, analysisLimit: Self.analysisLimit)
        let connections = self.connections
        // The home origin is the node that first opened the database, kept with it: a copy of the file elsewhere
        // reads its states the same.
        let stored = try connections.read { db in try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'stamp_home'") }
        let home = try stored ?? connections.write { db -> String? in
            try db.execute(sql: "INSERT OR IGNORE INTO meta(key, value) VALUES ('stamp_home', ?)", arguments: [node.hex])
            return try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'stamp_home'")
        }
        guard let home = home.flatMap(NodeID.init(hex:)) else {
            throw StoreError(.internalFailure, kind: "corrupt_database", "database \(Names.quoted(name)) has no valid stamp_home")
        }
        coding = StampCoding(home: home)
        droppedCausalLength = Mutex(
            try connections.read { db in
                try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'tombstone_cl_floor'").flatMap { Int64($0) } ?? 0
            })
        let last = try connections.read { db in
            // Compaction keeps the clock it had in `hlc_floor`: the changes that set it may be gone.
            let floor = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'hlc_floor'").flatMap { UInt64($0) } ?? 0
            let logged = UInt64(bitPattern: try Int64.fetchOne(db, sql: "SELECT max(hlc) FROM changes WHERE hlc >= 0") ?? 0)
            return max(floor, logged)
        }
        clock = Mutex(HybridClock(last: HLC(raw: last)))
        let (feedLast, feedFloor, lastTotal, floorTotal) = try connections.read { db in
            let floor = try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'feed_floor'").flatMap { Int64($0) } ?? 0
            let floorTotal =
                try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'feed_floor_total'").flatMap { Int64($0) } ?? 0
            let lastTotal = try Int64.fetchOne(db, sql: "SELECT total FROM feed ORDER BY seq DESC LIMIT 1") ?? 0
            return (max(floor, try Int64.fetchOne(db, sql: "SELECT max(seq) FROM feed") ?? 0), floor, max(floorTotal, lastTotal), floorTotal)
        }
        feed = ChangeFeed(last: feedLast, floor: feedFloor, lastTotal: lastTotal, floorTotal: floorTotal)
        feedPruner = FeedPruner(feed: feed, retention: limits.feedRetention)
        try connections.write { db in
            if try Int.fetchOne(db, sql: "SELECT count(*) FROM indexes") ?? 0 > 0 { try Self.analyze(db) }
        }
        try adoptUnreplicatedData()
    }

    /// Wall-clock milliseconds.
    static func nowMilliseconds() -> UInt64 { UInt64(max(0, Date().timeIntervalSince1970 * 1000)) }

    /// Data written before replication existed (schema v1) becomes one local change, so it replicates too.
    func adoptUnreplicatedData() throws {
        try write { tx in
            let db = tx.db
            // Only data from before replication has no state; it exists only while no change was ever recorded.
            guard try Int.fetchOne(db, sql: "SELECT count(*) FROM versions") == 0 else { return }
            let docs = try Row.fetchAll(
                db, sql: "SELECT collection, id, body FROM docs WHERE state IS NULL ORDER BY collection, id")
            let indexes = try Row.fetchAll(db, sql: "SELECT name, collection, fields FROM indexes ORDER BY name")
            try tx.adopt(docs: docs, indexes: indexes)
        }
    }

    /// Rows sampled per index by `ANALYZE`; bounds its cost to milliseconds whatever the table size.
    static let analysisLimit = 1000

    /// Changes since the last `ANALYZE`, and the threshold at which statistics count as stale.
    private let statistics = Mutex(PlannerStatistics())

    /// Refreshes the planner statistics. Without them SQLite takes `collection = ?` for a selective term and
    /// prefers the (collection, id) key over a matching user index, scanning the whole collection.
    static func analyze(_ db: Database) throws {
        try db.execute(sql: "ANALYZE docs")
    }

    /// Counts `changes` and re-analyzes inside the current write once the data may have doubled since last time.
    func noteChanges(_ changes: Int, _ db: Database) throws {
        let due = statistics.withLock { s -> Bool in
            s.changes += changes
            return s.changes >= s.threshold
        }
        guard due else { return }
        try Self.analyze(db)
        let rows = try Int.fetchOne(db, sql: "SELECT count(*) FROM docs") ?? 0
        statistics.withLock { $0 = PlannerStatistics(changes: 0, threshold: max(1000, rows)) }
    }

    /// Whether any write waits for the writer now (a local write, another session's store, a compaction): a sync
    /// session then stores fewer batches per transaction, so that the wait stays short.
    public var writesWaiting: Bool { connections.writesWaiting.load(ordering: .relaxed) > 0 }

    /// Runs `body` in one write transaction; everything it applies commits together, as one replicated change.
    ///
    /// Blocks the calling thread until the commit (the daemon calls it from its I/O thread pool, never from an event
    /// loop).
    public func write<T>(_ body: (WriteTransaction) throws -> T) throws -> T {
        try connections.writeWithoutTransaction { db in try localTransaction(db, body) }
    }

    /// Records what `body` writes as one local change in `storage`'s transaction, with its feed entry.
    func localChange<T>(_ storage: SQLStorage, _ body: (WriteTransaction) throws -> T) throws -> T {
        let db = storage.db
        storage.enforceLimits = true
        let vv = try storage.versionVector()
        let hlc = clock.withLock { $0.tick(now: Self.nowMilliseconds()) }
        let draft = Change(origin: node, seq: vv[node] + 1, hlc: hlc, deps: vv, ops: [])
        let tx = WriteTransaction(storage: storage, limits: limits, draft: draft)
        let result = try body(tx)
        if let (change, text) = tx.finish() { try storage.recordApplied(change, text: text, last: true) }
        try storage.flush()
        try noteChanges(tx.changes, db)
        try finishFeed(storage, db)
        return result
    }

    /// Storage for one transaction, its feed continuing from `feedSequence` and `feedTotal` (default: the published
    /// feed's last).
    /// `startVersions`: the versions the transaction starts from, when known (else read from the table).
    func makeStorage(
        _ db: Database, feedSequence: Int64? = nil, feedTotal: Int64? = nil, startVersions: VersionVector? = nil
    ) -> SQLStorage {
        SQLStorage(
            db: db, limits: limits, knownCollections: knownCollections, feedSequence: feedSequence ?? feed.lastSequence,
            feedTotal: feedTotal ?? feed.totals.last, coding: coding, droppedCausalLength: droppedCausalLength.withLock { $0 },
            committedVersions: committedVersions, startVersions: startVersions, stateCache: stateCache)
    }

    /// Prunes the durable feed to its retention (`FeedPruner`) and publishes this transaction's entries once it
    /// commits.
    func finishFeed(_ storage: SQLStorage, _ db: Database) throws {
        let entries = storage.entries
        guard !entries.isEmpty else { return }
        let (floor, floorTotal) = try feedPruner.pruneIfDue(storage, db)
        let (feed, total) = (self.feed, storage.feedTotal)
        storage.onCommit { feed.publish(entries, floor: floor, total: total, floorTotal: floorTotal) }
    }

    /// Applies one operation as its own change, durable when this returns. Alone, it commits on the calling thread;
    /// while a commit is queued or running it joins the next group commit (`submit`). Blocks the calling thread.
    public func apply(_ op: WriteOp) throws -> WriteResult {
        if let result = commitAlone(op) { return try result.get() }
        let done = DispatchSemaphore(value: 0)
        let outcome = Mutex<Result<WriteResult, any Error>?>(nil)
        submit(op) { result in
            outcome.withLock { $0 = result }
            done.signal()
        }
        done.wait()
        return try outcome.withLock { $0! }.get()
    }

    /// Applies several operations atomically; on failure the error's details carry the failing op's index.
    public func commit(_ ops: [WriteOp]) throws -> [WriteResult] {
        guard ops.count <= limits.maxTransactionOps else {
            throw StoreError(
                .limitExceeded, kind: "transaction_too_large",
                "transaction has \(ops.count) operations; the limit is \(limits.maxTransactionOps)")
        }
        return try write { tx in
            tx.storage.reserve(documents: ops.count)
            var results: [WriteResult] = []
            results.reserveCapacity(ops.count)
            for (i, op) in ops.enumerated() {
                do {
                    results.append(try tx.apply(op))
                } catch var error as StoreError {
                    error.details["op"] = .int(Int64(i))
                    error.message = "op \(i): " + error.message
                    throw error
                }
            }
            return results
        }
    }

    /// Runs `body` on a read-only snapshot (WAL readers never wait for the writer).
    public func read<T>(_ body: (Database) throws -> T) throws -> T {
        try connections.read(body)
    }

    /// Closes the database's connections; further use fails.
    public func close() throws {
        vectorIndexes.close()  // graph builds stop first: their work is lost either way
        saveVectorIndexes()
        feed.end(StoreError(.unavailable, kind: "shutting_down", "the daemon is shutting down"))
        try connections.close()
    }
}

/// How stale the planner statistics are: changes since the last `ANALYZE`, and the count at which they are due again.
struct PlannerStatistics {
    /// Changes since the last `ANALYZE`.
    var changes = 0
    /// Changes after which `ANALYZE` runs again (the rows counted then, at least 1000: the data may have doubled).
    var threshold = 1000
}

/// Collection names known to exist in the committed database, so writes skip re-registering them.
///
/// Collections are never removed individually (only whole databases are dropped), so the set only grows.
final class KnownCollections: Sendable {
    private let names = Mutex<Set<String>>([])

    func contains(_ name: String) -> Bool { names.withLock { $0.contains(name) } }
    func insert(_ name: String) { _ = names.withLock { $0.insert(name) } }
}
