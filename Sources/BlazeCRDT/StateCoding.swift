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

    /// Writes `jsonValue(coding)`'s text without building it: members in the order a JSON object is written (UTF-8
    /// order of their one-letter names).
    public func write(to out: inout [UInt8], _ coding: StampCoding) {
        var first = true
        func member(_ name: Unicode.Scalar) {
            out.append(first ? UInt8(ascii: "{") : UInt8(ascii: ","))
            first = false
            out.append(UInt8(ascii: "\""))
            out.append(UInt8(ascii: name))
            out.append(contentsOf: "\":".utf8)
        }
        func tags(_ list: [FieldTag]) {
            out.append(UInt8(ascii: "["))
            for (i, t) in list.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                out.append(UInt8(ascii: "["))
                t.stamp.write(to: &out, coding)
                out.append(UInt8(ascii: ","))
                t.value.write(to: &out)
                out.append(UInt8(ascii: "]"))
            }
            out.append(UInt8(ascii: "]"))
        }
        func write(_ w: FieldWrite) {
            out.append(UInt8(ascii: "["))
            w.stamp.write(to: &out, coding)
            if let v = w.value {
                out.append(UInt8(ascii: ","))
                v.write(to: &out)
            }
            out.append(UInt8(ascii: "]"))
        }
        if !additions.isEmpty {
            member("a")
            tags(additions)
        }
        if !increments.isEmpty {
            member("c")
            tags(increments)
        }
        if let m = lastSetOp {
            member("m")
            m.write(to: &out, coding)
        }
        if !removedFromWinner.isEmpty {
            member("r")
            JSONValue.array(removedFromWinner.sorted(by: utf8Less).map(JSONValue.string)).write(to: &out)
        }
        if let w = winner {
            member("w")
            write(w)
        }
        if !losers.isEmpty {
            member("x")
            out.append(UInt8(ascii: "["))
            for (i, l) in losers.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                write(l)
            }
            out.append(UInt8(ascii: "]"))
        }
        out.append(contentsOf: (first ? "{}" : "}").utf8)
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
    /// The compact text of a state: `spelled` the fields not written at `common` alone, `unset` the names written
    /// absent at `common` (see `compactJSON`).
    /// `selfContained`: every field is in `spelled` with its values (`"n": 1`), none is read from the body.
    static func writeCompact(
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
                    m.state.write(to: &out, coding)
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
