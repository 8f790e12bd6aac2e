import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDB

/// `ReplicaStorage` over the database's tables, used inside one GRDB write transaction.
///
/// Document states are cached for the transaction and written once by `flush()`. A live document's state is stored
/// in its `docs` row next to its materialized body (what queries and indexes read); a deleted document's state is a
/// `tombstones` row. Callers must flush before the transaction commits.
///
/// Every recorded change also gets the next local feed sequence and a `feed` row listing the documents it visibly
/// changed (before and after); `entries` collects them for publication after the commit.
final class SQLStorage: ReplicaStorage {
    let db: Database
    let limits: StoreLimits
    /// How this database's stored states write stamp origins.
    let coding: StampCoding
    let knownCollections: KnownCollections
    /// Local writes enforce the document size limit; remote changes are applied as they are.
    var enforceLimits = false
    typealias Visible = TransactionDocuments.Visible

    /// The documents this transaction read or wrote (their rules: `TransactionDocuments`).
    var docs = TransactionDocuments()
    /// Collections registered in this transaction (once each: every registration adds a commit hook).
    private var ensuredCollections: Set<String> = []
    /// The collection `ensureCollection` last found or registered.
    private var lastEnsured: String?
    /// The highest sequence recorded per origin in this transaction, written to `versions` by `flush()`.
    var recordedVersions: [NodeID: UInt64] = [:]
    /// The database's committed version vector, which `flush()` advances once its transaction commits.
    let committedVersions: CommittedVersions
    /// The versions this transaction started from, when known without reading `versions` (the committed vector, or
    /// in a group commit that and the changes kept before this one); nil: read from the table.
    var startVersions: VersionVector?
    /// The versions `flush()` wrote in this transaction (the table has them; `startVersions` does not).
    var flushedVersions: [NodeID: UInt64] = [:]
    /// Per document deleted in this transaction, the change that deleted it (origin hex, seq), stored with its
    /// tombstone.
    private var deletedBy: [DocKey: (origin: String, seq: Int64)] = [:]
    /// Whether `tombstones` has any row, probed once per transaction; while it has none, no lookup there is needed.
    private var tombstonesExist: Bool?
    /// The statements run once per document (and once per change), prepared on first use in the transaction.
    private var selectRow: RawStatement?
    var updateRow: RawStatement?
    var insertRow: RawStatement?
    var insertChange: RawStatement?
    var insertFeed: RawStatement?
    private var selectTombstone: RawStatement?
    private var upsertVersion: RawStatement?
    /// `flush()`'s statements for a materialized document's row (numbered parameters: GRDB caches statements by
    /// text, and the snapshot install binds the same insert through GRDB, which a raw run's unbinding would confuse).
    private var updateBody: RawStatement?
    private var updateBodyOnly: RawStatement?
    /// The `conflicted` flag of rows as read or last written in this transaction, by document.
    private var storedConflicted: [DocKey: Bool] = [:]
    private var insertBody: RawStatement?
    /// The state texts of documents created by the current change.
    var createdStates: DocumentState.CreatedStateText?
    /// Whether the last remote creation `createIfNew` tried found no document (and wrote it): the next one then
    /// inserts without looking the key up first.
    var lastCreationFoundNone = false
    /// The database's decoded states, and what this transaction wrote for it (kept once it commits).
    let stateCache: StateCache?
    /// Documents this flush wrote through the general path, for `stateCache`, and the least their entries cost.
    private var cacheFill: [(key: DocKey, stateText: String, bodyText: String, state: DocumentState)] = []
    private var cacheFillCost = 0
    /// The texts of received changes as they arrived, by change (`BlazeDatabase.receive(_:in:texts:)`).
    var receivedTexts: [ChangeID: [UInt8]] = [:]
    /// Feed entries of the changes recorded in this transaction, in order.
    var entries: [FeedEntry] = []
    /// The feed sequence of the last change recorded (committed ones, then this transaction's).
    var feedSequence: Int64
    /// Document events recorded in the feed up to `feedSequence` (its retention counts them).
    var feedTotal: Int64

