#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A JSON value with exact number semantics (JSON null is `.null`; Swift's `nil` is never a JSON value, so
/// "absent" and "null" cannot be confused): integers stay 64-bit integers, doubles round-trip bit for bit.
///
/// Objects are unordered; they serialize with keys sorted by UTF-8 bytes, so one value has one canonical text.
public enum JSONValue: Sendable, Hashable {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])
}

extension JSONValue {
    /// The string payload, or nil for other kinds.
    public var stringValue: String? {
        if case .string(let s) = self { return s }
        return nil
    }

    /// The object payload, or nil for other kinds.
    public var objectValue: [String: JSONValue]? {
        if case .object(let o) = self { return o }
        return nil
    }

    /// The array payload, or nil for other kinds.
    public var arrayValue: [JSONValue]? {
        if case .array(let a) = self { return a }
        return nil
    }

    /// The integer payload, or nil for other kinds (doubles are not converted).
    public var intValue: Int64? {
        if case .int(let i) = self { return i }
        return nil
    }

    /// The boolean payload, or nil for other kinds.
    public var boolValue: Bool? {
        if case .bool(let b) = self { return b }
        return nil
    }

    /// True for `.null`.
    public var isNull: Bool {
        if case .null = self { return true }
        return false
    }

    /// The JSON type name used in error messages and schemas ("object", "integer", ...).
    public var typeName: String {
        switch self {
        case .null: return "null"
        case .bool: return "boolean"
        case .int: return "integer"
        case .double: return "number"
        case .string: return "string"
        case .array: return "array"
        case .object: return "object"
        }
    }

    /// Member access for objects; nil for missing keys and non-objects.
    public subscript(key: String) -> JSONValue? {
        if case .object(let o) = self { return o[key] }
        return nil
    }
}

extension JSONValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByFloatLiteral,
    ExpressibleByBooleanLiteral, ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral
{
    /// Creates a string value.
    public init(stringLiteral value: String) { self = .string(value) }
    /// Creates an integer value.
    public init(integerLiteral value: Int64) { self = .int(value) }
    /// Creates a double value.
    public init(floatLiteral value: Double) { self = .double(value) }
    /// Creates a boolean value.
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    /// Creates an array value.
    public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
    /// Creates an object value; a repeated key keeps the last value.
    public init(dictionaryLiteral elements: (String, JSONValue)...) {
        self = .object(Dictionary(elements, uniquingKeysWith: { _, last in last }))
    }
}

/// Compares two strings by their UTF-8 bytes, the order SQLite's BINARY collation uses.
@inlinable
public func utf8Less(_ a: String, _ b: String) -> Bool {
    // Native strings are contiguous UTF-8: compare the bytes in one go (object keys are sorted with this on every
    // serialization). The element-wise comparison is the fallback for other strings.
    let fast: Bool?? = a.utf8.withContiguousStorageIfAvailable { x in
        b.utf8.withContiguousStorageIfAvailable { y -> Bool in
            let n = min(x.count, y.count)
            if n > 0 {
                let c = memcmp(x.baseAddress!, y.baseAddress!, n)
                if c != 0 { return c < 0 }
            }
            return x.count < y.count
        }
    }
    if let known = fast ?? nil { return known }
    return a.utf8.lexicographicallyPrecedes(b.utf8)
}

extension Dictionary where Key == String {
    /// The positions of the members in UTF-8 key order (canonical member order), found without copying a member.
    ///
    /// Keys are compared by their first eight bytes as one integer first; only keys that share those fall back to
    /// `utf8Less`. Reading a member at a position hashes nothing.
    @inlinable
    public var utf8OrderedIndices: [Index] {
        var order: [(prefix: UInt64, index: Index)] = []
        order.reserveCapacity(count)
        // Keys only: reading `self[i]` would copy (retain and release) each value too.
        let keys = self.keys
        var i = startIndex
        while i != endIndex {
            var prefix: UInt64 = 0
            var n = 0
            for byte in keys[i].utf8 {
                if n == 8 { break }
                prefix = prefix << 8 | UInt64(byte)
                n += 1
            }
            order.append((prefix << UInt64(8 * (8 - n)), i))
            formIndex(after: &i)
        }
        func less(_ a: (prefix: UInt64, index: Index), _ b: (prefix: UInt64, index: Index)) -> Bool {
            a.prefix != b.prefix ? a.prefix < b.prefix : utf8Less(keys[a.index], keys[b.index])
        }
        if order.count <= 16 {
            // Insertion sort: documents have few members, and it moves nothing that needs retaining.
            for j in order.indices.dropFirst() {
                let item = order[j]
                var k = j
                while k > 0, less(item, order[k - 1]) {
                    order[k] = order[k - 1]
                    k -= 1
                }
                order[k] = item
            }
        } else {
            order.sort(by: less)
        }
        return order.map(\.index)
    }
}

/// Compares two strings by their UTF-8 bytes (no Unicode normalization, unlike `==` on `String`).
@inlinable
public func utf8Equal(_ a: String, _ b: String) -> Bool {
    guard a.utf8.count == b.utf8.count else { return false }
    let fast: Bool?? = a.utf8.withContiguousStorageIfAvailable { x in
        b.utf8.withContiguousStorageIfAvailable { y in x.isEmpty || memcmp(x.baseAddress!, y.baseAddress!, x.count) == 0 }
    }
    if let known = fast ?? nil { return known }
    return a.utf8.elementsEqual(b.utf8)
}
