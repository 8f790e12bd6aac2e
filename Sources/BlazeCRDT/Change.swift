import BlazeProtocol

/// Why a change or document state could not be decoded.
public struct CRDTDecodingError: Error, Sendable, CustomStringConvertible {
    /// What was malformed.
    public var description: String

    init(_ description: String) { self.description = description }
}

/// A document addressed by collection and id.
///
/// Keys are equal when their UTF-8 bytes are, as the rows SQLite stores them under are (`String`'s `==` would make
/// canonically equivalent ids, such as "é" composed and decomposed, one key). The hash is computed once, at
/// creation: a write hashes the same key several times.
public struct DocKey: Hashable, Sendable, Comparable {
    /// Collection name.
    public let collection: String
    /// Document id.
    public let id: String
    /// The hash of both names' bytes.
    private let hash: Int

    /// Creates a key.
    public init(collection: String, id: String) {
        self.collection = collection
        self.id = id
        var hasher = Hasher()
        Self.combine(collection, into: &hasher)
        // 0xFF never occurs in UTF-8: the two names cannot run into each other.
        hasher.combine(UInt8(0xFF))
        Self.combine(id, into: &hasher)
        hash = hasher.finalize()
    }

    private static func combine(_ name: String, into hasher: inout Hasher) {
        var name = name
        name.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
    }

    /// Equal when both names have the same bytes.
    public static func == (a: DocKey, b: DocKey) -> Bool {
        a.hash == b.hash && utf8Equal(a.id, b.id) && utf8Equal(a.collection, b.collection)
    }

    /// Feeds the precomputed hash.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(hash)
    }

    /// Orders by collection then id, both by UTF-8 bytes.
    public static func < (a: DocKey, b: DocKey) -> Bool {
        a.collection != b.collection ? utf8Less(a.collection, b.collection) : utf8Less(a.id, b.id)
    }
}

/// Field-level edits of one document at a causal length (see Protocol/SYNC.md).
public struct DocOp: Hashable, Sendable {
    /// The document.
    public var key: DocKey
    /// The causal length the author saw (odd: alive).
    public var cl: Int64
    /// LWW writes of values.
    public var set: [String: JSONValue] = [:]
    /// LWW writes of "absent".
    public var unset: [String] = []
    /// Counter increments (numbers).
    public var incr: [String: JSONValue] = [:]
    /// OR-set additions.
    public var add: [String: [JSONValue]] = [:]
    /// OR-set removals of observed additions.
    public var remove: [String: [JSONValue]] = [:]

    /// Creates an op.
    public init(
        key: DocKey, cl: Int64, set: [String: JSONValue] = [:], unset: [String] = [], incr: [String: JSONValue] = [:],
        add: [String: [JSONValue]] = [:], remove: [String: [JSONValue]] = [:]
    ) {
        self.key = key
        self.cl = cl
        self.set = set
        self.unset = unset
        self.incr = incr
        self.add = add
        self.remove = remove
    }
}

/// One operation of a change.
public enum CRDTOp: Hashable, Sendable {
    /// Field edits of a document.
    case doc(DocOp)
    /// Deletes a document: raises its causal length to the given even value.
    case delete(DocKey, cl: Int64)
    /// Defines (fields non-nil) or drops (nil) a user index; last writer wins per name. `vector` makes it a vector
    /// index (one field).
    case index(name: String, collection: String, fields: [String]?, vector: IndexVector? = nil)
}

/// A change: one local write transaction, the unit of replication (ARCHITECTURE.md, "Changes and the CRDT").
public struct Change: Hashable, Sendable {
    /// The author.
    public let origin: NodeID
    /// Contiguous per origin, from 1.
    public let seq: UInt64
    /// The author's clock for this change.
    public let hlc: HLC
    /// The author's version vector before this change.
    public let deps: VersionVector
    /// The operations, in order.
    public let ops: [CRDTOp]

    /// Creates a change.
    public init(origin: NodeID, seq: UInt64, hlc: HLC, deps: VersionVector, ops: [CRDTOp]) {
        self.origin = origin
        self.seq = seq
        self.hlc = hlc
        self.deps = deps
        self.ops = ops
    }

    /// True when the operation `dot` is visible to operation `index` of this change: an earlier change it depends
    /// on, or an earlier operation of this same change.
    public func observes(_ dot: Dot, at index: Int) -> Bool {
        if dot.origin == origin && dot.seq == seq { return dot.index < index }
        return deps[dot.origin] >= dot.seq
    }

    /// Stamp of operation `index`.
    public func stamp(_ index: Int) -> Stamp { Stamp(hlc: hlc, origin: origin, seq: seq, index: index) }

