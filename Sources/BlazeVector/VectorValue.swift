import BlazeProtocol

/// Why a vector value was refused (the store maps it to `invalid_vector`).
public struct VectorValueError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What was wrong, for the caller.
    public let description: String

    init(_ description: String) { self.description = description }
}

/// A document's vector value: `{"$vector": …}`, a whole-value field stored and synced as the base64 (RFC 4648, with
/// padding) of its little-endian float32 components. Given as that text or as an array of numbers; read back as
/// either (the caller chooses). Every component is finite and fits a float32; 1 to `maxDimensions` of them.
public enum VectorValue {
    /// The member that marks an object as a vector.
    public static let marker = "$vector"
    /// Most components a vector may have (16 KiB of float32).
    public static let maxDimensions = 4096

    /// The components of the value of a `$vector` member given by a client: an array of numbers, or base64 of
    /// little-endian float32.
    public static func components(of value: JSONValue) throws(VectorValueError) -> [Float] {
        switch value {
        case .array(let items):
            guard !items.isEmpty, items.count <= maxDimensions else {
                throw VectorValueError("a vector has 1 to \(maxDimensions) components, got \(items.count)")
            }
            var out = [Float]()
            out.reserveCapacity(items.count)
            for (i, item) in items.enumerated() {
                let x: Double
                switch item {
                case .int(let n): x = Double(n)
                case .double(let d): x = d
                default: throw VectorValueError("component \(i) of the vector is \(item.typeName), not a number")
                }
                let f = Float(x)
                guard f.isFinite else { throw VectorValueError("component \(i) of the vector (\(x)) is outside float32's range") }
                out.append(f)
            }
            guard squaredNormIsFinite(out) else {
                throw VectorValueError("the vector's squared length overflows float32 (its components are too large)")
            }
            return out
        case .string(let text):
            guard let floats = decode(text) else {
                throw VectorValueError(
                    "a vector's text is base64 (with padding) of 1 to \(maxDimensions) little-endian float32 values, all finite, "
                        + "whose squared length fits float32")
            }
            return floats
        default:
            throw VectorValueError("$vector holds an array of numbers or a base64 string, not \(value.typeName)")
        }
    }

    /// The stored form of `components`: `{"$vector": base64}`.
    public static func stored(_ components: [Float]) -> JSONValue {
        .object([marker: .string(encode(components))])
    }

    /// The components of a stored vector value, or nil when `value` is not one (or is malformed: a remote member may
    /// have written anything).
    public static func storedComponents(_ value: JSONValue) -> [Float]? {
        guard case .object(let o) = value, o.count == 1, case .string(let text)? = o[marker] else { return nil }
        return decode(text)
    }

    // MARK: Documents

    /// True when `value` holds an object with a `$vector` member at any depth (a cheap test before `normalized`:
    /// scalars are skipped without a look).
    public static func occurs(in value: JSONValue) -> Bool {
        switch value {
        case .object(let o): return o[marker] != nil || o.values.contains(where: occurs)
        case .array(let a): return a.contains(where: occurs)
        default: return false
        }
    }

    /// True when a value of `fields` holds a vector at any depth.
    public static func occurs(in fields: [String: JSONValue]) -> Bool {
        fields.values.contains(where: occurs)
    }

    /// `value` with every vector given by a client in its stored form; a `$vector` object with other members, or a
    /// malformed vector, is refused (`path` names where, for the message).
    public static func normalized(_ value: JSONValue, path: String = "") throws(VectorValueError) -> JSONValue {
        switch value {
        case .object(let o):
            if let v = o[marker] {
                guard o.count == 1 else {
                    throw VectorValueError("\(where_(path))a $vector object has no other members (found \(o.count - 1) more)")
                }
                do {
                    return stored(try components(of: v))
                } catch {
                    throw VectorValueError("\(where_(path))\(error.description)")
                }
            }
            var out = o
            for (k, v) in o where occurs(in: v) { out[k] = try normalized(v, path: path.isEmpty ? k : path + "." + k) }
            return .object(out)
        case .array(let a):
            var out = a
            for (i, v) in a.enumerated() where occurs(in: v) { out[i] = try normalized(v, path: "\(path)[\(i)]") }
            return .array(out)
        default:
            return value
        }
    }

