import BlazeProtocol

/// A write of a field: a value, or nil for "absent" (unset).
public struct FieldWrite: Hashable, Sendable {
    /// When and by which operation.
    public let stamp: Stamp
    /// The value written; nil for unset.
    public let value: JSONValue?
}

/// A counter increment or a set addition kept on top of the field's winning write.
public struct FieldTag: Hashable, Sendable {
    /// When and by which operation.
    public let stamp: Stamp
    /// The delta (counters) or the element (sets).
    public let value: JSONValue
}

/// The replicated state of one top-level field at the document's current causal length.
public struct FieldState: Hashable, Sendable {
    /// The winning LWW write (largest stamp); nil when only counter/set operations touched the field.
    public var winner: FieldWrite?
    /// Everything besides the winner, out of line (one heap box) and nil when all of it is empty. Most fields are a
    /// plain write, and field states are copied whenever a document's fields are iterated: the box keeps that copy
    /// to two references.
    private var boxed: Boxed?

    /// The heap box of `rest`.
    indirect enum Boxed: Hashable, Sendable {
        case rest(Rest)

        var value: Rest {
            switch self {
            case .rest(let r): return r
            }
        }
    }

    /// The parts other than the winner; nil when all are empty.
    var rest: Rest? { boxed?.value }

    /// The parts of a field state other than its winner.
    struct Rest: Hashable, Sendable {
        var increments: [FieldTag] = []
        var additions: [FieldTag] = []
        var removedFromWinner: Set<String> = []
        var lastSetOp: Stamp?
        var losers: [FieldWrite] = []

        var isEmpty: Bool {
            increments.isEmpty && additions.isEmpty && removedFromWinner.isEmpty && lastSetOp == nil && losers.isEmpty
        }
    }

    /// Increments with stamps after the winner, in stamp order.
    public var increments: [FieldTag] {
        get { rest?.increments ?? [] }
        set { update { $0.increments = newValue } }
    }
    /// Set additions after the winner that no observing removal has removed, in stamp order.
    public var additions: [FieldTag] {
        get { rest?.additions ?? [] }
        set { update { $0.additions = newValue } }
    }
    /// Canonical texts of elements removed from the winner's array by removals that observed the winner.
    public var removedFromWinner: Set<String> {
        get { rest?.removedFromWinner ?? [] }
        set { update { $0.removedFromWinner = newValue } }
    }
    /// The latest set operation's stamp, if after the winner: the field is then shown as a set.
    public var lastSetOp: Stamp? {
        get { rest?.lastSetOp }
        set { update { $0.lastSetOp = newValue } }
    }
    /// Concurrent writes that lost to the winner and that no later write has observed, in stamp order.
    public var losers: [FieldWrite] {
        get { rest?.losers ?? [] }
        set { update { $0.losers = newValue } }
    }

    /// Edits `rest` in place (its storage is released first, so `edit` mutates uniquely referenced arrays).
    private mutating func update(_ edit: (inout Rest) -> Void) {
        var r = boxed?.value ?? Rest()
        boxed = nil
        edit(&r)
        boxed = r.isEmpty ? nil : .rest(r)
    }

    /// Creates an empty field state.
    public init() {}

    /// A field that is one LWW write of `value` (nil: unset) at `stamp`.
    static func plain(_ stamp: Stamp, _ value: JSONValue?) -> FieldState {
        var f = FieldState()
        f.winner = FieldWrite(stamp: stamp, value: value)
        return f
    }

    /// True when the field is a plain LWW write with nothing else.
    var isPlainWrite: Bool { winner != nil && boxed == nil }

    var isEmpty: Bool { winner == nil && boxed == nil }

