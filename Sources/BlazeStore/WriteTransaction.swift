import BlazeCRDT
import BlazeProtocol
import BlazeVector
import Foundation
import GRDB

/// One operation of a write transaction, as accepted by `tx.commit` and the single-document write methods.
public enum WriteOp: Sendable, Equatable {
    /// Insert a new document; fails if the id exists. The id is generated when `_id` is absent.
    case insert(collection: String, doc: [String: JSONValue])
    /// Create or fully replace the document with this id.
    case put(collection: String, id: String, doc: [String: JSONValue])
    /// Edit fields of an existing document, top-level names or dotted paths of nested fields: LWW set/unset, counter
    /// increments, set add/remove.
    case patch(
        collection: String, id: String, set: [String: JSONValue] = [:], unset: [String] = [],
        incr: [String: JSONValue] = [:], add: [String: [JSONValue]] = [:], remove: [String: [JSONValue]] = [:])
    /// Delete an existing document.
    case delete(collection: String, id: String)
}

/// What a write operation did.
public struct WriteResult: Sendable, Equatable {
    /// The document id written.
    public var id: String
    /// For `put`: whether the document was created (true) or replaced (false).
    public var created: Bool?
}

/// The one place local mutations happen, inside one SQLite transaction that becomes one replicated change.
///
/// Each operation is validated, turned into a CRDT operation (`LocalEdit`) and applied through the same engine
/// that applies remote changes, so local and remote writes follow the same rules. Not Sendable: it lives only
/// inside a GRDB write closure.
public final class WriteTransaction {
    let storage: SQLStorage
    let limits: StoreLimits
    /// The change being built: its origin, sequence, clock and dependencies are fixed when the transaction starts.
    let draft: Change
    /// Number of operations emitted so far (their JSON is in `text`).
    private(set) var opCount = 0
    /// Number of document mutations applied (feeds the planner-statistics refresh).
    private(set) var changes = 0
    /// The change's canonical text so far: its header (`Change.textPrefix`), then its operations' JSON, comma-separated,
    /// written as they are emitted (no document is encoded again for it). Empty until the first operation.
    private var text: [UInt8] = []

    var db: Database { storage.db }

    init(storage: SQLStorage, limits: StoreLimits, draft: Change) {
        self.storage = storage
        self.limits = limits
        self.draft = draft
    }

    /// The change this transaction produced, with its canonical text (UTF-8); nil when it wrote nothing. Call once,
    /// after the last operation: the text is handed over, not copied.
    ///
    /// The change's operations are recorded as text only: applying them already happened, and recording needs
    /// nothing else.
    func finish() -> (header: Change, text: [UInt8])? {
        guard opCount > 0 else { return nil }
        var out = text
        text = []
        Change.finishText(&out)
        return (draft, out)
    }

    private func emit(_ op: CRDTOp) throws {
        try Replica.applyOp(op, index: opCount, of: draft, to: storage)
        record { Change.writeOp(op, to: &$0) }
    }

    /// Counts an applied operation and appends its JSON (written by `write`) to the change's.
    private func record(_ write: (inout [UInt8]) -> Void) {
        if opCount > 0 { text.append(UInt8(ascii: ",")) } else { text = draft.textPrefix(capacity: 4096) }
        write(&text)
        opCount += 1
        changes += 1
    }

    /// Inserts a document no state exists for without looking it up (see `SQLStorage.insertNew`); false when the
    /// key has a state, for the general path to handle. `doc` may hold `_id` (equal to `key.id`), which is not a field.
    private func emitNew(_ key: DocKey, doc: [String: JSONValue]) throws -> Bool {
        guard let (body, idMember) = try storage.insertNew(key, doc: doc, stamp: draft.stamp(opCount)) else { return false }
        record { Change.writeSetOp(key, cl: 1, document: body, without: idMember, to: &$0) }
        return true
    }

