/// Reads a JSON text one token at a time, for decoders that build their own types without a `JSONValue` tree first.
///
/// Everything it reads follows `JSONParser`'s rules (strict syntax, valid UTF-8, number ranges, the nesting limit).
/// It sees every key, so rejecting a duplicate key is the caller's part. A reader points into the text: it must not
/// leave `read`'s body, which is why it is the package's alone.
package struct JSONReader {
    private var cursor: Cursor
    private var depth = 0
    /// A container was just opened: its first member or element comes without a comma.
    private var atStart = false

    private init(_ cursor: Cursor) { self.cursor = cursor }

    /// Runs `body` over the UTF-8 text `text`, which must hold exactly the one value `body` reads (whitespace aside).
    package static func read<T>(_ text: String, maxDepth: Int = 64, _ body: (inout JSONReader) throws -> T) throws -> T {
        var text = text
        return try text.withUTF8 { try read($0, maxDepth: maxDepth, body) }
    }

    /// Runs `body` over the bytes `bytes` (UTF-8 is checked as it is read), which must hold exactly the one value
    /// `body` reads (whitespace aside).
    package static func read<T>(_ bytes: [UInt8], maxDepth: Int = 64, _ body: (inout JSONReader) throws -> T) throws -> T {
        try bytes.withUnsafeBufferPointer { try read($0, maxDepth: maxDepth, body) }
    }

    private static func read<T>(
        _ buf: UnsafeBufferPointer<UInt8>, maxDepth: Int, _ body: (inout JSONReader) throws -> T
    ) throws -> T {
        var reader = JSONReader(Cursor(buf: buf, maxDepth: maxDepth))
        reader.cursor.skipWhitespace()
        let result = try body(&reader)
        reader.cursor.skipWhitespace()
        guard reader.cursor.pos == buf.count else {
            throw reader.cursor.error("syntax", "unexpected data after the JSON value")
        }
        return result
    }

    /// An error at the current position, for a value of the wrong shape.
    package func error(_ what: String) -> JSONParseError { cursor.error("shape", what) }

    /// The first byte of the next value, nil at the end of the text.
    package mutating func peek() -> UInt8? {
        cursor.skipWhitespace()
        return cursor.pos < cursor.buf.count ? cursor.buf[cursor.pos] : nil
    }

    /// Opens an object; read its members with `nextKey()` until it returns nil.
    package mutating func beginObject() throws(JSONParseError) {
        try open(UInt8(ascii: "{"), "an object")
    }

    /// Opens an array; read its elements while `nextElement()` returns true.
    package mutating func beginArray() throws(JSONParseError) {
        try open(UInt8(ascii: "["), "an array")
    }

    /// The next member's key (the reader then stands at its value, which the caller must read), or nil when the
    /// object closes.
    package mutating func nextKey() throws(JSONParseError) -> String? {
        guard try more(close: UInt8(ascii: "}")) else { return nil }
        guard cursor.pos < cursor.buf.count, cursor.buf[cursor.pos] == UInt8(ascii: "\"") else {
            throw cursor.error("syntax", "expected a string key")
        }
        let key = try cursor.parseString()
        cursor.skipWhitespace()
        guard cursor.pos < cursor.buf.count, cursor.buf[cursor.pos] == UInt8(ascii: ":") else {
            throw cursor.error("syntax", "expected ':'")
        }
        cursor.pos += 1
        cursor.skipWhitespace()
        return key
    }

    /// True when the array has another element (the reader then stands at it), false when it closes.
    package mutating func nextElement() throws(JSONParseError) -> Bool {
        try more(close: UInt8(ascii: "]"))
    }

    /// The next value, whole.
    package mutating func value() throws(JSONParseError) -> JSONValue {
        atStart = false
        cursor.skipWhitespace()
        return try cursor.parseValue(depth: depth)
    }

    /// The next value, which must be an integer (written without fraction or exponent).
    package mutating func int() throws(JSONParseError) -> Int64 {
        guard case .int(let i) = try value() else { throw error("expected an integer") }
        return i
    }

    /// The next value, which must be a string.
    package mutating func string() throws(JSONParseError) -> String {
        guard case .string(let s) = try value() else { throw error("expected a string") }
        return s
    }

    private mutating func open(_ byte: UInt8, _ what: String) throws(JSONParseError) {
        cursor.skipWhitespace()
        guard cursor.pos < cursor.buf.count, cursor.buf[cursor.pos] == byte else { throw error("expected \(what)") }
        depth += 1
        if depth > cursor.maxDepth { throw cursor.error("depth", "nesting deeper than the limit of \(cursor.maxDepth)") }
        cursor.pos += 1
        atStart = true
    }

    /// Steps over the comma before a member or element; false (the container closed) at `close`.
    private mutating func more(close: UInt8) throws(JSONParseError) -> Bool {
        cursor.skipWhitespace()
        guard cursor.pos < cursor.buf.count else { throw cursor.error("syntax", "unexpected end of input") }
        let first = atStart
        atStart = false
        if cursor.buf[cursor.pos] == close {
            cursor.pos += 1
            depth -= 1
            return false
        }
        if first { return true }
        guard cursor.buf[cursor.pos] == UInt8(ascii: ",") else {
            throw cursor.error("syntax", close == UInt8(ascii: "}") ? "expected ',' or '}'" : "expected ',' or ']'")
        }
        cursor.pos += 1
        cursor.skipWhitespace()
        return true
    }
}