    /// `BlazeDatabase.droppedCausalLength` when the transaction began.
    let droppedCausalLength: Int64
    /// When set, work due after the commit is collected in `afterCommit` rather than registered with the database: a
    /// group commit runs it only for the changes it kept (a savepoint rolled back does not unregister a hook).
    var collectsAfterCommit = false
    /// The work due after the commit, when `collectsAfterCommit`.
    var afterCommit: [@Sendable () -> Void] = []

    init(
        db: Database, limits: StoreLimits, knownCollections: KnownCollections, feedSequence: Int64, feedTotal: Int64 = 0,
        coding: StampCoding, droppedCausalLength: Int64 = 0, committedVersions: CommittedVersions,
        startVersions: VersionVector? = nil, stateCache: StateCache? = nil
    ) {
        self.stateCache = stateCache
        self.committedVersions = committedVersions
        self.startVersions = startVersions
        self.feedTotal = feedTotal
        self.droppedCausalLength = droppedCausalLength
        self.db = db
        self.coding = coding
        self.limits = limits
        self.knownCollections = knownCollections
        self.feedSequence = feedSequence
    }

    /// The statement in `slot`, prepared from `sql` if not yet.
    func prepared(_ slot: inout RawStatement?, _ sql: String) throws -> RawStatement {
        if let statement = slot { return statement }
        let statement = try RawStatement(db, sql)
        slot = statement
        return statement
    }

    /// Sizes the per-document bookkeeping for a transaction that writes about `documents` documents.
    func reserve(documents: Int) { docs.reserve(documents: documents) }

    /// Documents this transaction read or wrote and holds until it ends.
    var documentsHeld: Int { docs.states.count + docs.created.count + docs.patched.count }

    /// The state a local write starts from: the document's, or for a key with no state, a deleted one at the highest
    /// causal length compaction dropped (nil when it never dropped one), so that a new incarnation starts above it.
    func localState(_ key: DocKey) throws -> DocumentState? {
        if let state = try document(key) { return state }
        return droppedCausalLength > 0 ? DocumentState(cl: droppedCausalLength) : nil
    }

    func document(_ key: DocKey) throws -> DocumentState? {
        if let cached = docs.states[key] { return cached }
        // Documents written without their state: their location is known from then on.
        if let c = docs.created.removeValue(forKey: key) {
            docs.locations[key] = .row(c.rowid)
            let state = DocumentState.created(fields: c.fields, stamp: c.stamp)
            docs.states[key] = state
            return state
        }
        if let p = docs.patched.removeValue(forKey: key) {
            docs.locations[key] = .row(p.rowid)
            let state = try Self.decode(state: p.stateText, body: p.text, coding)
            docs.states[key] = state
            return state
        }
        if let row = try fetchRow(key) {
            docs.locations[key] = .row(row.rowid)
            // A row without state holds data from before replication, about to be adopted as a new document.
            guard let stateText = row.state else {
                docs.states[key] = .some(nil)
                return nil
            }
            if let hit = stateCache?.entry(key, state: stateText, body: row.body) {
                docs.states[key] = hit.state
                if docs.visible[key] == nil { docs.visible[key] = Visible(text: row.body) }
                return hit.state
            }
            return load(key, try Self.decode(state: stateText, body: row.body, coding), text: row.body)
        }
        if let stateText = try tombstone(key) {
            docs.locations[key] = .tombstone
            let state = try Self.decode(state: stateText, body: nil, coding)
            docs.states[key] = state
            return state
        }
        docs.locations[key] = .absent
        docs.states[key] = .some(nil)
        return nil
    }

    /// The `docs` row of `key`, if any (its `conflicted` flag is noted for `write`).
    func fetchRow(_ key: DocKey) throws -> (rowid: Int64, state: String?, body: String)? {
        let select = try prepared(&selectRow, "SELECT rowid, state, body, conflicted FROM docs WHERE collection = ? AND id = ?")
        guard let row = try select.firstRow(key.collection, key.id, { row in (row.int64(0), row.text(1), row.text(2) ?? "", row.int64(3) != 0) })
        else { return nil }
        storedConflicted[key] = row.3
        return (row.0, row.1, row.2)
    }