    /// Applies one operation; throws `StoreError` for invalid input or missing/duplicate documents.
    public func apply(_ op: WriteOp) throws -> WriteResult {
        switch try op.withStoredVectors() {
        case .insert(let collection, var doc):
            try validateCollection(collection)
            let id: String
            let names = Self.scanNames(doc)
            // `_id` stays in `doc` for the fast path (removing it would copy the caller's dictionary).
            if let given = names.id {
                guard case .string(let s) = given else {
                    throw StoreError.invalid("invalid_id", "_id must be a string, got \(given.typeName)")
                }
                id = s
            } else {
                id = DocumentID.generate()
            }
            try Names.validateID(id)
            if let invalid = names.invalid { try Names.validateFieldName(invalid) }
            let key = DocKey(collection: collection, id: id)
            if try emitNew(key, doc: doc) { return WriteResult(id: id) }
            doc.removeValue(forKey: "_id")
            let current = try storage.localState(key)
            if current?.isAlive == true {
                throw StoreError(
                    .alreadyExists, kind: "document_exists",
                    "document \(Names.quoted(id)) already exists in \(collection); use doc.put to replace it")
            }
            try emit(.doc(LocalEdit.replace(key, fields: doc, current: current)))
            return WriteResult(id: id)

        case .put(let collection, let id, var doc):
            try validateCollection(collection)
            try Names.validateID(id)
            let names = Self.scanNames(doc)
            if let given = names.id {
                guard case .string(let s) = given, utf8Equal(s, id) else {
                    throw StoreError.invalid("id_mismatch", "doc._id does not match the id parameter")
                }
            }
            if let invalid = names.invalid { try Names.validateFieldName(invalid) }
            let key = DocKey(collection: collection, id: id)
            if try emitNew(key, doc: doc) { return WriteResult(id: id, created: true) }
            doc.removeValue(forKey: "_id")
            let current = try storage.localState(key)
            try emit(.doc(LocalEdit.replace(key, fields: doc, current: current)))
            return WriteResult(id: id, created: current?.isAlive != true)

        case .patch(let collection, let id, let set, let unset, let incr, let add, let remove):
            try validateCollection(collection)
            try Names.validateID(id)
            try validatePatch(set: set, unset: unset, incr: incr, add: add, remove: remove)
            let key = DocKey(collection: collection, id: id)
            if incr.isEmpty && add.isEmpty && remove.isEmpty,
                let cl = try storage.patchInPlace(key, set: set, unset: unset, change: draft, index: opCount)
            {
                record { Change.writeOp(.doc(DocOp(key: key, cl: cl, set: set, unset: unset)), to: &$0) }
                return WriteResult(id: id)
            }
            let current = try storage.document(key)
            guard
                let edit = LocalEdit.patch(key, current: current, set: set, unset: unset, incr: incr, add: add, remove: remove)
            else { throw notFound(collection, id) }
            if edit.hasPaths || !incr.isEmpty, let doc = current?.materialize(id: id) {
                if edit.hasPaths {
                    try Self.checkPathsReach(
                        Array(set.keys) + unset + Array(incr.keys) + Array(add.keys) + Array(remove.keys), in: doc)
                }
                try Self.checkIncrementsApply(incr.keys, in: doc)
            }
            try emit(.doc(edit))
            return WriteResult(id: id)

        case .delete(let collection, let id):
            try validateCollection(collection)
            try Names.validateID(id)
            let key = DocKey(collection: collection, id: id)
            guard let op = LocalEdit.delete(key, current: try storage.document(key)) else { throw notFound(collection, id) }
            try emit(op)
            return WriteResult(id: id)
        }
    }

    /// The collection name last found valid: operations come in runs on one collection.
    private var validCollection: String?

    /// Checks a collection name (once per run of operations on it).
    private func validateCollection(_ name: String) throws {
        if let valid = validCollection, utf8Equal(valid, name) { return }
        try Names.validateCollection(name)
        validCollection = name
    }

