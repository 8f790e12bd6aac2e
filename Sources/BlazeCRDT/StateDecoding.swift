// Reading stored document states straight from their text (the storage form `DocumentState.compactJSON` describes),
// without building the text's JSON tree first: every document a write or a received change touches is read this way.

import BlazeProtocol

extension DocumentState {
    /// Reads the compact text of a state with the materialized body it relies on (`nil` when the document is
    /// deleted): the state `init(compact:body:)` reads from the parsed text. Texts of any other shape are refused,
    /// including ones that reader tolerates (a part of the wrong type, a duplicate field).
    public init(compactText text: String, body: [String: JSONValue]?, _ coding: StampCoding = .hex) throws {
        var cl: Int64?
        var fields: [String: FieldState] = [:]
        var groups: [(stamp: Stamp, names: [String])] = []
        var common: Stamp?
        var unset: [String]?
        var selfContained = false
        var hasGroups = false
        try JSONReader.read(text, maxDepth: 10_000) { r in
            try r.beginObject()
            var seen = Members()
            while let key = try r.nextKey() {
                try seen.insert(key, r)
                switch key {
                case "l": cl = try r.int()
                case "f":
                    fields.reserveCapacity(body?.count ?? 4)
                    try r.beginObject()
                    while let name = try r.nextKey() {
                        guard fields[name] == nil else { throw r.error("duplicate field \"\(name)\"") }
                        fields[name] = try FieldState(reading: &r, coding)
                    }
                case "n":
                    _ = try r.value()
                    selfContained = true
                case "p":
                    hasGroups = true
                    try r.beginArray()
                    while try r.nextElement() {
                        try r.beginArray()
                        guard try r.nextElement() else { throw r.error("malformed plain-write group") }
                        let stamp = try Stamp(reading: &r, coding)
                        guard try r.nextElement() else { throw r.error("malformed plain-write group") }
                        let names = try Self.strings(&r)
                        guard try !r.nextElement() else { throw r.error("malformed plain-write group") }
                        groups.append((stamp, names))
                    }
                case "t": common = try Stamp(reading: &r, coding)
                case "u": unset = try Self.strings(&r)
                default: _ = try r.value()
                }
            }
        }
        guard let cl, cl >= 0, cl <= ChangeBounds.maxCausalLength else {
            throw CRDTDecodingError("malformed document state")
        }
        if selfContained {
            // Self-contained (nested fields): nothing is read from the body.
            guard !hasGroups, common == nil, unset == nil else { throw CRDTDecodingError("malformed document state") }
            self.init(cl: cl, fields: fields)
            return
        }
        for (stamp, names) in groups {
            for name in names { fields[name] = .plain(stamp, body?[name]) }
        }
        func plain(_ value: JSONValue?) throws(CRDTDecodingError) -> FieldState {
            guard let common else { throw CRDTDecodingError("field without state and no common stamp") }
            return .plain(common, value)
        }
        for name in unset ?? [] { fields[name] = try plain(nil) }
        for (name, value) in body ?? [:] where name != "_id" && fields[name] == nil { fields[name] = try plain(value) }
        self.init(cl: cl, fields: fields)
    }

    /// An array of strings.
    static func strings(_ r: inout JSONReader) throws -> [String] {
        var out: [String] = []
        try r.beginArray()
        while try r.nextElement() { out.append(try r.string()) }
        return out
    }
}

/// The keys of one object read so far, to refuse a duplicate as `JSONParser` does. The storage forms use one-letter
/// keys, kept in a bit set; other keys (an op's `set`, a newer writer's) in a short list, then a set, so that an
/// object of many keys from a peer costs linear time.
struct Members {
    private var letters: UInt64 = 0
    private var others: [String] = []
    private var many: Set<String> = []