    mutating func write(_ w: FieldWrite, in change: Change, at index: Int) {
        if boxed != nil { losers.removeAll { change.observes($0.stamp.dot, at: index) } }
        guard let current = winner, w.stamp < current.stamp else {
            if let old = winner, !change.observes(old.stamp.dot, at: index) { insertLoser(old) }
            winner = w
            if boxed != nil {
                removedFromWinner = []
                increments.removeAll { $0.stamp < w.stamp }
                additions.removeAll { $0.stamp < w.stamp }
                if let s = lastSetOp, s < w.stamp { lastSetOp = nil }
            }
            return
        }
        // Under causal delivery the winner cannot have observed `w`, so `w` lost to a concurrent write.
        insertLoser(w)
    }

    private mutating func insertLoser(_ w: FieldWrite) {
        let at = losers.firstIndex { w.stamp < $0.stamp } ?? losers.count
        losers.insert(w, at: at)
    }

    private func isAfterWinner(_ stamp: Stamp) -> Bool { winner.map { $0.stamp < stamp } ?? true }

    mutating func increment(_ delta: JSONValue, stamp: Stamp) {
        guard isAfterWinner(stamp) else { return }
        insertTag(FieldTag(stamp: stamp, value: delta), into: &increments)
    }

    mutating func add(_ element: JSONValue, stamp: Stamp) {
        guard isAfterWinner(stamp) else { return }
        insertTag(FieldTag(stamp: stamp, value: element), into: &additions)
        if lastSetOp.map({ $0 < stamp }) ?? true { lastSetOp = stamp }
    }

    /// Applies a set removal. `inherited` is the write of an enclosing object that shows through a nested field
    /// without a write of its own (its stamp, and its value at this field's path).
    mutating func remove(
        _ element: JSONValue, stamp: Stamp, in change: Change, at index: Int, inherited: FieldWrite? = nil
    ) {
        let text = element.jsonText
        additions.removeAll { $0.value.jsonText == text && change.observes($0.stamp.dot, at: index) }
        if let w = winner ?? inherited, change.observes(w.stamp.dot, at: index), case .array(let items)? = w.value,
            items.contains(where: { $0.jsonText == text })
        {
            removedFromWinner.insert(text)
        }
        if isAfterWinner(stamp), lastSetOp.map({ $0 < stamp }) ?? true { lastSetOp = stamp }
    }

    private func insertTag(_ tag: FieldTag, into tags: inout [FieldTag]) {
        if tags.contains(where: { $0.stamp == tag.stamp && $0.value == tag.value }) { return }
        let at = tags.firstIndex { tag.stamp < $0.stamp } ?? tags.count
        tags.insert(tag, at: at)
    }

    /// Drops every part older than `stamp`: a write of an enclosing object at `stamp` hides them (SYNC.md §2,
    /// "Nested fields"). Hidden set elements refer to the write the field showed, so they go unless the field's own
    /// winner stays.
    mutating func drop(before stamp: Stamp) {
        if let w = winner, w.stamp < stamp {
            winner = nil
            if boxed != nil { removedFromWinner = [] }
        } else if winner == nil, boxed != nil {
            removedFromWinner = []
        }
        guard boxed != nil else { return }
        increments.removeAll { $0.stamp < stamp }
        additions.removeAll { $0.stamp < stamp }
        if let s = lastSetOp, s < stamp { lastSetOp = nil }
        losers.removeAll { $0.stamp < stamp }
    }

    /// The field's value, or nil when absent (see Protocol/SYNC.md, "Materialization").
    public var value: JSONValue? { value(inherited: nil) }

    /// The field's value when a nested field without a write of its own shows `inherited` (the value at its path in
    /// the enclosing object's write) as its base.
    public func value(inherited: JSONValue?) -> JSONValue? {
        let base = winner != nil ? winner!.value : inherited
        guard boxed != nil else { return base }
        if lastSetOp != nil || !additions.isEmpty || !removedFromWinner.isEmpty {
            var elements: [String: JSONValue] = [:]
            if case .array(let items)? = base {
                for item in items where !removedFromWinner.contains(item.jsonText) { elements[item.jsonText] = item }
            }
            for tag in additions { elements[tag.value.jsonText] = tag.value }
            return .array(elements.values.sorted { a, b in
                let c = TypeRank.compare(a, b)
                return c != 0 ? c < 0 : utf8Less(a.jsonText, b.jsonText)
            })
        }
        if !increments.isEmpty {
            var sum = CounterSum(start: base)
            for tag in increments { sum.add(tag.value) }
            return sum.value
        }
        return base
    }
}

