import BlazeProtocol

extension FieldWrite {
    func jsonValue(_ coding: StampCoding) -> JSONValue {
        value.map { [stamp.jsonValue(coding), $0] } ?? [stamp.jsonValue(coding)]
    }

    init(json: JSONValue, _ coding: StampCoding) throws(CRDTDecodingError) {
        guard case .array(let a) = json, a.count == 1 || a.count == 2, let s = Stamp(json: a[0], coding) else {
            throw CRDTDecodingError("malformed field write")
        }
        self.init(stamp: s, value: a.count == 2 ? Optional(a[1]) : nil)
    }
}

extension FieldTag {
    func jsonValue(_ coding: StampCoding) -> JSONValue { [stamp.jsonValue(coding), value] }

    init(json: JSONValue, _ coding: StampCoding) throws(CRDTDecodingError) {
        guard case .array(let a) = json, a.count == 2, let s = Stamp(json: a[0], coding) else {
            throw CRDTDecodingError("malformed field tag")
        }
        self.init(stamp: s, value: a[1])
    }
}

extension FieldState {
    /// Compact JSON form with hex origins; empty parts are left out.
    public var jsonValue: JSONValue { jsonValue(.hex) }

    /// Compact JSON form, origins as `coding` writes them; empty parts are left out.
    public func jsonValue(_ coding: StampCoding) -> JSONValue {
        var o: [String: JSONValue] = [:]
        if let w = winner { o["w"] = w.jsonValue(coding) }
        if !increments.isEmpty { o["c"] = .array(increments.map { $0.jsonValue(coding) }) }
        if !additions.isEmpty { o["a"] = .array(additions.map { $0.jsonValue(coding) }) }
        if !removedFromWinner.isEmpty { o["r"] = .array(removedFromWinner.sorted(by: utf8Less).map(JSONValue.string)) }
        if let m = lastSetOp { o["m"] = m.jsonValue(coding) }
        if !losers.isEmpty { o["x"] = .array(losers.map { $0.jsonValue(coding) }) }
        return .object(o)
    }

    /// Reads the storage form (home origins as `coding` reads them).
    public init(json: JSONValue, _ coding: StampCoding = .hex) throws(CRDTDecodingError) {
        self.init()
        if let w = json["w"] { winner = try FieldWrite(json: w, coding) }
        for t in json["c"]?.arrayValue ?? [] { increments.append(try FieldTag(json: t, coding)) }
        for t in json["a"]?.arrayValue ?? [] { additions.append(try FieldTag(json: t, coding)) }
        removedFromWinner = Set((json["r"]?.arrayValue ?? []).compactMap(\.stringValue))
        if let m = json["m"] {
            guard let s = Stamp(json: m, coding) else { throw CRDTDecodingError("malformed stamp") }
            lastSetOp = s
        }
        for l in json["x"]?.arrayValue ?? [] { losers.append(try FieldWrite(json: l, coding)) }
    }
}

extension DocumentState {
    private func isPlain(_ f: FieldState) -> Bool { f.isPlainWrite }

    /// The stamp most plain fields carry (ties: the smallest), nil when no field is plain.
    private var commonStamp: Stamp? {
        // Fast path, the usual state after an insert or a put: every field is a plain write with one stamp.
        var only: Stamp?
        var uniform = true
        for f in fields.values {
            guard isPlain(f), only == nil || only == f.winner!.stamp else {
                uniform = false
                break
            }
            only = f.winner!.stamp
        }
        if uniform { return only }
        // Few distinct stamps in practice (one per change that wrote the document): count them on the stack.
        return withUnsafeTemporaryAllocation(of: (stamp: Stamp, count: Int).self, capacity: fields.count) { counts in
            var n = 0
            for f in fields.values {
                guard f.isPlainWrite, let s = f.winner?.stamp else { continue }
                var i = 0
                while i < n && counts[i].stamp != s { i += 1 }
                if i < n { counts[i].count += 1 } else { (counts.baseAddress! + n).initialize(to: (s, 1)); n += 1 }
            }
            return counts[..<n].max { a, b in a.count != b.count ? a.count < b.count : b.stamp < a.stamp }?.stamp
        }
    }

