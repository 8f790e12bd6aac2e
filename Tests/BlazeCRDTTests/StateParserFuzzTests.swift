import BlazeCRDT
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

/// Seeded fuzzing of the stored-state parser: states as a crafted file or a damaged disk could hold them never trap
/// the decoder, and whatever decodes is within bounds and encodes back to a state that decodes the same.
@Suite struct StateParserFuzz {
    static let extremes: [String] = [
        "-1", "0", "2", "9223372036854775807", "-9223372036854775808", "281474976710657", "1e400", "1.5", "\"x\"",
        "null", "[]", "{}", "true", "[1]", "[-1,0,1,0]", "[0,\"zz\",1,0]", "[1,0,0,0]", "[1,0,4611686018427387904,0]",
    ]

    /// A document state with plain writes, a counter, a set and a conflict, from changes of two origins.
    static func sampleState(_ rng: inout SeededRandom) -> DocumentState {
        let a = NodeID(bytes: (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) })
        let b = NodeID(bytes: (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) })
        let key = DocKey(collection: "c", id: "d")
        var state = DocumentState()
        let c1 = Change(origin: a, seq: 1, hlc: HLC(milliseconds: 1_000), deps: VersionVector(), ops: [])
        state.apply(DocOp(key: key, cl: 1, set: ["x": 1, "s": ["a"], "n": 5]), change: c1, index: 0)
        let c2 = Change(origin: b, seq: 1, hlc: HLC(milliseconds: 1_001), deps: VersionVector([a: 1]), ops: [])
        state.apply(DocOp(key: key, cl: 1, set: ["y": "z"], incr: ["n": 2], add: ["s": ["b"]]), change: c2, index: 0)
        let c3 = Change(origin: a, seq: 2, hlc: HLC(milliseconds: 1_002), deps: VersionVector([a: 1]), ops: [])
        state.apply(DocOp(key: key, cl: 1, set: ["y": .int(Int64.random(in: 0...9, using: &rng))]), change: c3, index: 0)
        return state
    }

    @Test func mutatedStoredStatesNeverTrapAndWhatDecodesIsBoundedAndStable() throws {
        let seed = testSeed("state parser fuzz")
        var rng = SeededRandom(seed: seed)
        var decoded = 0
        for _ in 0..<20_000 {
            let state = Self.sampleState(&rng)
            let body = state.materialize(id: "d")
            var text = Array(state.compactText.utf8)
            // Replace a number, a string or a bracketed value with an extreme, or damage bytes.
            for _ in 0..<Int.random(in: 1...3, using: &rng) {
                let at = Int.random(in: 0..<text.count, using: &rng)
                if Bool.random(using: &rng) {
                    var end = at
                    while end < text.count, !",]}".utf8.contains(text[end]) { end += 1 }
                    text.replaceSubrange(at..<end, with: Array(Self.extremes.randomElement(using: &rng)!.utf8))
                } else {
                    text[at] = UInt8.random(in: 0...255, using: &rng)
                }
            }
            guard let json = try? JSONParser(maxDepth: 64).parse(text),
                let parsed = try? DocumentState(compact: json, body: body)
            else { continue }
            decoded += 1
            #expect(parsed.cl >= 0 && parsed.cl <= ChangeBounds.maxCausalLength)
            #expect(parsed.maxClock.raw < ChangeBounds.maxClock)
            // Encoding what decoded and decoding it again gives the same state.
            let again = try DocumentState(
                compact: try JSONParser(maxDepth: 64).parse(parsed.compactText), body: parsed.materialize(id: "d"))
            #expect(again.materialize(id: "d") == parsed.materialize(id: "d"))
        }
        #expect(decoded > 100, "too few mutated states decoded to test the round trip (\(decoded))")
    }
}