    /// One pass over a document's member names: the value of its `_id` member, if any, and a name other than `_id`
    /// that `Names.validateFieldName` rejects (empty, starting with `_`, or holding `.`), if any.
    static func scanNames(_ doc: [String: JSONValue]) -> (id: JSONValue?, invalid: String?) {
        var id: JSONValue?
        var invalid: String?
        var i = doc.startIndex
        while i != doc.endIndex {
            let name = doc.keys[i]
            if let first = name.utf8.first, first != UInt8(ascii: "_") {
                // The common case: an ordinary field name (unless it holds a path separator).
                if name.utf8.contains(UInt8(ascii: ".")) { invalid = name }
            } else if utf8Equal(name, "_id") {
                id = doc.values[i]
            } else {
                invalid = name
            }
            doc.formIndex(after: &i)
        }
        return (id, invalid)
    }

    func validatePatch(
        set: [String: JSONValue], unset: [String], incr: [String: JSONValue], add: [String: [JSONValue]],
        remove: [String: [JSONValue]]
    ) throws {
        // The common patch only sets fields: names need checking, and cannot repeat.
        if unset.isEmpty && incr.isEmpty && add.isEmpty && remove.isEmpty && !set.isEmpty {
            var nested = false
            for name in set.keys {
                try Names.validateFieldPath(name)
                if NestedPath.isNested(name) { nested = true }
            }
            if nested { try Self.checkOverlaps(Set(set.keys)) }
            return
        }
        var seen: [String: String] = [:]
        let groups: [(String, [String])] = [
            ("set", Array(set.keys)), ("unset", unset), ("incr", Array(incr.keys)), ("add", Array(add.keys)),
            ("remove", Array(remove.keys)),
        ]
        for (group, names) in groups {
            for name in names {
                try Names.validateFieldPath(name)
                if let other = seen[name] {
                    throw StoreError.invalid(
                        "invalid_patch", "field \(Names.quoted(name)) appears in both \(other) and \(group)")
                }
                seen[name] = group
            }
        }
        if seen.isEmpty { throw StoreError.invalid("invalid_patch", "a patch needs set, unset, incr, add or remove") }
        try Self.checkOverlaps(Set(seen.keys))
        for (name, delta) in incr {
            switch delta {
            case .int, .double: continue
            default:
                throw StoreError.invalid("invalid_patch", "incr of \(Names.quoted(name)) must be a number, got \(delta.typeName)")
            }
        }
    }

    /// Refuses a patch that edits both an object and a field inside it (`a` and `a.b`): which should win?
    static func checkOverlaps(_ names: Set<String>) throws {
        for name in names where NestedPath.isNested(name) {
            for outer in NestedPath.ancestors(name) where names.contains(outer) {
                throw StoreError.invalid(
                    "invalid_patch",
                    "paths \(Names.quoted(outer)) and \(Names.quoted(name)) overlap: a patch may not edit an object and a field inside it")
            }
        }
    }

    /// Refuses a patch whose nested paths go through a value that is not an object in `doc` (a missing object on the
    /// way is created by a write).
    static func checkPathsReach(_ names: some Sequence<String>, in doc: [String: JSONValue]) throws {
        for name in names where NestedPath.isNested(name) {
            let segments = name.split(separator: ".")
            var members = doc
            for (i, segment) in segments.dropLast().enumerated() {
                guard let value = members[String(segment)] else { break }
                guard case .object(let inner) = value else {
                    let at = segments[...i].joined(separator: ".")
                    throw StoreError.invalid(
                        "invalid_path", "cannot edit \(Names.quoted(name)): \(Names.quoted(at)) is \(value.typeName), not an object")
                }
                members = inner
            }
        }
    }

    /// Refuses an increment of a field (or dotted path) whose value here is not a number, as MongoDB's `$inc` does: a
    /// string would silently become a counter, an object would take an increment nobody sees. A missing field starts
    /// at 0. (Replicas merge concurrent type changes by SYNC.md's rules; this only checks what this replica holds.)
    static func checkIncrementsApply(_ names: some Sequence<String>, in doc: [String: JSONValue]) throws {
        for name in names {
            var value: JSONValue? = nil
            var members = doc
            let segments = name.split(separator: ".", omittingEmptySubsequences: false)
            for (i, segment) in segments.enumerated() {
                value = members[String(segment)]
                guard i < segments.count - 1 else { break }
                guard case .object(let inner)? = value else {
                    value = nil
                    break
                }
                members = inner
            }
            switch value {
            case nil, .int?, .double?: continue
            case let other?:
                throw StoreError.invalid(
                    "not_a_number",
                    "cannot incr \(Names.quoted(name)): it holds \(other.typeName), not a number (set it to a number first)")
            }
        }
    }