/// Sums counter deltas in stamp order: integers stay integers until a double or an overflow appears.
struct CounterSum {
    var int: Int64?
    var double: Double

    init(start: JSONValue?) {
        switch start {
        case .int(let i)?: int = i; double = Double(i)
        case .double(let d)?: int = nil; double = d
        default: int = 0; double = 0
        }
    }

    mutating func add(_ delta: JSONValue) {
        switch delta {
        case .int(let d):
            if let i = int {
                let (r, overflow) = i.addingReportingOverflow(d)
                if overflow { int = nil; double = Double(i) + Double(d) } else { int = r; double = Double(r) }
            } else {
                double += Double(d)
            }
        case .double(let d):
            if let i = int { double = Double(i) }
            int = nil
            double += d
        default: break
        }
    }

    var value: JSONValue { int.map(JSONValue.int) ?? .double(double) }
}

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
        /// The change: its origin, sequence and clock.
        public let origin: NodeID
        public let seq: UInt64
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
}

/// Dotted field paths (`address.city`): a state keys nested fields by their path (field names hold no `.`).
public enum NestedPath {
    /// True when `name` is the path of a nested field rather than a top-level name.
    @inlinable
    public static func isNested(_ name: String) -> Bool { name.utf8.contains(UInt8(ascii: ".")) }

    /// The paths of `path`'s enclosing objects, outermost first (`a.b.c`: `a`, `a.b`).
    public static func ancestors(_ path: String) -> [String] {
        var out: [String] = []
        let utf8 = path.utf8
        var i = utf8.startIndex
        while i != utf8.endIndex {
            if utf8[i] == UInt8(ascii: ".") { out.append(String(path[..<i])) }
            i = utf8.index(after: i)
        }
        return out
    }

    /// True when `path` lies inside the object at `ancestor` (`a.b` inside `a`, not `ab`).
    static func isInside(_ path: String, _ ancestor: String) -> Bool {
        let (p, a) = (path.utf8, ancestor.utf8)
        guard p.count > a.count, p.starts(with: a) else { return false }
        return p[p.index(p.startIndex, offsetBy: a.count)] == UInt8(ascii: ".")
    }

    /// The segments of `path` after its first `count` ones.
    static func segments(of path: String, droppingFirst count: Int) -> ArraySlice<Substring> {
        path.split(separator: ".", omittingEmptySubsequences: false).dropFirst(count)
    }
}

extension DocOp {
    /// True when the op only writes top-level fields (none named `_id`) at causal length 1: on a document never seen,
    /// `DocumentState.apply` makes of it `DocumentState.created(fields: set, stamp:)`.
    public var isPlainCreation: Bool {
        cl == 1 && unset.isEmpty && incr.isEmpty && add.isEmpty && remove.isEmpty && self.set["_id"] == nil
            && !self.set.keys.contains(where: NestedPath.isNested)
    }

    /// True when some edit addresses a nested field by its path.
    public var hasPaths: Bool {
        self.set.keys.contains(where: NestedPath.isNested) || unset.contains(where: NestedPath.isNested)
            || incr.keys.contains(where: NestedPath.isNested) || add.keys.contains(where: NestedPath.isNested)
            || remove.keys.contains(where: NestedPath.isNested)
    }
}

extension DocumentState {
    /// True when some field state is a nested field's.
    public var hasPaths: Bool { fields.keys.contains(where: NestedPath.isNested) }

