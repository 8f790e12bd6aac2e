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
        var readBoth = 0
        for _ in 0..<20_000 {
            let state = Self.sampleState(&rng)
            let body = state.materialize(id: "d")
            var text = Array(state.compactText.utf8)
            // Replace a number, a string or a bracketed value with an extreme, or damage bytes.
            damage(&text, times: Int.random(in: 1...3, using: &rng), extremes: Self.extremes, using: &rng)
            // The text reader accepts no more than the tree reader, and reads the same state from what it accepts
            // (of texts that are valid UTF-8: a `String` holds nothing else).
            let direct = String(validating: text, as: UTF8.self).flatMap { try? DocumentState(compactText: $0, body: body) }
            guard let json = try? JSONParser(maxDepth: 64).parse(text),
                let parsed = try? DocumentState(compact: json, body: body)
            else {
                #expect(direct == nil, "the text reader accepted \(String(decoding: text, as: UTF8.self))")
                continue
            }
            if let direct { #expect(direct == parsed) }
            readBoth += direct == nil ? 0 : 1
            decoded += 1
            #expect(parsed.cl >= 0 && parsed.cl <= ChangeBounds.maxCausalLength)
            #expect(parsed.maxClock.raw < ChangeBounds.maxClock)
            // Encoding what decoded and decoding it again gives the same state.
            let again = try DocumentState(
                compact: try JSONParser(maxDepth: 64).parse(parsed.compactText), body: parsed.materialize(id: "d"))
            #expect(again.materialize(id: "d") == parsed.materialize(id: "d"))
        }
        #expect(decoded > 100, "too few mutated states decoded to test the round trip (\(decoded))")
        #expect(readBoth > 100, "too few mutated states read by both readers (\(readBoth))")
    }

    /// The text reader refuses what no writer produces and the tree reader let through (a part of the wrong type, a
    /// field named twice, a duplicate key), accepts whitespace anywhere JSON allows it, and reads both origin forms.
    @Test func theTextReaderIsStrictWhereTheTreeReaderWasLenient() throws {
        let home = NodeID(bytes: Array(repeating: 7, count: 16))
        let coding = StampCoding(home: home)
        let body: [String: JSONValue] = ["_id": "d", "a": 1, "b": "x"]
        let good = #"{"f":{"b":{"w":[[5,"0102030405060708090a0b0c0d0e0f10",1,0],"x"],"x":[[[4,0,2,0],"y"]]}},"l":1,"t":[3,0,1,0]}"#
        let spaced = " { \"l\" : 1 ,\n \"t\" : [ 3 , 0 , 1 , 0 ] , \"f\" : { \"b\" : { \"x\" : [ [ [ 4 , 0 , 2 , 0 ] , \"y\" ] ] , \"w\" : [ [ 5 , \"0102030405060708090a0b0c0d0e0f10\" , 1 , 0 ] , \"x\" ] } } } "
        let expected = try DocumentState(compact: try JSONParser().parse(good), body: body, coding)
        #expect(try DocumentState(compactText: good, body: body, coding) == expected)
        #expect(try DocumentState(compactText: spaced, body: body, coding) == expected)
        #expect(expected.fields["b"]?.losers.first?.stamp.dot.origin == home)
        #expect(expected.fields["a"]?.winner?.value == 1)
        let lenient = [
            #"{"f":{"b":5},"l":1,"t":[3,0,1,0]}"#,  // a field state that is not an object
            #"{"f":[],"l":1,"t":[3,0,1,0]}"#,  // "f" not an object
            #"{"l":1,"t":[3,0,1,0],"u":["a",2]}"#,  // a name that is not a string
            #"{"f":{"b":{"c":{}}},"l":1,"t":[3,0,1,0]}"#,  // increments not an array
        ]
        for text in lenient {
            #expect(throws: (any Error).self, "\(text)") { try DocumentState(compactText: text, body: body, coding) }
            #expect((try? DocumentState(compact: try JSONParser().parse(text), body: body, coding)) != nil, "\(text)")
        }
        let refused = [
            #"{"l":1,"l":1,"t":[3,0,1,0]}"#, #"{"f":{"b":{"w":[[5,0,1,0]],"w":[[5,0,1,0]]}},"l":1,"t":[3,0,1,0]}"#,
            #"{"f":{"b":{"w":[[5,0,1,0]]},"b":{"w":[[5,0,1,0]]}},"l":1,"t":[3,0,1,0]}"#, #"{"l":1,"t":[3,0,1,0],}"#,
            #"{"l":1,"t":[3,0,1,0]"#, #"{"l":1,"t":[3,0,1,0]}x"#, #"{"l":1.0,"t":[3,0,1,0]}"#, #"{"l":1,"t":[3,0,1]}"#,
            #"{"l":1,"t":[3,0,1,0,0]}"#, #"{"l":1,"t":[3,1,1,0]}"#, #"{"l":1,"t":[3,"zz",1,0]}"#, #"{"l":1,"t":[3,0,0,0]}"#,
            #"{"l":-1,"t":[3,0,1,0]}"#, #"{"l":1}"#, #"{"l":1,"n":1,"t":[3,0,1,0]}"#, #"{"l":1,"q":1,"q":2,"t":[3,0,1,0]}"#,
            #"[{"l":1}]"#, #"{"l":1,"t":[3,0,1,0],"f":{"b":{"w":[[5,0,1,0],1,2]}}}"#, #"{"l":1,"n":1,"p":[]}"#,
            #"{"l":1,"qq":1,"t":[3,0,1,0],"qq":2}"#,
            // A duplicate among many keys (past the short list, in the set).
            "{" + (0..<20).map { "\"k\($0)\":1," }.joined() + #""k3":1,"l":1,"t":[3,0,1,0]}"#,
        ]
        for text in refused {
            #expect(throws: (any Error).self, "\(text)") { try DocumentState(compactText: text, body: body, coding) }
            // Whatever the text reader refuses here, the tree reader refuses too (the first four are above).
            #expect((try? DocumentState(compact: try JSONParser().parse(text), body: body, coding)) == nil, "\(text)")
        }
        // Without a home, `0` is no origin.
        #expect(throws: (any Error).self) { try DocumentState(compactText: good, body: body) }
    }
}
