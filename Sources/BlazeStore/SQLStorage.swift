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
    /// A document's canonical text (nil when it does not exist) and, when at hand, its parsed form.
    struct Visible {
        var doc: [String: JSONValue]?
        var text: String?
    }

    let db: Database
    let limits: StoreLimits
    /// How this database's stored states write stamp origins.
    let coding: StampCoding
    let knownCollections: KnownCollections
    /// Local writes enforce the document size limit; remote changes are applied as they are.
    var enforceLimits = false
    /// States read or written in this transaction; a nil value caches "no such document".
    private var cache: [DocKey: DocumentState?] = [:]
    /// Keys to write at `flush()`, in first-write order (`dirtySet` makes membership O(1)).
    private var dirty: [DocKey] = []
    private var dirtySet: Set<DocKey> = []
    /// Each cached document as of the last recorded change (or as loaded): the "before" of the next change.
    private var visible: [DocKey: Visible] = [:]
    /// Documents saved since the last recorded change, in first-touch order.
    private var touched: [DocKey] = []
    private var touchedSet: Set<DocKey> = []
    /// Collections registered in this transaction (once each: every registration adds a commit hook).
    private var ensuredCollections: Set<String> = []
    /// The collection `ensureCollection` last found or registered.
    private var lastEnsured: String?
    /// The highest sequence recorded per origin in this transaction, written to `versions` by `flush()`.
    private var recordedVersions: [NodeID: UInt64] = [:]
    /// Where a document's state is stored.
    enum Location {
        /// Nowhere: the document was never seen.
        case absent
        /// Its `docs` row.
        case row(Int64)
        /// Its `tombstones` row.
        case tombstone
    }

    /// Where each document read or written in this transaction is stored.
    private var locations: [DocKey: Location] = [:]
    /// Whether `tombstones` has any row, probed once per transaction; while it has none, no lookup there is needed.
    private var tombstonesExist: Bool?
    /// Documents created by `insertNew` whose state was not needed since: their rows are written, and their state is
    /// built (into `cache`) only if a later operation of the transaction reads it.
    private var created: [DocKey: Created] = [:]
    /// The statements run once per document (and once per change), prepared on first use in the transaction.
    private var selectRow: RawStatement?
    private var updateRow: RawStatement?
    private var insertRow: RawStatement?
    private var insertChange: RawStatement?
    /// The state texts of documents created by the current change.
    private var createdStates: DocumentState.CreatedStateText?
    /// Documents `patchInPlace` rewrote whose state was not needed since, as written (state text, body).
    private var patched: [DocKey: Patched] = [:]
    /// Feed entries of the changes recorded in this transaction, in order.
    private(set) var entries: [FeedEntry] = []
    /// The feed sequence of the last change recorded (committed ones, then this transaction's).
    private(set) var feedSequence: Int64

    init(
        db: Database, limits: StoreLimits, knownCollections: KnownCollections, feedSequence: Int64,
        coding: StampCoding
    ) {
        self.db = db
        self.coding = coding
        self.limits = limits
        self.knownCollections = knownCollections
        self.feedSequence = feedSequence
    }

    /// The statement in `slot`, prepared from `sql` if not yet.
    private func prepared(_ slot: inout RawStatement?, _ sql: String) throws -> RawStatement {
        if let statement = slot { return statement }
        let statement = try RawStatement(db, sql)
        slot = statement
        return statement
    }

    /// Sizes the per-document bookkeeping for a transaction that writes about `documents` documents, so that it
    /// is not rehashed as it grows.
    func reserve(documents: Int) {
        guard documents > 16 else { return }
        touched.reserveCapacity(documents)
        touchedSet.reserveCapacity(documents)
        created.reserveCapacity(documents)
    }

    func versionVector() throws -> VersionVector {
        var e: [NodeID: UInt64] = [:]
        for row in try Row.fetchAll(db.cachedStatement(sql: "SELECT origin, seq FROM versions")) {
            if let id = NodeID(hex: row[0]) { e[id] = UInt64(row[1] as Int64) }
        }
        for (origin, seq) in recordedVersions { e[origin] = max(e[origin] ?? 0, seq) }
        return VersionVector(e)
    }

    /// A document `insertNew` created: as given (with or without `_id`), its stored text (with `_id`), its stamp,
    /// its row.
    struct Created {
        var doc: [String: JSONValue]
        var text: String
        var stamp: Stamp
        var rowid: Int64

        /// The fields, without `_id`.
        var fields: [String: JSONValue] {
            var f = doc
            f.removeValue(forKey: "_id")
            return f
        }
    }

    /// A document `patchInPlace` rewrote: its new compact state text, its new body text (with `_id`), the stamp of
    /// the patch that did it, its row.
    struct Patched {
        var stateText: String
        var text: String
        var stamp: Stamp
        var rowid: Int64
    }

    func recordApplied(_ change: Change) throws {
        try recordApplied(change, text: change.jsonValue.jsonBytes)
    }

    /// Records `change`, whose canonical text is `text` (UTF-8), with its feed row and version. `last` says no change
    /// is recorded after it in this transaction (so documents already written need not be kept as the next "before").
    func recordApplied(_ change: Change, text: [UInt8], last: Bool = false) throws {
        var events: [FeedEvent] = []
        events.reserveCapacity(touched.count)
        // Per event, the operation of `change` its "after" follows from, when one does (see `FeedLog.Source`).
        var sources: [FeedLog.Source] = []
        sources.reserveCapacity(touched.count)
        func ours(_ stamp: Stamp) -> Bool { stamp.dot.seq == change.seq && stamp.dot.origin == change.origin }
        for key in touched {
            let before = visible[key] ?? Visible()
            let after: Visible
            var source = FeedLog.Source.none
            // Documents written as text are parsed again only if a filtering subscription needs them.
            if let c = created[key] {
                after = Visible(doc: nil, text: c.text)
                if ours(c.stamp) { source = .inserted(op: c.stamp.dot.index) }
            } else if let p = patched[key] {
                after = Visible(doc: nil, text: p.text)
                if ours(p.stamp) { source = .patched(op: p.stamp.dot.index) }
            } else {
                let doc = cache[key]??.materialize(id: key.id)
                after = Visible(doc: doc, text: doc.map { JSONValue.object($0).jsonText })
            }
            // `flush()` writes dirty documents as they are here.
            if !last || dirtySet.contains(key) { visible[key] = after }
            let type: FeedEventType
            switch (before.text, after.text) {
            case (nil, nil): continue
            case (nil, _): type = .insert
            case (_, nil): type = .delete
            case (let b?, let a?):
                if a == b { continue }
                type = .update
            }
            events.append(
                FeedEvent(
                    collection: key.collection, id: key.id, type: type, after: after.doc, afterText: after.text,
                    before: before.doc, beforeText: before.text))
            sources.append(source)
        }
        touched = []
        touchedSet = []
        feedSequence += 1
        let origin = change.origin.hex
        try db.cachedStatement(sql: "INSERT INTO feed(seq, origin, events) VALUES (?, ?, ?)").execute(
            arguments: [feedSequence, origin, FeedLog.encode(events, sources: sources, changeSeq: change.seq)])
        entries.append(FeedEntry(seq: feedSequence, origin: change.origin, events: events))
        // Bound in place: a change of a large transaction is hundreds of kilobytes.
        try prepared(&insertChange, "INSERT INTO changes(origin, seq, hlc, body) VALUES (?, ?, ?, ?)").run(
            origin, Int64(change.seq), Int64(bitPattern: change.hlc.raw), text)
        recordedVersions[change.origin] = max(recordedVersions[change.origin] ?? 0, change.seq)
    }

    func document(_ key: DocKey) throws -> DocumentState? {
        if let cached = cache[key] { return cached }
        // Documents written without their state: their location is known from then on.
        if let c = created.removeValue(forKey: key) {
            locations[key] = .row(c.rowid)
            let state = DocumentState.created(fields: c.fields, stamp: c.stamp)
            cache[key] = state
            return state
        }
        if let p = patched.removeValue(forKey: key) {
            locations[key] = .row(p.rowid)
            let state = try Self.decode(state: p.stateText, body: p.text, coding)
            cache[key] = state
            return state
        }
        if let row = try fetchRow(key) {
            locations[key] = .row(row.rowid)
            // A row without state holds data from before replication, about to be adopted as a new document.
            guard let stateText = row.state else {
                cache[key] = .some(nil)
                return nil
            }
            let doc = try Self.parseBody(row.body)
            return try load(key, state: try JSONParser(maxDepth: 10_000).parse(stateText), doc: doc, text: row.body)
        }
        if let stateText = try tombstone(key) {
            locations[key] = .tombstone
            let state = try Self.decode(state: stateText, body: nil, coding)
            cache[key] = state
            return state
        }
        locations[key] = .absent
        cache[key] = .some(nil)
        return nil
    }

    /// The `docs` row of `key`, if any.
    private func fetchRow(_ key: DocKey) throws -> (rowid: Int64, state: String?, body: String)? {
        let select = try prepared(&selectRow, "SELECT rowid, state, body FROM docs WHERE collection = ? AND id = ?")
        return try select.firstRow(key.collection, key.id) { row in (row.int64(0), row.text(1), row.text(2) ?? "") }
    }

    /// Decodes and caches the state of a live document read from its row.
    private func load(_ key: DocKey, state: JSONValue, doc: [String: JSONValue]?, text: String) throws -> DocumentState {
        let decoded = try DocumentState(compact: state, body: doc, coding)
        cache[key] = decoded
        if visible[key] == nil { visible[key] = Visible(doc: doc, text: text) }
        return decoded
    }

    /// Applies a local patch that only sets and unsets fields by rewriting the document's row at once, without
    /// decoding its field states (see `DocumentState.compactTextAfterLocalWrite`); returns the document's causal
    /// length, or nil when the general path must apply it (the document is missing, already read in this
    /// transaction, or has counter, set or conflict state). Operation `index` of `change` is the patch.
    func patchInPlace(
        _ key: DocKey, set: [String: JSONValue], unset: [String], change: Change, index: Int
    ) throws -> Int64? {
        guard cache[key] == nil, created[key] == nil, patched[key] == nil, let row = try fetchRow(key) else { return nil }
        guard let stateText = row.state else { return nil }
        let state = try JSONParser(maxDepth: 10_000).parse(stateText)
        // The stored body's members as byte ranges: values that are not written are copied, never parsed.
        let bytes = Array(row.body.utf8)
        guard case .int(let cl)? = state["l"],
            let members = bytes.withUnsafeBufferPointer({ JSONScan.members($0) }),
            Self.namesAreASCII(set: set, unset: unset, members: members, state: state),
            let newState = DocumentState.compactTextAfterLocalWrite(
                compact: state, fieldCount: members.count - (members.contains { $0.key == "_id" } ? 1 : 0),
                hasField: { name in name != "_id" && members.contains { $0.key == name } },
                body: { try? Self.parseBody(row.body) }, writes: Self.writes(set: set, unset: unset),
                stamp: change.stamp(index), coding)
        else {
            // The general path takes it from here, with the row already read.
            locations[key] = .row(row.rowid)
            _ = try load(key, state: state, doc: try Self.parseBody(row.body), text: row.body)
            return nil
        }
        let body = JSONScan.splice(bytes, members, set: set, unset: unset)
        let text = String(decoding: body, as: UTF8.self)
        #if DEBUG
            // Every debug run (the whole test suite) checks the shortcut against the general engine.
            var general = try DocumentState(compact: state, body: try Self.parseBody(row.body), coding)
            general.apply(DocOp(key: key, cl: cl, set: set, unset: unset), change: change, index: index)
            precondition(
                general.compactText(coding) == newState, "patchInPlace state \(newState) != \(general.compactText(coding))")
            precondition(
                general.materialize(id: key.id).map { JSONValue.object($0).jsonText } == text,
                "patchInPlace body \(text) differs for \(key)")
        #endif
        try checkSize(body.count)
        // The shortcut applies only to states without conflicts, before and after: `conflicted` stays 0.
        let update = try prepared(&updateRow, "UPDATE docs SET body = ?, state = ? WHERE rowid = ?")
        try update.run(body, newState, row.rowid)
        visible[key] = Visible(doc: nil, text: row.body)
        patched[key] = Patched(stateText: newState, text: text, stamp: change.stamp(index), rowid: row.rowid)
        if touchedSet.insert(key).inserted { touched.append(key) }
        return cl
    }

    /// True when every field name involved is ASCII. The engine keys fields by `String`, whose equality is Unicode
    /// canonical equivalence (even "K" and the Kelvin sign are equal); byte-wise splicing matches it only when no
    /// name can be equivalent to a different one, which ASCII names guarantee.
    static func namesAreASCII(set: [String: JSONValue], unset: [String], members: [JSONScan.Member], state: JSONValue) -> Bool {
        func ascii(_ s: String) -> Bool { s.utf8.allSatisfy { $0 < 0x80 } }
        guard set.keys.allSatisfy(ascii), unset.allSatisfy(ascii), members.allSatisfy({ ascii($0.key) }) else { return false }
        if let f = state["f"]?.objectValue, !f.keys.allSatisfy(ascii) { return false }
        if let u = state["u"]?.arrayValue, !u.allSatisfy({ $0.stringValue.map(ascii) ?? false }) { return false }
        return true
    }

    /// A patch's writes by field: a value, or nil for unset.
    static func writes(set: [String: JSONValue], unset: [String]) -> [String: JSONValue?] {
        var writes = [String: JSONValue?](minimumCapacity: set.count + unset.count)
        for (name, value) in set { writes[name] = .some(value) }
        for name in unset { writes[name] = .some(nil) }
        return writes
    }

    /// Where `key` is stored, for a state saved without being read first.
    private func locate(_ key: DocKey) throws -> Location {
        let stmt = try db.cachedStatement(sql: "SELECT rowid FROM docs WHERE collection = ? AND id = ?")
        if let rowid = try Int64.fetchOne(stmt, arguments: [key.collection, key.id]) { return .row(rowid) }
        return try tombstone(key) == nil ? .absent : .tombstone
    }

    /// The state text of a deleted document, if `key` is one.
    private func tombstone(_ key: DocKey) throws -> String? {
        if tombstonesExist == nil {
            tombstonesExist = try Bool.fetchOne(db, sql: "SELECT EXISTS (SELECT 1 FROM tombstones)") ?? true
        }
        guard tombstonesExist == true else { return nil }
        return try String.fetchOne(
            db.cachedStatement(sql: "SELECT state FROM tombstones WHERE collection = ? AND id = ?"),
            arguments: [key.collection, key.id])
    }

    /// Creates a document that no state exists for, writing its rows at once; returns the stored text and where its
    /// `_id` member is (the change's op records the rest), or nil when the key has a state (live or deleted), which
    /// `insertNew` leaves untouched for the general path (`document`, then `LocalEdit.replace`).
    ///
    /// The state is what `Replica.applyOp` makes of `DocOp(cl: 1, set: fields)` at `stamp` on a document never seen;
    /// the one insert that probes for a live document also writes it, so a new document costs no lookup (and none in
    /// `tombstones` while no document was ever deleted).
    func insertNew(
        _ key: DocKey, doc: [String: JSONValue], stamp: Stamp
    ) throws -> (body: [UInt8], idMember: Range<Int>)? {
        guard cache[key] == nil, created[key] == nil, try tombstone(key) == nil else { return nil }
        let (body, idMember, fieldCount) = Self.writeDocument(doc, id: key.id)
        try checkSize(body.count)
        let insert = try prepared(
            &insertRow, "INSERT INTO docs(collection, id, body, state) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING")
        if createdStates?.covers(stamp) != true { createdStates = DocumentState.CreatedStateText(stamp, coding) }
        let state = createdStates!.bytes(fieldCount: fieldCount, index: stamp.dot.index)
        guard try insert.run(key.collection, key.id, body, state) == 1 else { return nil }
        let rowid = insert.lastInsertedRowID
        let text = String(decoding: body, as: UTF8.self)
        try ensureCollection(key.collection)
        // Its "before" is absent: `visible` has no entry for it, which reads as absent.
        created[key] = Created(doc: doc, text: text, stamp: stamp, rowid: rowid)
        if touchedSet.insert(key).inserted { touched.append(key) }
        return (body, idMember)
    }

    /// The stored document: canonical JSON of `fields` with `_id: id` (an `_id` member of `fields` is left out: the
    /// id given is the one written), the byte range of its `_id` member, which the op's `set` leaves out, and the
    /// number of other members.
    static func writeDocument(
        _ fields: [String: JSONValue], id: String
    ) -> (body: [UInt8], idMember: Range<Int>, fieldCount: Int) {
        var body: [UInt8] = []
        body.reserveCapacity(256)
        body.append(UInt8(ascii: "{"))
        var idMember: Range<Int>?
        var fieldCount = 0
        func writeID() {
            if body.count > 1 { body.append(UInt8(ascii: ",")) }
            let start = body.count
            body.append(contentsOf: #""_id":"#.utf8)
            JSONValue.writeString(id, to: &body)
            idMember = start..<body.count
        }
        for i in fields.utf8OrderedIndices {
            let (name, value) = fields[i]
            if name == "_id" { continue }
            // `_id` goes before the first key that sorts after it.
            if idMember == nil && utf8Less("_id", name) { writeID() }
            if body.count > 1 { body.append(UInt8(ascii: ",")) }
            JSONValue.writeString(name, to: &body)
            body.append(UInt8(ascii: ":"))
            value.write(to: &body)
            fieldCount += 1
        }
        if idMember == nil { writeID() }
        body.append(UInt8(ascii: "}"))
        return (body, idMember!, fieldCount)
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
        try DocumentState(compact: try JSONParser(maxDepth: 10_000).parse(state), body: try parseBody(body), coding)
    }

    func updateDocument(_ key: DocKey, _ edit: (inout DocumentState) -> Void) throws {
        var state = try document(key) ?? DocumentState()
        // Drop the cache's reference first, so that `edit` changes the fields in place instead of copying them.
        cache[key] = .some(nil)
        edit(&state)
        try saveDocument(key, state)
    }

    func saveDocument(_ key: DocKey, _ state: DocumentState) throws {
        cache[key] = .some(state)
        if dirtySet.insert(key).inserted { dirty.append(key) }
        if touchedSet.insert(key).inserted { touched.append(key) }
    }

    /// Writes every document state changed in this transaction, and its materialized row (as of the last recorded
    /// change: callers record every change before flushing).
    func flush() throws {
        precondition(touched.isEmpty, "flush before the change was recorded")
        for key in dirty { try write(key, cache[key]!!, visible[key] ?? Visible()) }
        dirty = []
        dirtySet = []
        // One version row per origin per transaction, however many of its changes were recorded.
        for (origin, seq) in recordedVersions {
            try db.cachedStatement(
                sql: "INSERT INTO versions(origin, seq) VALUES (?, ?) ON CONFLICT(origin) DO UPDATE SET seq = max(seq, excluded.seq)"
            ).execute(arguments: [origin.hex, Int64(seq)])
        }
        recordedVersions = [:]
    }

    private func write(_ key: DocKey, _ state: DocumentState, _ body: Visible) throws {
        // A collection exists once any document state lives in it (deleted ones too), whatever the batching of the
        // changes that brought it: collection existence must converge like the documents do.
        try ensureCollection(key.collection)
        let stateText = state.compactText(coding)
        let location = try locations[key] ?? locate(key)
        guard let text = body.text else {
            switch location {
            case .row(let rowid):
                try db.cachedStatement(sql: "DELETE FROM docs WHERE rowid = ?").execute(arguments: [rowid])
                fallthrough
            case .absent:
                try db.cachedStatement(sql: "INSERT INTO tombstones(collection, id, state) VALUES (?, ?, ?)").execute(
                    arguments: [key.collection, key.id, stateText])
                tombstonesExist = true
            case .tombstone:
                try db.cachedStatement(sql: "UPDATE tombstones SET state = ? WHERE collection = ? AND id = ?").execute(
                    arguments: [stateText, key.collection, key.id])
            }
            locations[key] = .tombstone
            return
        }
        try checkSize(text.utf8.count)
        let conflicted = state.hasConflicts
        switch location {
        case .row(let rowid):
            try db.cachedStatement(sql: "UPDATE docs SET body = ?, state = ?, conflicted = ? WHERE rowid = ?").execute(
                arguments: [text, stateText, conflicted, rowid])
            return
        case .tombstone:
            try db.cachedStatement(sql: "DELETE FROM tombstones WHERE collection = ? AND id = ?").execute(
                arguments: [key.collection, key.id])
        case .absent:
            break
        }
        try db.cachedStatement(sql: "INSERT INTO docs(collection, id, body, state, conflicted) VALUES (?, ?, ?, ?, ?)")
            .execute(arguments: [key.collection, key.id, text, stateText, conflicted])
        locations[key] = .row(db.lastInsertedRowID)
    }

    /// Refuses a document of `size` bytes over the limit (local writes only: remote changes apply as they are).
    private func checkSize(_ size: Int) throws {
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
        db.afterNextTransaction { _ in known.insert(name) }
    }

    func index(_ name: String) throws -> IndexState? {
        guard let text = try String.fetchOne(db, sql: "SELECT state FROM index_states WHERE name = ?", arguments: [name]),
            case .object(let o) = try JSONParser().parse(text), let stampJSON = o["s"], let stamp = Stamp(json: stampJSON),
            case .string(let collection)? = o["c"]
        else { return nil }
        let fields = o["f"]?.arrayValue?.compactMap(\.stringValue)
        return IndexState(stamp: stamp, collection: collection, fields: fields)
    }

    /// Stores the winning definition and makes the SQLite index match it.
    func saveIndex(_ name: String, _ state: IndexState) throws {
        let json: JSONValue = [
            "s": state.stamp.jsonValue, "c": .string(state.collection),
            "f": state.fields.map { .array($0.map(JSONValue.string)) } ?? .null,
        ]
        try db.execute(
            sql: "INSERT INTO index_states(name, state) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET state = excluded.state",
            arguments: [name, json.jsonText])
        let sqlName = WriteTransaction.sqlIndexName(name)
        try db.execute(sql: "DROP INDEX IF EXISTS \(sqlName)")
        try db.execute(sql: "DELETE FROM indexes WHERE name = ?", arguments: [name])
        if let fields = state.fields {
            // Definitions from other replicas are validated like local ones; an invalid one is stored but not built.
            guard (try? Names.validateCollection(state.collection)) != nil, (try? Names.validateIndex(name)) != nil,
                let paths = try? fields.map({ (f: String) throws(StoreError) -> FieldPath in try FieldPath(f) })
            else { return }
            try ensureCollection(state.collection)
            try db.execute(
                sql: "INSERT INTO indexes(name, collection, fields, created_at) VALUES (?, ?, ?, ?)",
                arguments: [
                    name, state.collection, JSONValue.array(fields.map(JSONValue.string)).jsonText,
                    Int64(state.stamp.hlc.milliseconds),
                ])
            try db.execute(sql: Self.createIndexSQL(name: name, collection: state.collection, paths: paths))
        }
        try BlazeDatabase.analyze(db)
    }

    /// The SQL that builds user index `name` (names validated by the caller).
    static func createIndexSQL(name: String, collection: String, paths: [FieldPath]) -> String {
        "CREATE INDEX \(WriteTransaction.sqlIndexName(name)) ON docs(\(QueryCompiler.indexColumns(paths))) "
            + "WHERE collection = '\(collection)'"
    }

    func park(_ change: Change) throws {
        try db.cachedStatement(sql: "INSERT OR REPLACE INTO parked(origin, seq, body) VALUES (?, ?, ?)").execute(
            arguments: [change.origin.hex, Int64(change.seq), change.jsonValue.jsonText])
    }

    func parked() throws -> [Change] {
        try String.fetchAll(db, sql: "SELECT body FROM parked").map { try Change(json: try JSONParser(maxDepth: 10_000).parse($0)) }
    }

    func parkedNext(_ vv: VersionVector) throws -> [Change] {
        var out: [Change] = []
        let probe = try db.cachedStatement(sql: "SELECT body FROM parked WHERE origin = ? AND seq = ?")
        for originHex in try String.fetchAll(db, sql: "SELECT DISTINCT origin FROM parked") {
            guard let origin = NodeID(hex: originHex),
                let body = try String.fetchOne(probe, arguments: [originHex, Int64(vv[origin] + 1)])
            else { continue }
            out.append(try Change(json: try JSONParser(maxDepth: 10_000).parse(body)))
        }
        return out
    }

    func parkedCount() throws -> Int {
        try Int.fetchOne(db, sql: "SELECT count(*) FROM parked") ?? 0
    }

    func hasParked() throws -> Bool {
        try Bool.fetchOne(db.cachedStatement(sql: "SELECT EXISTS(SELECT 1 FROM parked)")) ?? false
    }

    func unpark(origin: NodeID, seq: UInt64) throws {
        try db.cachedStatement(sql: "DELETE FROM parked WHERE origin = ? AND seq = ?").execute(
            arguments: [origin.hex, Int64(seq)])
    }
}