    /// The canonical JSON form (the body stored in the op log and sealed for sync).
    public var jsonValue: JSONValue {
        [
            "o": .string(origin.hex), "s": .int(Int64(seq)), "h": .int(Int64(bitPattern: hlc.raw)),
            "d": deps.jsonValue, "x": .array(ops.map(Self.encode)),
        ]
    }

    /// Appends the canonical JSON of one operation (as it appears in `jsonValue`) to `out`.
    public static func writeOp(_ op: CRDTOp, to out: inout [UInt8]) {
        guard case .doc(let d) = op else {
            encode(op).write(to: &out)
            return
        }
        // The members of `encode`'s object, written in their key order without building it.
        out.append(UInt8(ascii: "{"))
        if !d.add.isEmpty {
            out.append(contentsOf: #""add":"#.utf8)
            JSONValue.object(d.add.mapValues(JSONValue.array)).write(to: &out)
            out.append(UInt8(ascii: ","))
        }
        out.append(contentsOf: #""c":"#.utf8)
        JSONValue.writeString(d.key.collection, to: &out)
        out.append(contentsOf: #","i":"#.utf8)
        JSONValue.writeString(d.key.id, to: &out)
        if !d.incr.isEmpty {
            out.append(contentsOf: #","incr":"#.utf8)
            JSONValue.object(d.incr).write(to: &out)
        }
        out.append(contentsOf: #","k":"doc","l":"#.utf8)
        JSONValue.writeInt(d.cl, to: &out)
        if !d.remove.isEmpty {
            out.append(contentsOf: #","remove":"#.utf8)
            JSONValue.object(d.remove.mapValues(JSONValue.array)).write(to: &out)
        }
        if !d.set.isEmpty {
            out.append(contentsOf: #","set":"#.utf8)
            JSONValue.object(d.set).write(to: &out)
        }
        if !d.unset.isEmpty {
            out.append(contentsOf: #","unset":["#.utf8)
            for (i, name) in d.unset.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSONValue.writeString(name, to: &out)
            }
            out.append(UInt8(ascii: "]"))
        }
        out.append(UInt8(ascii: "}"))
    }

    /// Appends the canonical JSON of `DocOp(key:, cl:, set:)` whose `set` is the canonical object `document` without
    /// its member at `without` (a member's bytes, commas excluded), as `writeOp` would write it.
    public static func writeSetOp(
        _ key: DocKey, cl: Int64, document: [UInt8], without member: Range<Int>, to out: inout [UInt8]
    ) {
        out.append(contentsOf: #"{"c":"#.utf8)
        JSONValue.writeString(key.collection, to: &out)
        out.append(contentsOf: #","i":"#.utf8)
        JSONValue.writeString(key.id, to: &out)
        out.append(contentsOf: #","k":"doc","l":"#.utf8)
        JSONValue.writeInt(cl, to: &out)
        // The member goes with the comma after it, or before it when it is the last one.
        var cut = member
        if document[cut.upperBound] == UInt8(ascii: ",") {
            cut = cut.lowerBound..<(cut.upperBound + 1)
        } else if document[cut.lowerBound - 1] == UInt8(ascii: ",") {
            cut = (cut.lowerBound - 1)..<cut.upperBound
        }
        if document.count - cut.count > 2 {
            out.append(contentsOf: #","set":"#.utf8)
            out.append(contentsOf: document[..<cut.lowerBound])
            out.append(contentsOf: document[cut.upperBound...])
        }
        out.append(UInt8(ascii: "}"))
    }

    /// The canonical text of this change (equal to `jsonValue.jsonText`) when `opsJSON` holds its operations'
    /// canonical JSON, comma-separated, as `writeOp` and `writeSetOp` write them.
    public func text(opsJSON: [UInt8]) -> String {
        var out = textPrefix(capacity: opsJSON.count)
        out.append(contentsOf: opsJSON)
        Self.finishText(&out)
        return String(decoding: out, as: UTF8.self)
    }

    /// This change's canonical text up to its first operation (operations come last in it), in a buffer with room for
    /// `capacity` more bytes: append the operations' JSON, comma-separated, then close it with `finishText`.
    public func textPrefix(capacity: Int = 0) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(capacity + 128)
        out.append(contentsOf: #"{"d":"#.utf8)
        deps.write(to: &out)
        out.append(contentsOf: #","h":"#.utf8)
        JSONValue.writeInt(Int64(bitPattern: hlc.raw), to: &out)
        out.append(contentsOf: #","o":""#.utf8)
        origin.writeHex(to: &out)
        out.append(contentsOf: #"","s":"#.utf8)
        JSONValue.writeInt(Int64(seq), to: &out)
        out.append(contentsOf: #","x":["#.utf8)
        return out
    }

    /// Closes a change's text begun with `textPrefix`.
    public static func finishText(_ out: inout [UInt8]) {
        out.append(contentsOf: "]}".utf8)
    }

    static func encode(_ op: CRDTOp) -> JSONValue {
        switch op {
        case .doc(let d):
            var o: [String: JSONValue] = [
                "k": "doc", "c": .string(d.key.collection), "i": .string(d.key.id), "l": .int(d.cl),
            ]
            if !d.set.isEmpty { o["set"] = .object(d.set) }
            if !d.unset.isEmpty { o["unset"] = .array(d.unset.map(JSONValue.string)) }
            if !d.incr.isEmpty { o["incr"] = .object(d.incr) }
            if !d.add.isEmpty { o["add"] = .object(d.add.mapValues(JSONValue.array)) }
            if !d.remove.isEmpty { o["remove"] = .object(d.remove.mapValues(JSONValue.array)) }
            return .object(o)
        case .delete(let key, let cl):
            return ["k": "del", "c": .string(key.collection), "i": .string(key.id), "l": .int(cl)]
        case .index(let name, let collection, let fields, let vector):
            var o: [String: JSONValue] = [
                "k": "index", "n": .string(name), "c": .string(collection),
                "f": fields.map { .array($0.map(JSONValue.string)) } ?? .null,
            ]
            if let vector { o["v"] = vector.jsonValue }
            return .object(o)
        }
    }

    /// Decodes the JSON form, validating every member.
    public init(json: JSONValue) throws(CRDTDecodingError) {
        guard case .string(let o)? = json["o"], let origin = NodeID(hex: o), case .int(let s)? = json["s"], s > 0,
            case .int(let h)? = json["h"], let depsJSON = json["d"], let deps = VersionVector(json: depsJSON),
            case .array(let ops)? = json["x"]
        else { throw CRDTDecodingError("malformed change header") }
        var decoded: [CRDTOp] = []
        for op in ops { decoded.append(try Self.decodeOp(op)) }
        self.init(origin: origin, seq: UInt64(s), hlc: HLC(raw: UInt64(bitPattern: h)), deps: deps, ops: decoded)
    }

    static func decodeOp(_ json: JSONValue) throws(CRDTDecodingError) -> CRDTOp {
        guard case .object(let o) = json else { throw CRDTDecodingError("malformed op") }
        return try decodeOp { o[$0] }
    }

    /// Decodes an op from its members, `o` giving each one's value by key.
    static func decodeOp(_ o: (String) -> JSONValue?) throws(CRDTDecodingError) -> CRDTOp {
        guard case .string(let kind)? = o("k") else { throw CRDTDecodingError("malformed op") }
        switch kind {
        case "doc":
            guard case .string(let c)? = o("c"), case .string(let i)? = o("i"), case .int(let l)? = o("l") else {
                throw CRDTDecodingError("malformed doc op")
            }
            func strings(_ v: JSONValue?) throws(CRDTDecodingError) -> [String] {
                guard let v else { return [] }
                guard case .array(let a) = v, let s = Optional(a.compactMap(\.stringValue)), s.count == a.count else {
                    throw CRDTDecodingError("malformed field list")
                }
                return s
            }
            func arrays(_ v: JSONValue?) throws(CRDTDecodingError) -> [String: [JSONValue]] {
                guard let v else { return [:] }
                guard case .object(let m) = v else { throw CRDTDecodingError("malformed set op") }
                var out: [String: [JSONValue]] = [:]
                for (k, x) in m {
                    guard case .array(let a) = x else { throw CRDTDecodingError("malformed set op") }
                    out[k] = a
                }
                return out
            }
            return .doc(
                DocOp(
                    key: DocKey(collection: c, id: i), cl: l, set: o("set")?.objectValue ?? [:],
                    unset: try strings(o("unset")), incr: o("incr")?.objectValue ?? [:], add: try arrays(o("add")),
                    remove: try arrays(o("remove"))))
        case "del":
            guard case .string(let c)? = o("c"), case .string(let i)? = o("i"), case .int(let l)? = o("l") else {
                throw CRDTDecodingError("malformed delete op")
            }
            return .delete(DocKey(collection: c, id: i), cl: l)
        case "index":
            guard case .string(let n)? = o("n"), case .string(let c)? = o("c") else {
                throw CRDTDecodingError("malformed index op")
            }
            let fields: [String]?
            switch o("f") {
            case .array(let a)?:
                fields = a.compactMap(\.stringValue)
                guard fields!.count == a.count else { throw CRDTDecodingError("malformed index fields") }
            default: fields = nil
            }
            // Held as written, whatever its shape (a newer build's is not refused; SQLStorage builds only what it reads).
            return .index(name: n, collection: c, fields: fields, vector: o("v").map(IndexVector.init(json:)))
        default:
            throw CRDTDecodingError("unknown op kind \(kind)")
        }
    }
}
