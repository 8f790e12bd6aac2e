/// Base64url without padding (RFC 4648 §5), the alphabet of every BlazeDB token and query cursor.
///
/// Written out rather than through Foundation: `Data.base64EncodedString()` plus three `replacingOccurrences` cost
/// about a tenth of an indexed `query.find` that returns a cursor.
public enum Base64URL {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// The 6-bit value of each byte of the alphabet; 0xFF for any other byte.
    private static let values: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (i, c) in alphabet.enumerated() { table[Int(c)] = UInt8(i) }
        return table
    }()

    /// The unpadded base64url text of `bytes`.
    public static func encode(_ bytes: some Collection<UInt8>) -> String {
        let count = bytes.count
        return String(unsafeUninitializedCapacity: (count * 4 + 2) / 3) { out in
            var (i, acc, bits) = (0, UInt32(0), 0)
            for b in bytes {
                acc = acc << 8 | UInt32(b)
                bits += 8
                while bits >= 6 {
                    bits -= 6
                    out[i] = alphabet[Int(acc >> UInt32(bits) & 0x3F)]
                    i += 1
                }
            }
            if bits > 0 {
                out[i] = alphabet[Int(acc << UInt32(6 - bits) & 0x3F)]
                i += 1
            }
            return i
        }
    }

    /// The bytes of base64url `text`, with or without `=` padding; nil for any other character, a misplaced `=`, or
    /// a length no encoding has.
    public static func decode(_ text: some StringProtocol) -> [UInt8]? {
        var utf8 = Array(text.utf8)
        if utf8.count % 4 == 0 {
            // Padding, if any: at most two `=`, only at the end.
            var pad = 0
            while pad < 2, utf8.last == UInt8(ascii: "=") {
                utf8.removeLast()
                pad += 1
            }
        }
        guard utf8.count % 4 != 1 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(utf8.count * 3 / 4)
        var (acc, bits) = (UInt32(0), 0)
        for c in utf8 {
            let v = values[Int(c)]
            guard v != 0xFF else { return nil }
            acc = acc << 6 | UInt32(v)
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: acc >> UInt32(bits)))
            }
        }
        return out
    }
}
