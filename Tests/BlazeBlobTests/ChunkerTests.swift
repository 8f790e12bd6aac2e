import BlazeTestSupport
import Testing

@testable import BlazeBlob

/// Content-defined chunking: sizes within bounds, cuts that follow the content, the same cuts however the bytes arrive.
@Suite struct ChunkerTests {
    /// `count` random bytes from `random`.
    func bytes(_ count: Int, _ random: inout SeededRandom) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: count)
        var i = 0
        while i < count {
            let word = random.next()
            for k in 0..<min(8, count - i) { out[i + k] = UInt8(truncatingIfNeeded: word >> (8 * UInt64(k))) }
            i += 8
        }
        return out
    }

    /// Small sizes so that a test's few MiB hold hundreds of chunks.
    let small = try! Chunker.Sizes(minimum: 2 << 10, average: 8 << 10, maximum: 32 << 10)

    /// The starting offsets of the chunks whose lengths are `cuts`.
    func starts(_ cuts: [Int]) -> [Int] {
        var offset = 0
        return cuts.map { n in
            defer { offset += n }
            return offset
        }
    }

    @Test func chunksCoverTheInputWithinTheirBoundsAndNearTheAverage() throws {
        var random = SeededRandom(seed: testSeed("chunk sizes"))
        let chunker = try Chunker(key: [UInt8](repeating: 7, count: 32), sizes: small)
        let input = bytes(4 << 20, &random)
        let cuts = chunker.cuts(of: input)
        #expect(cuts.reduce(0, +) == input.count)
        #expect(cuts.dropLast().allSatisfy { $0 >= small.minimum && $0 <= small.maximum })
        #expect(cuts.last! <= small.maximum && cuts.last! > 0)
        // Normalized chunking draws sizes towards the average: on random data the mean lands within a factor of 1.5
        // of it (about 1.1× the average with these masks; 4 MiB gives ~460 chunks).
        let mean = Double(input.count) / Double(cuts.count)
        #expect(mean > Double(small.average) / 1.5 && mean < Double(small.average) * 1.5, "mean chunk \(mean) bytes")
        // Content cuts, not forced ones, for nearly every chunk.
        #expect(cuts.filter { $0 == small.maximum }.count < cuts.count / 20)
    }

    @Test func theSameBytesGiveTheSameCutsHoweverTheyArrive() throws {
        var random = SeededRandom(seed: testSeed("chunk stream"))
        let chunker = try Chunker(key: [UInt8](repeating: 1, count: 32), sizes: small)
        let input = bytes(1 << 20, &random)
        let whole = chunker.cuts(of: input)
        // Fed in pieces of random sizes, giving more bytes from the same start whenever no cut is decided.
        var streamed: [Int] = []
        var start = 0
        var available = 0
        while start < input.count {
            available = min(input.count, available + Int(random.next() % UInt64(small.maximum)) + 1)
            let atEnd = available == input.count
            let cut = input.withUnsafeBytes { raw in
                chunker.firstCut(in: UnsafeRawBufferPointer(rebasing: raw[start..<available]), atEnd: atEnd)
            }
            if let cut {
                streamed.append(cut)
                start += cut
            }
        }
        #expect(streamed == whole)
    }

    @Test func anEditMovesOnlyTheCutsAroundIt() throws {
        var random = SeededRandom(seed: testSeed("chunk edit"))
        // Over 20 files and keys: replace 1,000 bytes in the middle with 3,000, and count the chunks of the edited
        // file that the original did not have (chunks are identified by content).
        var changedCounts: [Int] = []
        for _ in 0..<20 {
            let chunker = try Chunker(key: bytes(32, &random), sizes: small)
            let input = bytes(1 << 20, &random)
            var edited = input
            let middle = input.count / 2
            edited.replaceSubrange(middle..<(middle + 1000), with: bytes(3000, &random))
            let before = chunker.cuts(of: input)
            let after = chunker.cuts(of: edited)
            let old = Set(zip(starts(before), before).map { Array(input[$0..<($0 + $1)]) })
            let new = zip(starts(after), after).map { Array(edited[$0..<($0 + $1)]) }
            changedCounts.append(new.filter { !old.contains($0) }.count)
        }
        // The edit touches one chunk, or two when it straddles a cut, and a moved cut sometimes shifts the next few
        // before the chunks fall back in step (in 400 trials: 1 chunk 57 %, 2 32 %, 3 8 %, at most 5). A chunker
        // that did not resynchronize would re-store the ~60 chunks after the edit.
        let mean = Double(changedCounts.reduce(0, +)) / Double(changedCounts.count)
        #expect(changedCounts.allSatisfy { $0 >= 1 && $0 <= 10 }, "chunks changed per edit: \(changedCounts)")
        #expect(mean <= 2.5, "chunks changed per edit: \(changedCounts)")
    }

    @Test func keysChooseDifferentCuts() throws {
        var random = SeededRandom(seed: testSeed("chunk keys"))
        let input = bytes(1 << 20, &random)
        let a = try Chunker(key: [UInt8](repeating: 1, count: 32), sizes: small).cuts(of: input)
        let b = try Chunker(key: [UInt8](repeating: 2, count: 32), sizes: small).cuts(of: input)
        let again = try Chunker(key: [UInt8](repeating: 1, count: 32), sizes: small).cuts(of: input)
        #expect(a == again)
        // Two keys share a cut only by chance (a few of ~120 at most, where a forced cut or a common prefix lines up).
        let shared = Set(starts(a)).intersection(starts(b)).subtracting([0])
        #expect(shared.count < a.count / 4, "\(shared.count) of \(a.count) cuts shared")
    }

    @Test func shortAndEmptyInputs() throws {
        let chunker = try Chunker(key: [UInt8](repeating: 0, count: 32), sizes: small)
        #expect(chunker.cuts(of: []) == [])
        #expect(chunker.cuts(of: [42]) == [1])
        let short = [UInt8](repeating: 9, count: small.minimum)
        #expect(chunker.cuts(of: short) == [small.minimum])
        // Constant bytes never cut by content: every chunk is the maximum, the rest last.
        let flat = [UInt8](repeating: 0, count: small.maximum * 2 + 5)
        #expect(chunker.cuts(of: flat) == [small.maximum, small.maximum, 5])
        // Not at the end, a short input asks for more.
        short.withUnsafeBytes { #expect(chunker.firstCut(in: $0, atEnd: false) == nil) }
    }

    @Test func badParametersAreRefused() {
        #expect(throws: ChunkerError.self) { try Chunker(key: [1, 2, 3]) }
        #expect(throws: ChunkerError.self) { try Chunker.Sizes(minimum: 10, average: 1000, maximum: 4000) }  // not 2^n
        #expect(throws: ChunkerError.self) { try Chunker.Sizes(minimum: 2048, average: 1024, maximum: 4096) }
        #expect(throws: ChunkerError.self) { try Chunker.Sizes(minimum: 0, average: 1024, maximum: 4096) }
        #expect(throws: ChunkerError.self) { try Chunker.Sizes(minimum: 1, average: 1024, maximum: 512) }
        #expect(throws: ChunkerError.self) { try Chunker.Sizes(minimum: 1, average: 1024, maximum: 2 << 30) }
    }
}