    /// Creates a user index over `fields` of `collection` (a vector index over one field when `vector` is given);
    /// replicated like data.
    public func createIndex(collection: String, fields: [String], name: String?, vector: IndexVector? = nil) throws -> IndexInfo {
        try Names.validateCollection(collection)
        guard !fields.isEmpty, fields.count <= limits.maxIndexFields else {
            throw StoreError.invalid("invalid_index", "an index needs 1 to \(limits.maxIndexFields) fields")
        }
        if let vector {
            guard fields.count == 1 else { throw StoreError.invalid("invalid_index", "a vector index covers one field") }
            guard vector.dimensions >= 1, vector.dimensions <= VectorValue.maxDimensions else {
                throw StoreError.invalid(
                    "invalid_index", "a vector index's dimensions are 1 to \(VectorValue.maxDimensions), got \(vector.dimensions)")
            }
            guard VectorMetric(rawValue: vector.metric) != nil else {
                throw StoreError.invalid("invalid_index", "metric is cosine, l2 or ip, got \(Names.quoted(vector.metric))")
            }
        }
        let paths = try fields.map { (f: String) throws(StoreError) -> FieldPath in try FieldPath(f) }
        guard Set(paths).count == paths.count else {
            throw StoreError.invalid("invalid_index", "index fields must be distinct")
        }
        let indexName = name ?? ([collection] + fields).joined(separator: ".").prefix(128).description
        try Names.validateIndex(indexName)
        // Built, or kept past the limits (a definition another device made): either way it exists.
        if try String.fetchOne(db, sql: "SELECT name FROM indexes WHERE name = ?", arguments: [indexName]) != nil
            || storage.index(indexName)?.fields != nil
        {
            throw StoreError(.alreadyExists, kind: "index_exists", "index \(Names.quoted(indexName)) already exists")
        }
        if let full = try SQLStorage.indexCapacityReached(vector: vector != nil, limits, db) {
            throw StoreError(.limitExceeded, kind: "too_many_indexes", full + ": drop one first")
        }
        let normalized = paths.map(\.description)
        try emit(.index(name: indexName, collection: collection, fields: normalized, vector: vector))
        return IndexInfo(name: indexName, collection: collection, fields: normalized, vector: vector)
    }

    /// Drops a user index by name; replicated like data.
    public func dropIndex(name: String) throws {
        try Names.validateIndex(name)
        // A definition kept past the limits (not built) is dropped like a built one.
        let kept = try storage.index(name).flatMap { $0.fields == nil ? nil : $0.collection }
        guard let collection = try String.fetchOne(db, sql: "SELECT collection FROM indexes WHERE name = ?", arguments: [name]) ?? kept
        else {
            throw StoreError(.notFound, kind: "index_not_found", "index \(Names.quoted(name)) does not exist")
        }
        try emit(.index(name: name, collection: collection, fields: nil))
    }

    /// Re-expresses documents and indexes stored before replication existed as operations of this change.
    func adopt(docs: [Row], indexes: [Row]) throws {
        for row in docs {
            guard case .object(var doc) = try JSONParser(maxDepth: 10_000).parse(row[2] as String) else { continue }
            doc.removeValue(forKey: "_id")
            let key = DocKey(collection: row[0], id: row[1])
            try emit(.doc(LocalEdit.replace(key, fields: doc, current: try storage.document(key))))
        }
        for row in indexes {
            let fields = try JSONParser().parse(row[2] as String).arrayValue?.compactMap(\.stringValue) ?? []
            try emit(.index(name: row[0], collection: row[1], fields: fields))
        }
    }

    static func sqlIndexName(_ name: String) -> String { "\"ux_\(name)\"" }

    func notFound(_ collection: String, _ id: String) -> StoreError {
        StoreError(.notFound, kind: "document_not_found", "no document \(Names.quoted(id)) in collection \(collection)")
    }
}
