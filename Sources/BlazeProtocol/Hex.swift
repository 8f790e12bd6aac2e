/// Lowercase hex of `bytes`.
public func hexString(_ bytes: some Collection<UInt8>) -> String {
    String(unsafeUninitializedCapacity: bytes.count * 2) { out in
        var i = 0
        for b in bytes {
            out[i] = hexDigit(b >> 4)
            out[i + 1] = hexDigit(b & 0xF)
            i += 2
        }
        return i
    }
}

/// The lowercase hex digit of a nibble (0...15).
@inline(__always) public func hexDigit(_ nibble: UInt8) -> UInt8 {
    nibble < 10 ? nibble &+ 48 : nibble &+ 87
}

/// The bytes of a hex string, or nil when it is not an even-length string of lowercase hex digits.
public func hexBytes(_ text: String) -> [UInt8]? {
    let utf8 = Array(text.utf8)
    guard utf8.count % 2 == 0 else { return nil }
    func nibble(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
        default: return nil
        }
    }
    var out: [UInt8] = []
    out.reserveCapacity(utf8.count / 2)
    var i = 0
    while i < utf8.count {
        guard let hi = nibble(utf8[i]), let lo = nibble(utf8[i + 1]) else { return nil }
        out.append(hi << 4 | lo)
        i += 2
    }
    return out
}
