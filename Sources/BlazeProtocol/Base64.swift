/// Base64 with padding (RFC 4648 §4) in its canonical form: the text of vector values (`{"$vector": …}`), and what
/// an entry of format 3 carries as bytes instead (SYNC.md §6, "Entry formats").
public enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)
    private static let values: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (i, c) in alphabet.enumerated() { table[Int(c)] = UInt8(i) }
        return table
    }()

    /// Base64 (with padding) of `bytes`.
    public static func encode(_ bytes: [UInt8]) -> String {
        String(unsafeUninitializedCapacity: (bytes.count + 2) / 3 * 4) { out in
            var i = 0
            var k = 0
            while k + 3 <= bytes.count {
                let n = UInt32(bytes[k]) << 16 | UInt32(bytes[k + 1]) << 8 | UInt32(bytes[k + 2])
                out[i] = alphabet[Int(n >> 18)]
                out[i + 1] = alphabet[Int(n >> 12 & 0x3F)]
                out[i + 2] = alphabet[Int(n >> 6 & 0x3F)]
                out[i + 3] = alphabet[Int(n & 0x3F)]
                (i, k) = (i + 4, k + 3)
            }
            let rest = bytes.count - k
            if rest > 0 {
                let n = UInt32(bytes[k]) << 16 | (rest == 2 ? UInt32(bytes[k + 1]) << 8 : 0)
                out[i] = alphabet[Int(n >> 18)]
                out[i + 1] = alphabet[Int(n >> 12 & 0x3F)]
                out[i + 2] = rest == 2 ? alphabet[Int(n >> 6 & 0x3F)] : UInt8(ascii: "=")
                out[i + 3] = UInt8(ascii: "=")
                i += 4
            }
            return i
        }
    }

    /// The bytes of canonical padded base64 `utf8`: nil for an empty text, a length not a multiple of four, a byte
    /// outside the alphabet, misplaced padding, or unused bits that are not zero (so one value has one text), and for
    /// a text of more than `maxBytes` bytes, checked before any allocation.
    public static func decode(_ utf8: UnsafeRawBufferPointer, maxBytes: Int) -> [UInt8]? {
        guard utf8.count % 4 == 0, utf8.count > 0, utf8.count <= (maxBytes + 2) / 3 * 4 else { return nil }
        var pad = 0
        if utf8[utf8.count - 1] == UInt8(ascii: "=") { pad = utf8[utf8.count - 2] == UInt8(ascii: "=") ? 2 : 1 }
        var out = [UInt8]()
        out.reserveCapacity(utf8.count / 4 * 3)
        var k = 0
        while k < utf8.count {
            let last = k + 4 == utf8.count
            var n: UInt32 = 0
            for j in 0..<4 {
                let c = utf8[k + j]
                if last && j >= 4 - pad {
                    n <<= 6
                    continue
                }
                let v = values[Int(c)]
                guard v != 0xFF else { return nil }
                n = n << 6 | UInt32(v)
            }
            out.append(UInt8(n >> 16))
            if !(last && pad == 2) { out.append(UInt8(n >> 8 & 0xFF)) } else if n & 0xFFFF != 0 { return nil }
            if !(last && pad >= 1) { out.append(UInt8(n & 0xFF)) } else if pad == 1 && n & 0xFF != 0 { return nil }
            k += 4
        }
        return out
    }
}
