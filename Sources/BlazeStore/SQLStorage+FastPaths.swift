import BlazeCRDT
import BlazeProtocol
import GRDB

/// The two write shortcuts: a new document's rows written at once, and a plain local patch applied to the stored row
/// without decoding its field states. Both leave what they wrote in `TransactionDocuments` (`created`, `patched`)
/// so that any later read in the transaction sees it; the property tests and, in debug builds, every patch check them
/// against the general engine.
extension SQLStorage {
    /// Applies a local patch that only sets and unsets fields by rewriting the document's row at once, without
    /// decoding its field states (see `DocumentState.compactTextAfterLocalWrite`); returns the document's causal
    /// length, or nil when the general path must apply it (the document is missing, already read in this
    /// transaction, or has counter, set or conflict state). Operation `index` of `change` is the patch.
    func patchInPlace(
        _ key: DocKey, set: [String: JSONValue], unset: [String], change: Change, index: Int
    ) throws -> Int64? {
        guard docs.untouched(key), let row = try fetchRow(key) else { return nil }
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
            docs.locations[key] = .row(row.rowid)
            _ = load(key, try DocumentState(compact: state, body: try Self.parseBody(row.body), coding), text: row.body)
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
                "patchInPlace body \(text) differs for \(key) (state \(stateText), body \(row.body))")
        #endif
        try checkSize(body.count)
        // The shortcut applies only to states without conflicts, before and after: `conflicted` stays 0.
        let update = try prepared(&updateRow, "UPDATE docs SET body = ?, state = ? WHERE rowid = ?")
        try update.run(body, newState, row.rowid)
        docs.visible[key] = Visible(text: row.body)
        docs.patched[key] = TransactionDocuments.Patched(
            stateText: newState, text: text, stamp: change.stamp(index), rowid: row.rowid)
        docs.touch(key)
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
        // Plain writes grouped by stamp: `[[stamp, [names]], …]`.
        for group in state["p"]?.arrayValue ?? [] {
            guard let names = group.arrayValue?.last?.arrayValue, names.allSatisfy({ $0.stringValue.map(ascii) ?? false })
            else { return false }
        }
        return true
    }

    /// A patch's writes by field: a value, or nil for unset.
    static func writes(set: [String: JSONValue], unset: [String]) -> [String: JSONValue?] {
        var writes = [String: JSONValue?](minimumCapacity: set.count + unset.count)
        for (name, value) in set { writes[name] = .some(value) }
        for name in unset { writes[name] = .some(nil) }
        return writes
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
        // Once tombstones were dropped, a new document may not start at causal length 1 (`localState`).
        guard droppedCausalLength == 0, docs.states[key] == nil, docs.created[key] == nil, try tombstone(key) == nil else {
            return nil
        }
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
        docs.created[key] = TransactionDocuments.Created(doc: doc, text: text, stamp: stamp, rowid: rowid)
        docs.touch(key)
        return (body, idMember)
    }

    /// Applies a remote document creation through `insertNew` when no state exists for its key (see
    /// `ReplicaStorage.createIfNew`): no state decoded or built, the body written once. Debug builds check every
    /// one against the general engine.
    ///
    /// A remote op of this shape is as often a patch of a document held here, so the key is looked up first, as the
    /// general path would, and the patch then finds its row already read. Once a creation found no document, the
    /// next one skips that lookup: `insertNew`'s insert probes for the row itself and writes nothing when it exists
    /// (the op then takes the general path), so a run of new documents (a first sync) costs one statement each.
    func createIfNew(_ op: DocOp, index: Int, of change: Change) throws -> Bool {
        guard droppedCausalLength == 0, docs.untouched(op.key) else { return false }
        let stamp = change.stamp(index)
        if !lastCreationFoundNone {
            _ = try document(op.key)
            guard case .absent? = docs.locations[op.key] else { return false }
            // Never seen: forget the cached absence, which the shortcut replaces with the document it writes.
            docs.states[op.key] = nil
            docs.locations[op.key] = nil
        }
        guard let (body, _) = try insertNew(op.key, doc: op.set, stamp: stamp) else {
            lastCreationFoundNone = false
            return false
        }
        lastCreationFoundNone = true
        #if DEBUG
            var general = DocumentState()
            general.apply(op, change: change, index: index)
            let state = createdStates!.bytes(fieldCount: op.set.count, index: stamp.dot.index)
            precondition(
                general.compactText(coding) == String(decoding: state, as: UTF8.self),
                "createIfNew state differs for \(op.key): \(general.compactText(coding))")
            precondition(
                general.materialize(id: op.key.id).map { JSONValue.object($0).jsonText } == String(decoding: body, as: UTF8.self),
                "createIfNew body differs for \(op.key)")
        #endif
        return true
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
}
