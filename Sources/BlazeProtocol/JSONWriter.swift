extension JSONValue {
    /// Canonical compact JSON text: no whitespace, object keys sorted by UTF-8 bytes, shortest round-trip doubles.
    ///
    /// NaN and infinities cannot occur in values produced by `JSONParser`; if constructed by hand they are written
    /// as `null` (use `validateFinite()` first where that matters).
    public var jsonText: String {
        var out: [UInt8] = []
        out.reserveCapacity(128)
        write(to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// Canonical JSON bytes (see `jsonText`).
    public var jsonBytes: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(128)
        write(to: &out)
        return out
    }

    /// Appends the canonical JSON encoding to `out`.
    public func write(to out: inout [UInt8]) {
        switch self {
        case .null: out.append(contentsOf: "null".utf8)
        case .bool(let b): out.append(contentsOf: (b ? "true" : "false").utf8)
        case .int(let i): Self.writeInt(i, to: &out)
        case .double(let d): Self.writeDouble(d, to: &out)
        case .string(let s): Self.writeString(s, to: &out)
        case .array(let a):
            out.append(UInt8(ascii: "["))
            for (i, v) in a.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                v.write(to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let o):
            out.append(UInt8(ascii: "{"))
            var first = true
            for i in o.utf8OrderedIndices {
                let (key, value) = o[i]
                if !first { out.append(UInt8(ascii: ",")) }
                first = false
                Self.writeString(key, to: &out)
                out.append(UInt8(ascii: ":"))
                value.write(to: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    /// Pretty-printed JSON for humans (2-space indent, sorted keys).
    public func prettyText(indent: Int = 0) -> String {
        let pad = String(repeating: "  ", count: indent + 1)
        let closePad = String(repeating: "  ", count: indent)
        switch self {
        case .array(let a) where !a.isEmpty:
            return "[\n" + a.map { pad + $0.prettyText(indent: indent + 1) }.joined(separator: ",\n") + "\n\(closePad)]"
        case .object(let o) where !o.isEmpty:
            let items = o.keys.sorted(by: utf8Less).map { key in
                pad + JSONValue.string(key).jsonText + ": " + o[key]!.prettyText(indent: indent + 1)
            }
            return "{\n" + items.joined(separator: ",\n") + "\n\(closePad)}"
        default:
            return jsonText
        }
    }

    /// Appends the decimal digits of `i` without allocating a String.
    public static func writeInt(_ i: Int64, to out: inout [UInt8]) {
        if i < 0 { out.append(UInt8(ascii: "-")) }
        // Magnitude as unsigned, so Int64.min works.
        var m = i.magnitude
        var digits: (UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0)  // 32 bytes: room for 20 digits
        var n = 0
        withUnsafeMutableBytes(of: &digits) { buf in
            repeat {
                buf[31 - n] = UInt8(ascii: "0") + UInt8(m % 10)
                m /= 10
                n += 1
            } while m > 0
            out.append(contentsOf: buf[(32 - n)...])
        }
    }

    static func writeDouble(_ d: Double, to out: inout [UInt8]) {
        guard d.isFinite else {
            out.append(contentsOf: "null".utf8)
            return
        }
        // Swift's description is the shortest text that round-trips; it always has '.' or 'e' for doubles.
        out.append(contentsOf: d.description.utf8)
    }

    /// Appends `s` as a JSON string literal (quoted, escaped).
    public static func writeString(_ s: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        // Fast path: most strings need no escaping and are copied in one go.
        let copied: Bool? = s.utf8.withContiguousStorageIfAvailable { bytes in
            guard !bytes.contains(where: { $0 < 0x20 || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "\\") }) else {
                return false
            }
            out.append(contentsOf: bytes)
            return true
        }
        if copied == true {
            out.append(UInt8(ascii: "\""))
            return
        }
        for byte in s.utf8 {
            switch byte {
            case UInt8(ascii: "\""): out.append(contentsOf: [0x5C, 0x22])
            case UInt8(ascii: "\\"): out.append(contentsOf: [0x5C, 0x5C])
            case 0x0A: out.append(contentsOf: [0x5C, UInt8(ascii: "n")])
            case 0x0D: out.append(contentsOf: [0x5C, UInt8(ascii: "r")])
            case 0x09: out.append(contentsOf: [0x5C, UInt8(ascii: "t")])
            case 0x00..<0x20:
                let hex: [UInt8] = Array("0123456789abcdef".utf8)
                out.append(contentsOf: [0x5C, UInt8(ascii: "u"), 0x30, 0x30, hex[Int(byte >> 4)], hex[Int(byte & 0xF)]])
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
    }

    /// Maximum nesting depth of this value (scalars are 0, `[]` is 1).
    public var depth: Int {
        switch self {
        case .array(let a): return 1 + (a.map(\.depth).max() ?? 0)
        case .object(let o): return 1 + (o.values.map(\.depth).max() ?? 0)
        default: return 0
        }
    }
}