    /// Caches the state of a live document read from its row, whose body is `text`.
    func load(_ key: DocKey, _ decoded: DocumentState, text: String) -> DocumentState {
        docs.states[key] = decoded
        if docs.visible[key] == nil { docs.visible[key] = Visible(text: text) }
        return decoded
    }

    /// Where `key` is stored, for a state saved without being read first.
    private func locate(_ key: DocKey) throws -> TransactionDocuments.Location {
        let stmt = try db.cachedStatement(sql: "SELECT rowid FROM docs WHERE collection = ? AND id = ?")
        if let rowid = try Int64.fetchOne(stmt, arguments: [key.collection, key.id]) { return .row(rowid) }
        return try tombstone(key) == nil ? .absent : .tombstone
    }

    /// The state text of a deleted document, if `key` is one.
    func tombstone(_ key: DocKey) throws -> String? {
        if tombstonesExist == nil {
            tombstonesExist = try RawStatement(db, "SELECT EXISTS (SELECT 1 FROM tombstones)").firstRow { $0.int64(0) != 0 }
        }
        guard tombstonesExist == true else { return nil }
        let select = try prepared(&selectTombstone, "SELECT state FROM tombstones WHERE collection = ?1 AND id = ?2")
        return try select.firstRow(key.collection, key.id) { $0.text(0) } ?? nil
    }

    static func parseBody(_ body: String?) throws -> [String: JSONValue]? {
        try body.map { text throws -> [String: JSONValue] in
            guard case .object(let o) = try JSONParser(maxDepth: 10_000).parse(text) else {
                throw StoreError(.internalFailure, kind: "corrupt_document", "stored document is not an object")
            }
            return o
        }
    }

    /// Decodes a stored state with the stored body it relies on.
    static func decode(state: String, body: String?, _ coding: StampCoding) throws -> DocumentState {
        try DocumentState(compactText: state, body: try parseBody(body), coding)
    }

    func updateDocument(_ key: DocKey, _ edit: (inout DocumentState) -> Void) throws {
        var state = try document(key) ?? DocumentState()
        // Drop the cache's reference first, so that `edit` changes the fields in place instead of copying them.
        docs.states[key] = .some(nil)
        edit(&state)
        try saveDocument(key, state)
    }

    func noteDeleted(_ key: DocKey, by change: Change) throws {
        deletedBy[key] = (change.origin.hex, Int64(change.seq))
    }

    func saveDocument(_ key: DocKey, _ state: DocumentState) throws {
        docs.save(key, state)
    }

    /// Writes every document state changed in this transaction, and its materialized row (as of the last recorded
    /// change: callers record every change before flushing).
    func flush() throws {
        for (key, state, body) in docs.takeDirty() { try write(key, state, body) }
        if let cache = stateCache, !cacheFill.isEmpty {
            let (fill, leastCost) = (cacheFill, cacheFillCost)
            (cacheFill, cacheFillCost) = ([], 0)
            if cache.admits(leastCost: leastCost) {
                let written = fill.map { ($0.key, StateCache.Entry(stateText: $0.stateText, bodyText: $0.bodyText, state: $0.state)) }
                onCommit { cache.insert(written) }
            }
        }
        // One version row per origin per transaction, however many of its changes were recorded.
        guard !recordedVersions.isEmpty else { return }
        for (origin, seq) in recordedVersions {
            try prepared(
                &upsertVersion,
                "INSERT INTO versions(origin, seq) VALUES (?1, ?2) ON CONFLICT(origin) DO UPDATE SET seq = max(seq, excluded.seq)"
            ).run(origin.hex, Int64(seq))
            flushedVersions[origin] = max(flushedVersions[origin] ?? 0, seq)
        }
        let (written, committed) = (recordedVersions, committedVersions)
        onCommit { committed.advance(written) }
        recordedVersions = [:]
    }