    /// The largest stamp of a write to an object enclosing `path`: parts of `path` older than it are hidden.
    func cover(_ path: String) -> Stamp? {
        var out: Stamp?
        for a in NestedPath.ancestors(path) {
            if let s = fields[a]?.winner?.stamp, out.map({ $0 < s }) ?? true { out = s }
        }
        return out
    }

    /// The write a nested field shows through when it has none of its own: the innermost enclosing write, its value
    /// taken at `path` (nil where that value has no such member).
    func inheritedWrite(_ path: String) -> FieldWrite? {
        let ancestors = NestedPath.ancestors(path)
        for (depth, a) in ancestors.enumerated().reversed() {
            guard let w = fields[a]?.winner else { continue }
            var value = w.value
            for segment in NestedPath.segments(of: path, droppingFirst: depth + 1) {
                value = value?.objectValue?[String(segment)]
            }
            return FieldWrite(stamp: w.stamp, value: value)
        }
        return nil
    }

    /// Applies an op to a state where nested paths are involved (SYNC.md §2, "Nested fields"): a write to a path
    /// hides everything older inside it, and an edit older than a write enclosing its path is hidden at once, so the
    /// state holds no part older than the writes around it, whatever the order concurrent ops arrive in.
    mutating func applyWithPaths(_ op: DocOp, change: Change, index: Int, stamp: Stamp) {
        func hidden(_ name: String) -> Bool { cover(name).map { stamp < $0 } ?? false }
        func write(_ name: String, _ value: JSONValue?) {
            guard !hidden(name) else { return }
            fields[name, default: FieldState()].write(FieldWrite(stamp: stamp, value: value), in: change, at: index)
            guard let s = fields[name]?.winner?.stamp else { return }
            for key in fields.keys where NestedPath.isInside(key, name) { fields[key]!.drop(before: s) }
        }
        for (name, value) in op.set { write(name, value) }
        for name in op.unset { write(name, nil) }
        for (name, delta) in op.incr where !hidden(name) { fields[name, default: FieldState()].increment(delta, stamp: stamp) }
        for (name, elements) in op.add where !hidden(name) {
            for e in elements { fields[name, default: FieldState()].add(e, stamp: stamp) }
        }
        for (name, elements) in op.remove where !hidden(name) {
            let inherited = fields[name]?.winner == nil ? inheritedWrite(name) : nil
            for e in elements {
                fields[name, default: FieldState()].remove(e, stamp: stamp, in: change, at: index, inherited: inherited)
            }
        }
        if fields.values.contains(where: \.isEmpty) { fields = fields.filter { !$0.value.isEmpty } }
    }

    /// The top-level values of a state with nested fields: each object built from its own write (or the one it shows
    /// through) with its nested fields' values on top. A nested field that has a value makes its enclosing path an
    /// object (replacing a non-object written earlier); one that is absent removes its member.
    func valuesWithPaths() -> [String: JSONValue] {
        // Each path's direct children, the root's under "" (paths with no state of their own included).
        var children: [String: [String]] = [:]
        var known: Set<String> = []
        for name in fields.keys {
            var path = name
            while known.insert(path).inserted {
                let parent = NestedPath.ancestors(path).last ?? ""
                children[parent, default: []].append(path)
                if parent.isEmpty { break }
                path = parent
            }
        }
        func value(_ path: String, inherited: JSONValue?) -> JSONValue? {
            let base = fields[path].map { $0.value(inherited: inherited) } ?? inherited
            guard let kids = children[path] else { return base }
            var members = base?.objectValue
            for kid in kids {
                let segment = String(decoding: kid.utf8.dropFirst(path.utf8.count + 1), as: UTF8.self)
                if let v = value(kid, inherited: members?[segment]) {
                    members = members ?? [:]
                    members![segment] = v
                } else {
                    members?[segment] = nil
                }
            }
            return members.map(JSONValue.object) ?? base
        }
        var out: [String: JSONValue] = [:]
        for top in children[""] ?? [] { out[top] = value(top, inherited: nil) }
        return out
    }
}
