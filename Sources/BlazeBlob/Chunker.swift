import Crypto

/// Content-defined chunking: cuts a byte stream where its content says, so that an edit inside a large file moves
/// only the cuts around it and the other chunks keep their ids (FastCDC's gear hash with normalized chunking).
///
/// A cut is placed after a byte where the rolling gear hash of the bytes before it has chosen bits all zero. The hash
/// takes one shift and one table lookup per byte: `hash = (hash << 1) &+ gear[byte]`, so bit k of the hash depends on
/// the last k + 1 bytes only, and the masks use bits 63 down to about 40 — a window of about 24 to 64 bytes. No cut
/// comes before `minimumSize` (those bytes are skipped, not hashed), a harder mask (more bits) applies before
/// `averageSize` and an easier one after it, which draws chunk sizes close to the average, and a cut is forced at
/// `maximumSize`.
///
/// The gear table is derived from a key (a space's chunking key): two spaces cut the same file at different places,
/// so the sizes of a space's sealed chunks, which a relay or a folder sees, do not tell which known file it holds.
/// Devices of one space derive the same table, so they cut the same file the same way and share its chunks.
public struct Chunker: Sendable {
    /// Chunk size bounds, in bytes.
    public struct Sizes: Sendable, Equatable {
        /// No cut before this many bytes (unless the stream ends).
        public let minimum: Int
        /// The size chunks are drawn towards (a power of two).
        public let average: Int
        /// A cut is forced here.
        public let maximum: Int

        /// Sizes with `minimum <= average <= maximum`, `average` a power of two from 64 bytes to 1 GiB.
        public init(minimum: Int, average: Int, maximum: Int) throws(ChunkerError) {
            guard average >= 64, average <= 1 << 30, average & (average - 1) == 0, minimum >= 1, minimum <= average,
                average <= maximum, maximum <= 1 << 30
            else { throw ChunkerError("chunk sizes must satisfy 1 <= minimum <= average <= maximum <= 1 GiB, average a power of two of at least 64, got \(minimum)/\(average)/\(maximum)") }
            self.minimum = minimum
            self.average = average
            self.maximum = maximum
        }

        /// What blobs use: 256 KiB, 1 MiB, 4 MiB. Part of the chunking format: devices of a space must agree on it.
        public static let standard = try! Sizes(minimum: 256 << 10, average: 1 << 20, maximum: 4 << 20)
    }

    /// The size bounds.
    public let sizes: Sizes
    /// 256 pseudo-random 64-bit values, one per byte value.
    private let gear: [UInt64]
    /// The mask before `sizes.average` (one bit more than the average's bits: cuts are half as likely).
    private let hardMask: UInt64
    /// The mask from `sizes.average` on (one bit fewer: cuts twice as likely).
    ///
    /// One bit each way, not FastCDC's usual two: with two, a cut moved by an edit often fails to fall back in step
    /// with the old cuts (a position's mask depends on its distance from the chunk's start), and an edit in the middle
    /// of random data re-stored up to 12 chunks (1 in 3 edits: 3 or more) in 400 trials; with one bit, at most 5
    /// (1 in 10: 3 or more), for a slightly wider spread of sizes.
    private let easyMask: UInt64

    /// A chunker whose gear table is derived from the 32-byte `key`.
    public init(key: [UInt8], sizes: Sizes = .standard) throws(ChunkerError) {
        guard key.count == 32 else { throw ChunkerError("a chunking key has 32 bytes, got \(key.count)") }
        self.sizes = sizes
        let bytes = HKDF<SHA256>.deriveKey(
            inputKeyMaterial: SymmetricKey(data: key), info: Array("blazedb chunker gear v1".utf8), outputByteCount: 256 * 8)
        gear = bytes.withUnsafeBytes { raw in
            (0..<256).map { i in
                (0..<8).reduce(UInt64(0)) { $0 << 8 | UInt64(raw[i * 8 + $1]) }
            }
        }
        let bits = sizes.average.trailingZeroBitCount
        hardMask = Self.topBits(min(bits + 1, 60))
        easyMask = Self.topBits(max(bits - 1, 1))
    }

    /// A mask of the highest `count` bits of a 64-bit word.
    private static func topBits(_ count: Int) -> UInt64 { ~UInt64(0) << UInt64(64 - count) }

    /// The length of the first chunk of `bytes`: where the content cuts, `sizes.maximum` when it does not cut before,
    /// or nil when `bytes` is shorter than that and may go on (`atEnd` false: give more bytes, from the same start).
    /// At the end of the stream (`atEnd`), the rest is one chunk when no cut comes first; an empty rest gives nil.
    public func firstCut(in bytes: UnsafeRawBufferPointer, atEnd: Bool) -> Int? {
        let count = bytes.count
        if count <= sizes.minimum { return count > 0 && atEnd ? count : nil }
        let normal = min(sizes.average, count)
        let limit = min(sizes.maximum, count)
        var hash: UInt64 = 0
        var i = sizes.minimum
        let found: Int? = gear.withUnsafeBufferPointer { table in
            let table = table.baseAddress!
            let base = bytes.baseAddress!.assumingMemoryBound(to: UInt8.self)
            while i < normal {
                hash = (hash << 1) &+ table[Int(base[i])]
                i += 1
                if hash & hardMask == 0 { return i }
            }
            while i < limit {
                hash = (hash << 1) &+ table[Int(base[i])]
                i += 1
                if hash & easyMask == 0 { return i }
            }
            return nil
        }
        if let found { return found }
        if count >= sizes.maximum { return sizes.maximum }
        return atEnd ? count : nil
    }

    /// The lengths of the chunks of the whole of `bytes` (a convenience for tests and small inputs).
    public func cuts(of bytes: [UInt8]) -> [Int] {
        bytes.withUnsafeBytes { raw in
            var lengths: [Int] = []
            var start = 0
            while let n = firstCut(in: UnsafeRawBufferPointer(rebasing: raw[start...]), atEnd: true) {
                lengths.append(n)
                start += n
            }
            return lengths
        }
    }
}

/// A chunker given bad parameters.
public struct ChunkerError: Error, Sendable, CustomStringConvertible {
    /// What was wrong.
    public let description: String

    /// An error saying `description`.
    init(_ description: String) { self.description = description }
}
