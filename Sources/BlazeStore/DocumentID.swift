import Foundation
import Synchronization

/// Generates UUIDv7-style ids: 48-bit Unix milliseconds, a 12-bit in-millisecond counter, then random bits.
///
/// Ids made by one process sort in creation order as strings (lowercase hex in fixed positions).
public enum DocumentID {
    private static let state = Mutex<(ms: UInt64, counter: UInt16)>((0, 0))

    /// A new id such as `0193a1c2-7f3e-7000-8a1b-3c4d5e6f7a8b`.
    public static func generate() -> String {
        let now = UInt64(Date().timeIntervalSince1970 * 1000)
        let (ms, counter) = state.withLock { s -> (UInt64, UInt16) in
            if now > s.ms {
                s = (now, 0)
            } else if s.counter < 0xFFF {
                s.counter += 1
            } else {
                s = (s.ms + 1, 0)
            }
            return s
        }
        var bytes = [UInt8](repeating: 0, count: 16)
        for i in 0..<6 { bytes[i] = UInt8(truncatingIfNeeded: ms >> (40 - 8 * UInt64(i))) }
        bytes[6] = 0x70 | UInt8(counter >> 8)
        bytes[7] = UInt8(truncatingIfNeeded: counter)
        // One 64-bit draw (a single `getrandom`); eight `UInt8` draws made eight system calls per id.
        var rng = SystemRandomNumberGenerator()
        let random: UInt64 = rng.next()
        for i in 8..<16 { bytes[i] = UInt8(truncatingIfNeeded: random >> (8 * UInt64(i - 8))) }
        bytes[8] = 0x80 | (bytes[8] & 0x3F)
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(36)
        for (i, b) in bytes.enumerated() {
            if i == 4 || i == 6 || i == 8 || i == 10 { out.append(UInt8(ascii: "-")) }
            out.append(digits[Int(b >> 4)])
            out.append(digits[Int(b & 0xF)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}