    mutating func insert(_ key: String, _ r: JSONReader) throws(JSONParseError) {
        let utf8 = key.utf8
        if utf8.count == 1, let c = utf8.first, c >= UInt8(ascii: "a"), c <= UInt8(ascii: "z") {
            let bit: UInt64 = 1 << (c - UInt8(ascii: "a"))
            guard letters & bit == 0 else { throw r.error("duplicate object key \"\(key)\"") }
            letters |= bit
            return
        }
        if others.count < 8 {
            guard !others.contains(key) else { throw r.error("duplicate object key \"\(key)\"") }
            others.append(key)
            return
        }
        if many.isEmpty { many = Set(others) }
        guard many.insert(key).inserted else { throw r.error("duplicate object key \"\(key)\"") }
    }
}

extension FieldState {
    /// Reads a field's storage form (`jsonValue(coding)`'s text).
    init(reading r: inout JSONReader, _ coding: StampCoding) throws {
        var winner: FieldWrite?
        var rest = Rest()
        try r.beginObject()
        var seen = Members()
        while let key = try r.nextKey() {
            try seen.insert(key, r)
            switch key {
            case "w": winner = try FieldWrite(reading: &r, coding)
            case "c": rest.increments = try FieldTag.list(&r, coding)
            case "a": rest.additions = try FieldTag.list(&r, coding)
            case "r": rest.removedFromWinner = Set(try DocumentState.strings(&r))
            case "m": rest.lastSetOp = try Stamp(reading: &r, coding)
            case "x":
                try r.beginArray()
                while try r.nextElement() { rest.losers.append(try FieldWrite(reading: &r, coding)) }
            default: _ = try r.value()
            }
        }
        self.init(winner: winner, rest: rest)
    }
}

extension FieldWrite {
    /// Reads `[stamp]` (unset) or `[stamp, value]`.
    init(reading r: inout JSONReader, _ coding: StampCoding) throws {
        try r.beginArray()
        guard try r.nextElement() else { throw r.error("malformed field write") }
        let stamp = try Stamp(reading: &r, coding)
        guard try r.nextElement() else {
            self.init(stamp: stamp, value: nil)
            return
        }
        let value = try r.value()
        guard try !r.nextElement() else { throw r.error("malformed field write") }
        self.init(stamp: stamp, value: value)
    }
}

extension FieldTag {
    /// Reads an array of `[stamp, value]`.
    static func list(_ r: inout JSONReader, _ coding: StampCoding) throws -> [FieldTag] {
        var out: [FieldTag] = []
        try r.beginArray()
        while try r.nextElement() {
            try r.beginArray()
            guard try r.nextElement() else { throw r.error("malformed field tag") }
            let stamp = try Stamp(reading: &r, coding)
            guard try r.nextElement() else { throw r.error("malformed field tag") }
            let value = try r.value()
            guard try !r.nextElement() else { throw r.error("malformed field tag") }
            out.append(FieldTag(stamp: stamp, value: value))
        }
        return out
    }
}

extension Stamp {
    /// Reads `[hlc, origin, seq, index]`, the origin as hex or, for `coding`'s home, `0`.
    init(reading r: inout JSONReader, _ coding: StampCoding) throws {
        try r.beginArray()
        guard try r.nextElement() else { throw r.error("malformed stamp") }
        let h = try r.int()
        guard try r.nextElement() else { throw r.error("malformed stamp") }
        let origin: NodeID
        if r.peek() == UInt8(ascii: "\"") {
            guard let id = NodeID(hex: try r.string()) else { throw r.error("malformed stamp origin") }
            origin = id
        } else {
            guard try r.int() == 0, let home = coding.home else { throw r.error("malformed stamp origin") }
            origin = home
        }
        guard try r.nextElement() else { throw r.error("malformed stamp") }
        let s = try r.int()
        guard try r.nextElement() else { throw r.error("malformed stamp") }
        let i = try r.int()
        guard try !r.nextElement(), h >= 0, s > 0, UInt64(s) < SyncBounds.maxSeq, i >= 0 else {
            throw r.error("malformed stamp")
        }
        self.init(hlc: HLC(raw: UInt64(bitPattern: h)), origin: origin, seq: UInt64(s), index: Int(i))
    }
}
