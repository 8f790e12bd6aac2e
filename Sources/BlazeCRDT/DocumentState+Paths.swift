// Nested fields (Protocol/SYNC.md §2, "Nested fields"): dotted paths, and how a document's state applies and
// materializes edits addressed by path. The state itself is in DocumentState.swift.

import BlazeProtocol

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