    private func write(_ key: DocKey, _ state: DocumentState, _ body: Visible) throws {
        // A collection exists once any document state lives in it (deleted ones too), whatever the batching of the
        // changes that brought it: collection existence must converge like the documents do.
        try ensureCollection(key.collection)
        let stateText = state.compactText(coding)
        let location = try docs.locations[key] ?? locate(key)
        guard let text = body.text else {
            switch location {
            case .row(let rowid):
                try db.cachedStatement(sql: "DELETE FROM docs WHERE rowid = ?").execute(arguments: [rowid])
                fallthrough
            case .absent:
                let by = deletedBy[key]
                try db.cachedStatement(
                    sql: "INSERT INTO tombstones(collection, id, state, del_origin, del_seq) VALUES (?, ?, ?, ?, ?)"
                ).execute(arguments: [key.collection, key.id, stateText, by?.origin, by?.seq])
                tombstonesExist = true
            case .tombstone:
                if let by = deletedBy[key] {
                    try db.cachedStatement(
                        sql: "UPDATE tombstones SET state = ?, del_origin = ?, del_seq = ? WHERE collection = ? AND id = ?"
                    ).execute(arguments: [stateText, by.origin, by.seq, key.collection, key.id])
                } else {
                    try db.cachedStatement(sql: "UPDATE tombstones SET state = ? WHERE collection = ? AND id = ?").execute(
                        arguments: [stateText, key.collection, key.id])
                }
            }
            docs.locations[key] = .tombstone
            return
        }
        try checkSize(text.utf8.count)
        if stateCache != nil {
            cacheFill.append((key, stateText, text, state))
            cacheFillCost += StateCache.Entry.cost(stateText: stateText, bodyText: text, parts: state.fields.count)
        }
        let conflicted = state.hasConflicts
        switch location {
        case .row(let rowid):
            // Writing `conflicted` moves the row in the `docs_conflicted` index even when it stays the same: written
            // only when it changes (or is not known).
            if storedConflicted[key] == conflicted {
                try prepared(&updateBodyOnly, "UPDATE docs SET body = ?1, state = ?2 WHERE rowid = ?3").run(text, stateText, rowid)
            } else {
                try prepared(&updateBody, "UPDATE docs SET body = ?1, state = ?2, conflicted = ?3 WHERE rowid = ?4").run(
                    text, stateText, Int64(conflicted ? 1 : 0), rowid)
                storedConflicted[key] = conflicted
            }
            return
        case .tombstone:
            try db.cachedStatement(sql: "DELETE FROM tombstones WHERE collection = ? AND id = ?").execute(
                arguments: [key.collection, key.id])
        case .absent:
            break
        }
        let insert = try prepared(
            &insertBody, "INSERT INTO docs(collection, id, body, state, conflicted) VALUES (?1, ?2, ?3, ?4, ?5)")
        try insert.run(key.collection, key.id, text, stateText, Int64(conflicted ? 1 : 0))
        docs.locations[key] = .row(insert.lastInsertedRowID)
        storedConflicted[key] = conflicted
    }

    /// Refuses a document of `size` bytes over the limit (local writes only: remote changes apply as they are).
    func checkSize(_ size: Int) throws {
        guard enforceLimits && size > limits.maxDocumentBytes else { return }
        throw StoreError(
            .limitExceeded, kind: "document_too_large", "document is \(size) bytes; the limit is \(limits.maxDocumentBytes)",
            details: ["limit": .int(Int64(limits.maxDocumentBytes))])
    }

    /// Registers the collection unless it is known to exist; the cache learns new names only after COMMIT.
    func ensureCollection(_ name: String) throws {
        // Writes come in runs on one collection: the last name checked needs no lookup (nor the shared set's lock).
        if let last = lastEnsured, utf8Equal(last, name) { return }
        defer { lastEnsured = name }
        if knownCollections.contains(name) || ensuredCollections.contains(name) { return }
        ensuredCollections.insert(name)
        try db.cachedStatement(sql: "INSERT OR IGNORE INTO collections(name, created_at) VALUES (?, ?)").execute(
            arguments: [name, Int64(Date().timeIntervalSince1970 * 1000)])
        let known = knownCollections
        onCommit { known.insert(name) }
    }

    /// Runs `action` once the transaction commits (nothing on rollback).
    func onCommit(_ action: @escaping @Sendable () -> Void) {
        if collectsAfterCommit {
            afterCommit.append(action)
        } else {
            db.afterNextTransaction(onCommit: { _ in action() })
        }
    }
}
