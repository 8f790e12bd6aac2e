/// Why a JSON text could not be parsed; `message` is meant for the client.
public struct JSONParseError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Stable machine-readable reason: "syntax", "invalid_utf8", "depth", "number_range", "duplicate_key", or
    /// "shape" (a value of the wrong type where `JSONReader`'s caller expects one).
    public var kind: String
    /// Human-readable explanation including the byte offset.
    public var message: String
    /// Offset of the offending byte in the input.
    public var offset: Int

    /// Creates a parse error.
    public init(kind: String, message: String, offset: Int) {
        self.kind = kind
        self.message = message
        self.offset = offset
    }

    /// The message text.
    public var description: String { message }
}

/// A strict RFC 8259 parser producing `JSONValue`, with a nesting-depth limit.
///
/// Integers without fraction or exponent become `.int` (out-of-range ones are rejected rather than rounded);
/// other numbers become `.double` via correctly rounded conversion, and overflow to infinity is rejected.
/// Strings must be valid UTF-8 without lone surrogate escapes. Duplicate object keys are rejected.
public struct JSONParser {
    /// Maximum nesting of arrays and objects; the top-level container counts as depth 1.
    public var maxDepth: Int

    /// Creates a parser with the given nesting limit.
    public init(maxDepth: Int = 64) {
        self.maxDepth = maxDepth
    }

    /// Parses exactly one JSON value from `bytes`; surrounding whitespace is allowed.
    public func parse<Bytes: Collection>(_ bytes: Bytes) throws(JSONParseError) -> JSONValue
    where Bytes.Element == UInt8 {
        let result: Result<JSONValue, JSONParseError>? = bytes.withContiguousStorageIfAvailable { buf in
            Self.run(buf, maxDepth: maxDepth)
        }
        if let result { return try result.get() }
        let array = Array(bytes)
        return try array.withUnsafeBufferPointer { Self.run($0, maxDepth: maxDepth) }.get()
    }

    /// Parses one JSON value from a string.
    public func parse(_ text: String) throws(JSONParseError) -> JSONValue {
        var text = text
        let result = text.withUTF8 { Self.run($0, maxDepth: maxDepth) }
        return try result.get()
    }

    private static func run(_ buf: UnsafeBufferPointer<UInt8>, maxDepth: Int) -> Result<JSONValue, JSONParseError> {
        var cursor = Cursor(buf: buf, maxDepth: maxDepth)
        do throws(JSONParseError) {
            cursor.skipWhitespace()
            let value = try cursor.parseValue(depth: 0)
            cursor.skipWhitespace()
            if cursor.pos != buf.count {
                throw cursor.error("syntax", "unexpected data after the JSON value")
            }
            return .success(value)
        } catch {
            return .failure(error)
        }
    }
}

/// The parser's position in a buffer and its token readers, shared with `JSONReader`.
struct Cursor {
    let buf: UnsafeBufferPointer<UInt8>
    let maxDepth: Int
    var pos = 0

    init(buf: UnsafeBufferPointer<UInt8>, maxDepth: Int) {
        self.buf = buf
        self.maxDepth = maxDepth
    }

    func error(_ kind: String, _ what: String) -> JSONParseError {
        JSONParseError(kind: kind, message: "\(what) at byte \(pos)", offset: pos)
    }

    mutating func skipWhitespace() {
        while pos < buf.count {
            switch buf[pos] {
            case 0x20, 0x09, 0x0A, 0x0D: pos += 1
            default: return
            }
        }
    }