    /// `fields` with every vector in its stored form (see `normalized(_:path:)`).
    public static func normalized(_ fields: [String: JSONValue]) throws(VectorValueError) -> [String: JSONValue] {
        var out = fields
        for (k, v) in fields where occurs(in: v) { out[k] = try normalized(v, path: k) }
        return out
    }

    private static func where_(_ path: String) -> String { path.isEmpty ? "" : "\(path): " }

    /// `value` with every stored vector as `{"$vector": [numbers]}` (each float32's shortest decimal text); malformed
    /// ones are left as they are.
    public static func expanded(_ value: JSONValue) -> JSONValue {
        switch value {
        case .object(let o):
            if o[marker] != nil {
                guard let floats = storedComponents(value) else { return value }
                return .object([marker: .array(floats.map(number))])
            }
            return .object(o.mapValues(expanded))
        case .array(let a):
            return .array(a.map(expanded))
        default:
            return value
        }
    }

    /// A float32 as the JSON number with its shortest decimal text (0.1, not 0.10000000149011612): read back as a
    /// float32 it is the same value.
    static func number(_ f: Float) -> JSONValue {
        if f == f.rounded(), abs(f) < 1e15, !(f == 0 && f.sign == .minus) { return .int(Int64(f)) }
        return .double(Double("\(f)") ?? Double(f))
    }

    /// True when the sum of the squares of `v` is finite in float32: then every inner product and cosine distance
    /// between such vectors is too (a product of two of them is bounded by their lengths); an L2 distance can still
    /// overflow to infinity (two opposite vectors near the limit), which a search ranks last.
    static func squaredNormIsFinite(_ v: [Float]) -> Bool {
        var sum: Float = 0
        for x in v { sum += x * x }
        return sum.isFinite
    }

    /// True when `fields` (a document's or a patch's) names the `$vector` member itself: a top-level field called
    /// `$vector`, or a path through one (`emb.$vector`). A vector is written whole, by its field.
    public static func namesMarker(_ names: some Sequence<String>) -> String? {
        names.first { name in
            // Most names hold no `$`: one byte scan, no split.
            name.utf8.contains(UInt8(ascii: "$"))
                && (name == marker || name.split(separator: ".", omittingEmptySubsequences: false).contains { $0 == marker })
        }
    }

    // MARK: Base64 of float32

    /// Base64 (with padding) of the little-endian bytes of `components`.
    public static func encode(_ components: [Float]) -> String {
        var bytes = [UInt8]()
        bytes.reserveCapacity(components.count * 4)
        for f in components { withUnsafeBytes(of: f.bitPattern.littleEndian) { bytes.append(contentsOf: $0) } }
        return Base64.encode(bytes)
    }

    /// The components of base64 `text` (with padding, in the canonical form `encode` writes), or nil when it is not
    /// exactly that for 1 to `maxDimensions` finite float32 values.
    public static func decode(_ text: String) -> [Float]? {
        var text = text
        return text.withUTF8 { utf8 -> [Float]? in
            guard let bytes = Base64.decode(UnsafeRawBufferPointer(utf8), maxBytes: maxDimensions * 4), bytes.count % 4 == 0, !bytes.isEmpty,
                bytes.count <= maxDimensions * 4
            else { return nil }
            var out = [Float](repeating: 0, count: bytes.count / 4)
            for i in out.indices {
                let bits = UInt32(bytes[4 * i]) | UInt32(bytes[4 * i + 1]) << 8 | UInt32(bytes[4 * i + 2]) << 16
                    | UInt32(bytes[4 * i + 3]) << 24
                let f = Float(bitPattern: bits)
                guard f.isFinite else { return nil }
                out[i] = f
            }
            return squaredNormIsFinite(out) ? out : nil
        }
    }
}
