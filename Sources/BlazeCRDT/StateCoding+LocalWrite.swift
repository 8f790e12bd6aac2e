import BlazeProtocol

extension DocumentState {
    /// The compact text (`compactText`) of a live document's state after one local operation at `stamp` writes the
    /// top-level fields in `writes` (a value, or nil for unset), computed from the stored compact form and body
    /// without decoding field states.
    ///
    /// Nil when this shortcut does not apply and the caller must take the general path (`DocumentState.apply`): the
    /// document is not alive, a field holds more than one plain write (counter, set, conflict), or some stamp in the
    /// state is not before `stamp`. Valid only for an operation that observes every write in the state, as every
    /// local operation does: its writes then replace each written field's state with a plain write at `stamp`.
    ///
    /// `fieldCount` is the number of the stored body's members other than `_id`, `hasField` tells whether one of them
    /// has a name (queried for the few written and spelled-out names only); `body` gives its members (with or without
    /// `_id`) and is called only when the common stamp changes.
    public static func compactTextAfterLocalWrite(
        compact: JSONValue, fieldCount: Int, hasField: (String) -> Bool, body: () -> [String: JSONValue]?,
        writes: [String: JSONValue?], stamp: Stamp, _ coding: StampCoding = .hex
    ) -> String? {
        guard case .object(let o) = compact, case .int(let cl)? = o["l"], cl % 2 == 1, o["n"] == nil,
            !writes.keys.contains(where: NestedPath.isNested)
        else { return nil }
        var common: Stamp?
        if let t = o["t"] {
            guard let s = Stamp(json: t, coding), s < stamp else { return nil }
            common = s
        }
        // The spelled-out fields (few): every other field is implicit, at the common stamp (the body's other
        // members, and the unset names).
        var spelled = [String: (stamp: Stamp, value: JSONValue?)]()
        // Plain writes grouped by stamp (`p`) hold their values in the body: read from it only if needed below.
        var inBody = Set<String>()
        for group in o["p"]?.arrayValue ?? [] {
            guard case .array(let g) = group, g.count == 2, let s = Stamp(json: g[0], coding), s < stamp,
                case .array(let names) = g[1]
            else { return nil }
            for case .string(let name) in names {
                spelled[name] = (s, nil)
                inBody.insert(name)
            }
        }
        if let f = o["f"] {
            guard case .object(let entries) = f else { return nil }
            for (name, state) in entries {
                guard case .object(let parts) = state, parts.count == 1, case .array(let w)? = parts["w"],
                    w.count == 1 || w.count == 2, let s = Stamp(json: w[0], coding), s < stamp
                else { return nil }
                spelled[name] = (s, w.count == 2 ? w[1] : nil)
            }
        }
        var unsetNames: [String] = []
        if case .array(let names)? = o["u"] {
            for case .string(let name) in names { unsetNames.append(name) }
        }
        // The usual case, decided by counting alone: the common stamp stays the most common one, so only the written
        // fields change form (they become spelled out at `stamp`), and the body's values are not needed.
        if let common {
            var implicit = fieldCount + unsetNames.count
            for name in spelled.keys where hasField(name) { implicit -= 1 }
            var others: [(stamp: Stamp, count: Int)] = []
            for (name, f) in spelled where writes[name] == nil {
                if let i = others.firstIndex(where: { $0.stamp == f.stamp }) { others[i].count += 1 } else { others.append((f.stamp, 1)) }
            }
            for name in writes.keys where spelled[name] == nil && (hasField(name) || unsetNames.contains(name)) {
                implicit -= 1
            }
            // Whether `count` fields at stamp `s` would outrank the common stamp's (ties go to the smaller stamp).
            let beats = { (count: Int, s: Stamp) in count > implicit || (count == implicit && s < common) }
            if implicit > 0, !beats(writes.count, stamp), !others.contains(where: { beats($0.count, $0.stamp) }) {
                var out = spelled.filter { writes[$0.key] == nil }
                for (name, value) in writes { out[name] = (stamp, value) }
                return writeCompact(
                    cl: cl, spelled: out.map { ($0.key, .plain($0.value.stamp, $0.value.value)) }, common: common,
                    unset: unsetNames.filter { writes[$0] == nil }, coding)
            }
        }
        // Otherwise every field as (stamp, value), read the way `init(compact:body:)` reads them.
        guard let body = body() else { return nil }
        var fields = [String: (stamp: Stamp, value: JSONValue?)](minimumCapacity: body.count + writes.count)
        for (name, f) in spelled { fields[name] = inBody.contains(name) ? (f.stamp, body[name]) : f }
        for name in unsetNames {
            guard let common else { return nil }
            fields[name] = (common, nil)
        }
        for (name, value) in body where name != "_id" && fields[name] == nil {
            guard let common else { return nil }
            fields[name] = (common, value)
        }
        for (name, value) in writes { fields[name] = (stamp, value) }

        // The new common stamp: the one most fields carry, ties to the smallest (as `commonStamp`).
        var counts: [(stamp: Stamp, count: Int)] = []
        for f in fields.values {
            if let i = counts.firstIndex(where: { $0.stamp == f.stamp }) { counts[i].count += 1 } else { counts.append((f.stamp, 1)) }
        }
        let newCommon = counts.max { a, b in a.count != b.count ? a.count < b.count : b.stamp < a.stamp }?.stamp
        var out: [(name: String, state: FieldState)] = []
        var unset: [String] = []
        for (name, f) in fields {
            if f.stamp == newCommon {
                if f.value == nil { unset.append(name) }
            } else {
                out.append((name, .plain(f.stamp, f.value)))
            }
        }
        return writeCompact(cl: cl, spelled: out, common: newCommon, unset: unset, coding)
    }
}