    mutating func parseValue(depth: Int) throws(JSONParseError) -> JSONValue {
        guard pos < buf.count else { throw error("syntax", "unexpected end of input") }
        switch buf[pos] {
        case UInt8(ascii: "{"): return try parseObject(depth: depth + 1)
        case UInt8(ascii: "["): return try parseArray(depth: depth + 1)
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"): try expectLiteral("true"); return .bool(true)
        case UInt8(ascii: "f"): try expectLiteral("false"); return .bool(false)
        case UInt8(ascii: "n"): try expectLiteral("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try parseNumber()
        case 0x80...0xFF: throw error("syntax", "unexpected non-ASCII byte outside a string")
        default: throw error("syntax", "unexpected character '\(Character(Unicode.Scalar(buf[pos])))'")
        }
    }

    mutating func expectLiteral(_ literal: StaticString) throws(JSONParseError) {
        let count = literal.utf8CodeUnitCount
        guard pos + count <= buf.count else { throw error("syntax", "invalid literal") }
        let ok = literal.withUTF8Buffer { lit in
            (0..<count).allSatisfy { buf[pos + $0] == lit[$0] }
        }
        guard ok else { throw error("syntax", "invalid literal") }
        pos += count
    }

    mutating func parseObject(depth: Int) throws(JSONParseError) -> JSONValue {
        if depth > maxDepth { throw error("depth", "nesting deeper than the limit of \(maxDepth)") }
        pos += 1
        skipWhitespace()
        if pos < buf.count, buf[pos] == UInt8(ascii: "}") {
            pos += 1
            return .object([:])
        }
        // Members are collected first and the dictionary is sized once (growing it member by member rehashes it at
        // 1, 2, 4 and 8 members).
        var members: [(key: String, value: JSONValue, at: Int)] = []
        members.reserveCapacity(8)
        func build() throws(JSONParseError) -> JSONValue {
            var object = [String: JSONValue](minimumCapacity: members.count)
            for m in members {
                if object.updateValue(m.value, forKey: m.key) != nil {
                    pos = m.at
                    throw error("duplicate_key", "duplicate object key \"\(m.key)\"")
                }
            }
            return .object(object)
        }
        while true {
            skipWhitespace()
            guard pos < buf.count, buf[pos] == UInt8(ascii: "\"") else {
                throw error("syntax", "expected a string key")
            }
            let keyStart = pos
            let key = try parseString()
            skipWhitespace()
            guard pos < buf.count, buf[pos] == UInt8(ascii: ":") else { throw error("syntax", "expected ':'") }
            pos += 1
            skipWhitespace()
            members.append((key, try parseValue(depth: depth), keyStart))
            skipWhitespace()
            guard pos < buf.count else { throw error("syntax", "unexpected end of input in object") }
            if buf[pos] == UInt8(ascii: ",") {
                pos += 1
            } else if buf[pos] == UInt8(ascii: "}") {
                pos += 1
                return try build()
            } else {
                throw error("syntax", "expected ',' or '}'")
            }
        }
    }

    mutating func parseArray(depth: Int) throws(JSONParseError) -> JSONValue {
        if depth > maxDepth { throw error("depth", "nesting deeper than the limit of \(maxDepth)") }
        pos += 1
        var array: [JSONValue] = []
        skipWhitespace()
        if pos < buf.count, buf[pos] == UInt8(ascii: "]") {
            pos += 1
            return .array(array)
        }
        while true {
            skipWhitespace()
            array.append(try parseValue(depth: depth))
            skipWhitespace()
            guard pos < buf.count else { throw error("syntax", "unexpected end of input in array") }
            if buf[pos] == UInt8(ascii: ",") {
                pos += 1
            } else if buf[pos] == UInt8(ascii: "]") {
                pos += 1
                return .array(array)
            } else {
                throw error("syntax", "expected ',' or ']'")
            }
        }
    }

    mutating func parseString() throws(JSONParseError) -> String {
        pos += 1  // opening quote
        let start = pos
        // Fast path: no escapes. Bytes are OR-ed together on the way: an all-ASCII string (the common case) is valid
        // UTF-8 as it is and takes the standard library's ASCII fast path, skipping generic validation.
        var high: UInt8 = 0
        while pos < buf.count {
            let byte = buf[pos]
            high |= byte
            if byte == UInt8(ascii: "\"") {
                let slice = UnsafeBufferPointer(rebasing: buf[start..<pos])
                if high < 0x80 {
                    pos += 1
                    return String(decoding: slice, as: UTF8.self)
                }
                guard let s = String(validating: slice, as: UTF8.self) else {
                    pos = start
                    throw error("invalid_utf8", "string is not valid UTF-8")
                }
                pos += 1
                return s
            }
            if byte == UInt8(ascii: "\\") { break }
            if byte < 0x20 { throw error("syntax", "unescaped control character in string") }
            pos += 1
        }
        var bytes = Array(UnsafeBufferPointer(rebasing: buf[start..<pos]))
        while pos < buf.count {
            let byte = buf[pos]
            switch byte {
            case UInt8(ascii: "\""):
                guard let s = String(validating: bytes, as: UTF8.self) else {
                    pos = start
                    throw error("invalid_utf8", "string is not valid UTF-8")
                }
                pos += 1
                return s
            case UInt8(ascii: "\\"):
                pos += 1
                guard pos < buf.count else { break }
                let esc = buf[pos]
                pos += 1
                switch esc {
                case UInt8(ascii: "\""): bytes.append(0x22)
                case UInt8(ascii: "\\"): bytes.append(0x5C)
                case UInt8(ascii: "/"): bytes.append(0x2F)
                case UInt8(ascii: "b"): bytes.append(0x08)
                case UInt8(ascii: "f"): bytes.append(0x0C)
                case UInt8(ascii: "n"): bytes.append(0x0A)
                case UInt8(ascii: "r"): bytes.append(0x0D)
                case UInt8(ascii: "t"): bytes.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try parseHex4()
                    if (0xD800...0xDBFF).contains(scalar) {
                        guard pos + 1 < buf.count, buf[pos] == UInt8(ascii: "\\"), buf[pos + 1] == UInt8(ascii: "u")
                        else { throw error("invalid_utf8", "lone surrogate escape in string") }
                        pos += 2
                        let low = try parseHex4()
                        guard (0xDC00...0xDFFF).contains(low) else {
                            throw error("invalid_utf8", "lone surrogate escape in string")
                        }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(scalar) {
                        throw error("invalid_utf8", "lone surrogate escape in string")
                    }
                    guard let us = Unicode.Scalar(scalar) else {
                        throw error("invalid_utf8", "invalid unicode escape")
                    }
                    bytes.append(contentsOf: UTF8.encode(us)!)
                default:
                    pos -= 1
                    throw error("syntax", "invalid escape sequence")
                }
            default:
                if byte < 0x20 { throw error("syntax", "unescaped control character in string") }
                bytes.append(byte)
                pos += 1
            }
        }
        throw error("syntax", "unterminated string")
    }

    mutating func parseHex4() throws(JSONParseError) -> UInt32 {
        guard pos + 4 <= buf.count else { throw error("syntax", "truncated \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let c = buf[pos]
            let digit: UInt32
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(c - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(c - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(c - UInt8(ascii: "A") + 10)
            default: throw error("syntax", "invalid hex digit in \\u escape")
            }
            value = value << 4 | digit
            pos += 1
        }
        return value
    }

    mutating func digits() -> Int {
        let start = pos
        while pos < buf.count, buf[pos] >= UInt8(ascii: "0"), buf[pos] <= UInt8(ascii: "9") { pos += 1 }
        return pos - start
    }

    mutating func parseNumber() throws(JSONParseError) -> JSONValue {
        let start = pos
        if buf[pos] == UInt8(ascii: "-") { pos += 1 }
        guard pos < buf.count else { throw error("syntax", "invalid number") }
        if buf[pos] == UInt8(ascii: "0") {
            pos += 1
        } else if digits() == 0 {
            throw error("syntax", "invalid number")
        }
        var isInteger = true
        if pos < buf.count, buf[pos] == UInt8(ascii: ".") {
            isInteger = false
            pos += 1
            if digits() == 0 { throw error("syntax", "invalid number: digits expected after '.'") }
        }
        if pos < buf.count, buf[pos] == UInt8(ascii: "e") || buf[pos] == UInt8(ascii: "E") {
            isInteger = false
            pos += 1
            if pos < buf.count, buf[pos] == UInt8(ascii: "+") || buf[pos] == UInt8(ascii: "-") { pos += 1 }
            if digits() == 0 { throw error("syntax", "invalid number: digits expected in exponent") }
        }
        if isInteger, let i = Self.smallInteger(buf[start..<pos]) { return .int(i) }
        let text = String(decoding: UnsafeBufferPointer(rebasing: buf[start..<pos]), as: UTF8.self)
        if isInteger {
            if let i = Int64(text) { return .int(i) }
            pos = start
            throw error("number_range", "integer \(text) does not fit in 64 bits")
        }
        guard let d = Double(text), d.isFinite else {
            pos = start
            throw error("number_range", "number \(text) is out of the range of a 64-bit float")
        }
        // A non-zero number that rounds to zero (below the smallest subnormal, e.g. 1e-400) is rejected, not stored
        // as 0: numbers round-trip or are refused.
        if d == 0, Self.hasNonZeroMantissa(buf[start..<pos]) {
            pos = start
            throw error("number_range", "number \(text) is too small for a 64-bit float (it would round to 0)")
        }
        return .double(d)
    }

    /// The value of an integer's text (an optional '-', then digits) of at most 18 digits, which cannot overflow;
    /// nil for longer ones, left to `Int64(_:)` and its range check.
    @inline(__always)
    static func smallInteger(_ number: Slice<UnsafeBufferPointer<UInt8>>) -> Int64? {
        var i = number.startIndex
        let negative = number[i] == UInt8(ascii: "-")
        if negative { i += 1 }
        guard number.endIndex - i <= 18 else { return nil }
        var value: Int64 = 0
        while i < number.endIndex {
            value = value &* 10 &+ Int64(number[i] &- UInt8(ascii: "0"))
            i += 1
        }
        return negative ? -value : value
    }

    /// True when a number's digits before its exponent include one that is not 0.
    static func hasNonZeroMantissa(_ number: Slice<UnsafeBufferPointer<UInt8>>) -> Bool {
        for c in number {
            if c == UInt8(ascii: "e") || c == UInt8(ascii: "E") { return false }
            if c >= UInt8(ascii: "1") && c <= UInt8(ascii: "9") { return true }
        }
        return false
    }
}