    /// `compactJSON.jsonText`, written directly.
    public var compactText: String { compactText(.hex) }

    /// `compactJSON(coding).jsonText`, written directly.
    public func compactText(_ coding: StampCoding) -> String {
        if hasPaths {
            return Self.writeCompact(
                cl: cl, spelled: fields.map { ($0.key, $0.value) }, common: nil, unset: [], selfContained: true, coding)
        }
        let common = commonStamp
        var full: [(name: String, state: FieldState)] = []
        var unset: [String] = []
        for (name, f) in fields {
            if let common, isPlain(f), f.winner!.stamp == common {
                if f.winner!.value == nil { unset.append(name) }
            } else {
                full.append((name, f))
            }
        }
        return Self.writeCompact(cl: cl, spelled: full, common: common, unset: unset, coding)
    }

    /// Storage form that leans on the materialized document stored next to it.
    ///
    /// Fields whose state is just a write with the document's most common stamp are not spelled out: `t` holds that
    /// stamp, `u` lists such fields that were unset, and the values of the others are read back from the
    /// materialized body. After a plain insert the state is `{"l": cl, "t": stamp}`. In a live document, the other
    /// plain writes are grouped by stamp, `p: [[stamp, [names]]]`, their values read from the body too (a name the
    /// body lacks was unset); the rest are spelled out in `f`. A state with nested fields (whose values the body
    /// holds only inside their objects) spells every field out in `f`, and says so with `"n": 1`.
    public var compactJSON: JSONValue { compactJSON(.hex) }

    /// `compactJSON`, origins as `coding` writes them.
    public func compactJSON(_ coding: StampCoding) -> JSONValue {
        var o: [String: JSONValue] = ["l": .int(cl)]
        if hasPaths {
            o["f"] = .object(fields.mapValues { $0.jsonValue(coding) })
            o["n"] = 1
            return .object(o)
        }
        let common = commonStamp
        var full: [String: JSONValue] = [:]
        var unset: [String] = []
        var groups: [Stamp: [String]] = [:]
        for (name, f) in fields {
            if let common, isPlain(f), f.winner!.stamp == common {
                if f.winner!.value == nil { unset.append(name) }
            } else if cl % 2 == 1, isPlain(f) {
                groups[f.winner!.stamp, default: []].append(name)
            } else {
                full[name] = f.jsonValue(coding)
            }
        }
        if let common { o["t"] = common.jsonValue(coding) }
        if !unset.isEmpty { o["u"] = .array(unset.sorted(by: utf8Less).map(JSONValue.string)) }
        if !full.isEmpty { o["f"] = .object(full) }
        if !groups.isEmpty {
            o["p"] = .array(
                groups.sorted { $0.key < $1.key }.map { [$0.key.jsonValue(coding), .array($0.value.sorted(by: utf8Less).map(JSONValue.string))] })
        }
        return .object(o)
    }

