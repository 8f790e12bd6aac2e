#if canImport(Glibc)
import Glibc
#endif

/// SplitMix64: a tiny deterministic generator so every property test can print and replay its seed.
public struct SeededRandom: RandomNumberGenerator {
    /// The generator's state; equal states give equal sequences.
    public var state: UInt64

    /// Starts the sequence for `seed`.
    public init(seed: UInt64) { state = seed }

    /// The next 64 random bits.
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// The seed of a randomized test: `BLAZE_SEED` when set (to replay a failure), else a fresh one; printed with
/// `label` so every run can be replayed.
public func testSeed(_ label: String) -> UInt64 {
    let given = getenv("BLAZE_SEED").flatMap { UInt64(String(cString: $0)) }
    let seed = given ?? UInt64.random(in: 0 ... (.max / 2))
    print("\(label) seed \(seed) (replay with BLAZE_SEED=\(seed))")
    return seed
}

/// Damages a JSON text `times` times for a fuzz test: each time, the value text starting at a random byte (up to the
/// next `,`, `]` or `}`) is replaced by one of `extremes`, or one byte is set to a random value.
public func damage(_ text: inout [UInt8], times: Int, extremes: [String], using rng: inout SeededRandom) {
    for _ in 0..<times {
        let at = Int.random(in: 0..<text.count, using: &rng)
        if Bool.random(using: &rng) {
            var end = at
            while end < text.count, !",]}".utf8.contains(text[end]) { end += 1 }
            text.replaceSubrange(at..<end, with: Array(extremes.randomElement(using: &rng)!.utf8))
        } else {
            text[at] = UInt8.random(in: 0...255, using: &rng)
        }
    }
}
