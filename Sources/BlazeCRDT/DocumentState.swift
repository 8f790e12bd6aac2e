import BlazeProtocol

/// The replicated state of a document: its causal length and its fields at that length.
public struct DocumentState: Hashable, Sendable {
    /// Causal length: 0 never existed, odd alive, even deleted.
    public var cl: Int64
    /// Field states at `cl`.
    public var fields: [String: FieldState]

    /// Creates a state.
    public init(cl: Int64 = 0, fields: [String: FieldState] = [:]) {
        self.cl = cl
        self.fields = fields
    }

    /// The same document with its history folded away, when every field is a plain write (no counter, set or
    /// conflict) made by a change `stable` covers; nil otherwise, or when there is nothing to fold.
    ///
    /// `stable` must be strictly stable (SYNC.md §11): every change still to come, from any member, is causally after
    /// those writes, so it carries a later clock than all of them and observes them all. Which of those writes a field
    /// holds then decides nothing: each field is rewritten at the document's latest stamp, and unset fields are
    /// dropped. The stored form shrinks to `{"l": cl, "t": stamp}`.
    public func folded(stable: VersionVector) -> DocumentState? {
        guard cl % 2 == 1 else { return nil }
        var latest: Stamp?
        var distinct = false
        for f in fields.values {
            guard f.isPlainWrite, let s = f.winner?.stamp, s.dot.seq <= stable[s.dot.origin] else { return nil }
            if let l = latest, l != s { distinct = true }
            if latest.map({ $0 < s }) ?? true { latest = s }
        }
        guard let latest else { return nil }
        // Nested fields fold into their top-level objects: the document's values, each written at `latest`.
        if hasPaths { return DocumentState(cl: cl, fields: valuesWithPaths().mapValues { .plain(latest, $0) }) }
        let unset = fields.values.contains { $0.winner?.value == nil }
        guard distinct || unset else { return nil }
        return DocumentState(cl: cl, fields: fields.compactMapValues { f in f.winner!.value.map { .plain(latest, $0) } })
    }

    /// The state of a document that one operation created: every field of `fields` written at `stamp`, at causal
    /// length 1 (what `apply` makes of `DocOp(cl: 1, set: fields)` on a document never seen before).
    public static func created(fields: [String: JSONValue], stamp: Stamp) -> DocumentState {
        DocumentState(cl: 1, fields: fields.mapValues { .plain(stamp, $0) })
    }

    /// Compact storage text (`compactText(coding)`) of `created(fields:stamp:)` for the documents that the
    /// operations of one change create, without building those states: their stamps differ only in the operation
    /// index, so the rest is written once.
    public struct CreatedStateText: Sendable {
        /// The text up to the stamp's operation index.
        private let prefix: [UInt8]
        /// The change's origin.
        public let origin: NodeID
        /// The change's sequence number at its origin.
        public let seq: UInt64
        /// The change's clock.
        public let hlc: HLC

        /// The texts for stamps of `stamp`'s change, origins as `coding` writes them.
        public init(_ stamp: Stamp, _ coding: StampCoding = .hex) {
            origin = stamp.dot.origin
            seq = stamp.dot.seq
            hlc = stamp.hlc
            var out: [UInt8] = Array(#"{"l":1,"t":"#.utf8)
            out.reserveCapacity(96)
            Stamp(hlc: hlc, origin: origin, seq: seq, index: 0).write(to: &out, coding)
            // Drop the index and the closing bracket ("0]").
            out.removeLast(2)
            prefix = out
        }

        /// True when `stamp` belongs to this change.
        public func covers(_ stamp: Stamp) -> Bool { stamp.dot.seq == seq && stamp.hlc == hlc && stamp.dot.origin == origin }

        /// The text for a document of `fieldCount` fields created by operation `index` of the change.
        public func bytes(fieldCount: Int, index: Int) -> [UInt8] {
            guard fieldCount > 0 else { return Array(#"{"l":1}"#.utf8) }
            var out = prefix
            JSONValue.writeInt(Int64(index), to: &out)
            out.append(contentsOf: "]}".utf8)
            return out
        }
    }

    /// True when some field has concurrent writes that lost (see `FieldState.losers`).
    public var hasConflicts: Bool { fields.values.contains { !$0.isPlainWrite && !$0.losers.isEmpty } }

    /// True when the document exists.
    public var isAlive: Bool { cl % 2 == 1 }

    /// Applies operation `index` of `change` (which must be causally ready) to this document.
    public mutating func apply(_ op: DocOp, change: Change, index: Int) {
        guard op.cl >= cl else { return }
        if op.cl > cl {
            cl = op.cl
            fields = [:]
        }
        let stamp = change.stamp(index)
        if op.hasPaths || hasPaths {
            applyWithPaths(op, change: change, index: index, stamp: stamp)
            return
        }
        for (name, value) in op.set { fields[name, default: FieldState()].write(FieldWrite(stamp: stamp, value: value), in: change, at: index) }
        for name in op.unset { fields[name, default: FieldState()].write(FieldWrite(stamp: stamp, value: nil), in: change, at: index) }
        for (name, delta) in op.incr { fields[name, default: FieldState()].increment(delta, stamp: stamp) }
        for (name, elements) in op.add { for e in elements { fields[name, default: FieldState()].add(e, stamp: stamp) } }
        for (name, elements) in op.remove {
            for e in elements { fields[name, default: FieldState()].remove(e, stamp: stamp, in: change, at: index) }
        }
        // Rebuild only when some field was left without state (rare); scanning allocates nothing.
        if fields.values.contains(where: \.isEmpty) { fields = fields.filter { !$0.value.isEmpty } }
    }

    /// Applies a delete: the causal length rises to `deleteCL` (even) if that is larger.
    public mutating func delete(cl deleteCL: Int64) {
        guard deleteCL > cl else { return }
        cl = deleteCL
        fields = [:]
    }

    /// The document as clients see it (with `_id`), or nil when it does not exist.
    public func materialize(id: String) -> [String: JSONValue]? {
        guard isAlive else { return nil }
        var doc = [String: JSONValue](minimumCapacity: fields.count + 1)
        doc["_id"] = .string(id)
        if hasPaths {
            for (name, v) in valuesWithPaths() { doc[name] = v }
            return doc
        }
        for (name, state) in fields { if let v = state.value { doc[name] = v } }
        return doc
    }

    /// The canonical JSON text of `materialize(id:)`, written member by member in key order instead of through a
    /// dictionary (nil when the document does not exist).
    public func visibleText(id: String) -> String? {
        guard isAlive else { return nil }
        guard !hasPaths, fields["_id"] == nil else { return materialize(id: id).map { JSONValue.object($0).jsonText } }
        var out: [UInt8] = []
        out.reserveCapacity(64 + 32 * fields.count)
        out.append(UInt8(ascii: "{"))
        var idWritten = false
        func writeID() {
            if out.count > 1 { out.append(UInt8(ascii: ",")) }
            out.append(contentsOf: #""_id":"#.utf8)
            JSONValue.writeString(id, to: &out)
            idWritten = true
        }
        for i in fields.utf8OrderedIndices {
            guard let value = fields.values[i].value else { continue }
            let name = fields.keys[i]
            if !idWritten && utf8Less("_id", name) { writeID() }
            if out.count > 1 { out.append(UInt8(ascii: ",")) }
            JSONValue.writeString(name, to: &out)
            out.append(UInt8(ascii: ":"))
            value.write(to: &out)
        }
        if !idWritten { writeID() }
        out.append(UInt8(ascii: "}"))
        return String(decoding: out, as: UTF8.self)
    }
}