    /// Reads the compact form together with the materialized body (`nil` when the document is deleted).
    public init(
        compact json: JSONValue, body: [String: JSONValue]?, _ coding: StampCoding = .hex
    ) throws(CRDTDecodingError) {
        guard case .int(let cl)? = json["l"], cl >= 0, cl <= ChangeBounds.maxCausalLength else {
            throw CRDTDecodingError("malformed document state")
        }
        var fields = [String: FieldState](minimumCapacity: body?.count ?? 0)
        for (k, v) in json["f"]?.objectValue ?? [:] { fields[k] = try FieldState(json: v, coding) }
        if json["n"] != nil {
            // Self-contained (nested fields): nothing is read from the body.
            guard json["p"] == nil, json["t"] == nil, json["u"] == nil else {
                throw CRDTDecodingError("malformed document state")
            }
            self.init(cl: cl, fields: fields)
            return
        }
        for group in json["p"]?.arrayValue ?? [] {
            guard case .array(let g) = group, g.count == 2, let s = Stamp(json: g[0], coding), case .array(let names) = g[1]
            else { throw CRDTDecodingError("malformed plain-write group") }
            for case .string(let name) in names { fields[name] = .plain(s, body?[name]) }
        }
        let common: Stamp?
        if let t = json["t"] {
            guard let s = Stamp(json: t, coding) else { throw CRDTDecodingError("malformed stamp") }
            common = s
        } else {
            common = nil
        }
        func plain(_ value: JSONValue?) throws(CRDTDecodingError) -> FieldState {
            guard let common else { throw CRDTDecodingError("field without state and no common stamp") }
            return .plain(common, value)
        }
        for name in json["u"]?.arrayValue?.compactMap(\.stringValue) ?? [] { fields[name] = try plain(nil) }
        for (name, value) in body ?? [:] where name != "_id" && fields[name] == nil { fields[name] = try plain(value) }
        self.init(cl: cl, fields: fields)
    }
}

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

    /// The compact text of a state: `spelled` the fields not written at `common` alone, `unset` the names written
    /// absent at `common` (see `compactJSON`).
    /// `selfContained`: every field is in `spelled` with its values (`"n": 1`), none is read from the body.
    private static func writeCompact(
        cl: Int64, spelled: [(name: String, state: FieldState)], common: Stamp?, unset: [String],
        selfContained: Bool = false, _ coding: StampCoding
    ) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(64 + 96 * spelled.count)
        out.append(UInt8(ascii: "{"))
        // A live document's plain writes take their values from its body: only their stamps are written, grouped.
        var groups: [(stamp: Stamp, names: [String])] = []
        var spelled = spelled
        if cl % 2 == 1 && !selfContained {
            spelled.removeAll { m in
                guard m.state.isPlainWrite, let s = m.state.winner?.stamp else { return false }
                if let i = groups.firstIndex(where: { $0.stamp == s }) { groups[i].names.append(m.name) } else { groups.append((s, [m.name])) }
                return true
            }
        }
        if !spelled.isEmpty {
            out.append(contentsOf: #""f":{"#.utf8)
            for (i, m) in spelled.sorted(by: { utf8Less($0.name, $1.name) }).enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSONValue.writeString(m.name, to: &out)
                out.append(UInt8(ascii: ":"))
                if m.state.isPlainWrite, let w = m.state.winner {
                    // `{"w":[stamp]}` or `{"w":[stamp,value]}`, as `jsonValue` writes it.
                    out.append(contentsOf: #"{"w":["#.utf8)
                    w.stamp.write(to: &out, coding)
                    if let v = w.value {
                        out.append(UInt8(ascii: ","))
                        v.write(to: &out)
                    }
                    out.append(contentsOf: "]}".utf8)
                } else {
                    m.state.jsonValue(coding).write(to: &out)
                }
            }
            out.append(contentsOf: "},".utf8)
        }
        out.append(contentsOf: #""l":"#.utf8)
        JSONValue.writeInt(cl, to: &out)
        if selfContained { out.append(contentsOf: #","n":1"#.utf8) }
        if !groups.isEmpty {
            out.append(contentsOf: #","p":["#.utf8)
            for (i, g) in groups.sorted(by: { $0.stamp < $1.stamp }).enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                out.append(UInt8(ascii: "["))
                g.stamp.write(to: &out, coding)
                out.append(contentsOf: ",[".utf8)
                for (k, name) in g.names.sorted(by: utf8Less).enumerated() {
                    if k > 0 { out.append(UInt8(ascii: ",")) }
                    JSONValue.writeString(name, to: &out)
                }
                out.append(contentsOf: "]]".utf8)
            }
            out.append(UInt8(ascii: "]"))
        }
        if let common {
            out.append(contentsOf: #","t":"#.utf8)
            common.write(to: &out, coding)
        }
        if !unset.isEmpty {
            out.append(contentsOf: #","u":["#.utf8)
            for (i, name) in unset.sorted(by: utf8Less).enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSONValue.writeString(name, to: &out)
            }
            out.append(UInt8(ascii: "]"))
        }
        out.append(UInt8(ascii: "}"))
        return String(decoding: out, as: UTF8.self)
    }
}
