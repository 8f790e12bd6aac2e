// Reading a change straight from its text (every change a peer sends is read this way), without building the text's
// JSON tree first. The members of the change and of each op are taken as values and checked as `init(json:)` checks
// them, so both accept the same changes; only a duplicate key is refused before that, as `JSONParser` refuses it.

import BlazeProtocol

extension Change {
    /// Reads a change from its UTF-8 text: the change `init(json:)` decodes from the parsed text, with `maxDepth` the
    /// parser's nesting limit.
    public init(text: [UInt8], maxDepth: Int) throws {
        var origin: JSONValue?
        var seq: JSONValue?
        var hlc: JSONValue?
        var deps: JSONValue?
        var ops: [CRDTOp]?
        try JSONReader.read(text, maxDepth: maxDepth) { r in
            try r.beginObject()
            var seen = Members()
            while let key = try r.nextKey() {
                try seen.insert(key, r)
                switch key {
                case "o": origin = try r.value()
                case "s": seq = try r.value()
                case "h": hlc = try r.value()
                case "d": deps = try r.value()
                case "x":
                    guard r.peek() == UInt8(ascii: "[") else { throw CRDTDecodingError("malformed change header") }
                    var list: [CRDTOp] = []
                    try r.beginArray()
                    while try r.nextElement() { list.append(try Self.readOp(&r)) }
                    ops = list
                default: _ = try r.value()
                }
            }
        }
        guard case .string(let o)? = origin, let origin = NodeID(hex: o), case .int(let s)? = seq, s > 0,
            case .int(let h)? = hlc, let deps, let deps = VersionVector(json: deps), let ops
        else { throw CRDTDecodingError("malformed change header") }
        self.init(origin: origin, seq: UInt64(s), hlc: HLC(raw: UInt64(bitPattern: h)), deps: deps, ops: ops)
    }

    /// Reads one op: its members as values, then `decodeOp`'s checks.
    private static func readOp(_ r: inout JSONReader) throws -> CRDTOp {
        guard r.peek() == UInt8(ascii: "{") else { throw CRDTDecodingError("malformed op") }
        var members = OpMembers()
        try r.beginObject()
        var seen = Members()
        while let key = try r.nextKey() {
            try seen.insert(key, r)
            members.set(key, try r.value())
        }
        return try decodeOp { members[$0] }
    }
}

/// The members of an op that `decodeOp` reads, in fixed slots (others are dropped, as a dictionary lookup ignores them).
private struct OpMembers {
    private var k, c, i, l, n, f, v, set, unset, incr, add, remove: JSONValue?

    mutating func set(_ key: String, _ value: JSONValue) {
        switch key {
        case "k": k = value
        case "c": c = value
        case "i": i = value
        case "l": l = value
        case "n": n = value
        case "f": f = value
        case "v": v = value
        case "set": set = value
        case "unset": unset = value
        case "incr": incr = value
        case "add": add = value
        case "remove": remove = value
        default: break
        }
    }

    subscript(key: String) -> JSONValue? {
        switch key {
        case "k": k
        case "c": c
        case "i": i
        case "l": l
        case "n": n
        case "f": f
        case "v": v
        case "set": set
        case "unset": unset
        case "incr": incr
        case "add": add
        case "remove": remove
        default: nil
        }
    }
}
