import BlazeProtocol

extension DocumentState {
    /// Compact JSON form for storage: `{"l": cl, "f": {field: state}}`.
    public var jsonValue: JSONValue {
        ["l": .int(cl), "f": .object(fields.mapValues(\.jsonValue))]
    }

    /// Reads the storage form.
    public init(json: JSONValue) throws(CRDTDecodingError) {
        guard case .int(let cl)? = json["l"], case .object(let f)? = json["f"] else {
            throw CRDTDecodingError("malformed document state")
        }
        var fields: [String: FieldState] = [:]
        for (k, v) in f { fields[k] = try FieldState(json: v) }
        self.init(cl: cl, fields: fields)
    }
}

extension FieldWrite {
    var jsonValue: JSONValue { value.map { [stamp.jsonValue, $0] } ?? [stamp.jsonValue] }

    init(json: JSONValue) throws(CRDTDecodingError) {
        guard case .array(let a) = json, a.count == 1 || a.count == 2, let s = Stamp(json: a[0]) else {
            throw CRDTDecodingError("malformed field write")
        }
        self.init(stamp: s, value: a.count == 2 ? Optional(a[1]) : nil)
    }
}

extension FieldTag {
    var jsonValue: JSONValue { [stamp.jsonValue, value] }

    init(json: JSONValue) throws(CRDTDecodingError) {
        guard case .array(let a) = json, a.count == 2, let s = Stamp(json: a[0]) else {
            throw CRDTDecodingError("malformed field tag")
        }
        self.init(stamp: s, value: a[1])
    }
}

extension FieldState {
    /// Compact JSON form; empty parts are left out.
    public var jsonValue: JSONValue {
        var o: [String: JSONValue] = [:]
        if let w = winner { o["w"] = w.jsonValue }
        if !increments.isEmpty { o["c"] = .array(increments.map(\.jsonValue)) }
        if !additions.isEmpty { o["a"] = .array(additions.map(\.jsonValue)) }
        if !removedFromWinner.isEmpty { o["r"] = .array(removedFromWinner.sorted(by: utf8Less).map(JSONValue.string)) }
        if let m = lastSetOp { o["m"] = m.jsonValue }
        if !losers.isEmpty { o["x"] = .array(losers.map(\.jsonValue)) }
        return .object(o)
    }

    /// Reads the storage form.
    public init(json: JSONValue) throws(CRDTDecodingError) {
        self.init()
        if let w = json["w"] { winner = try FieldWrite(json: w) }
        for t in json["c"]?.arrayValue ?? [] { increments.append(try FieldTag(json: t)) }
        for t in json["a"]?.arrayValue ?? [] { additions.append(try FieldTag(json: t)) }
        removedFromWinner = Set((json["r"]?.arrayValue ?? []).compactMap(\.stringValue))
        if let m = json["m"] {
            guard let s = Stamp(json: m) else { throw CRDTDecodingError("malformed stamp") }
            lastSetOp = s
        }
        for l in json["x"]?.arrayValue ?? [] { losers.append(try FieldWrite(json: l)) }
    }
}
