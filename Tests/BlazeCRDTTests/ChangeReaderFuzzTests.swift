import BlazeCRDT
import BlazeProtocol
import BlazeTestSupport
import Testing

/// Seeded fuzzing of the change text reader (how every change a peer sends is decoded) against the tree decoder:
/// for any text, both accept it or both refuse it, and what they accept is the same change.
@Suite struct ChangeReaderFuzz {
    static let extremes: [String] = [
        "-1", "0", "9223372036854775807", "1e400", "1.5", "\"x\"", "null", "[]", "{}", "true", "[1]", "{\"a\":1}",
        "{\"a\":1,\"a\":2}", "\"00000000000000000000000000000001\"", "[[1]]", "{\"x\":[]}",
    ]

    /// A change with every kind of op and each part of a document op.
    static func sampleChange(_ rng: inout SeededRandom) -> Change {
        let a = NodeID(bytes: (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) })
        let b = NodeID(bytes: (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) })
        let key = DocKey(collection: "c", id: "d\(Int.random(in: 0...9, using: &rng))")
        let ops: [CRDTOp] = [
            .doc(
                DocOp(
                    key: key, cl: 1, set: ["x": .int(Int64.random(in: -5...5, using: &rng)), "o": ["p": [1, "q"]]],
                    unset: ["u"], incr: ["n": 2], add: ["s": ["a", 1]], remove: ["s": ["b"]])),
            .delete(DocKey(collection: "c", id: "e"), cl: 2),
            .index(name: "by_x", collection: "c", fields: ["x"]),
            .index(name: "v", collection: "c", fields: nil, vector: IndexVector(dimensions: 3, metric: "l2")),
        ]
        return Change(
            origin: a, seq: UInt64.random(in: 1...1000, using: &rng), hlc: HLC(milliseconds: 1_000),
            deps: VersionVector([b: 3]), ops: ops.shuffled(using: &rng))
    }

    @Test func theTextReaderAndTheTreeDecoderAgreeOnEveryText() throws {
        var rng = SeededRandom(seed: testSeed("change reader fuzz"))
        var accepted = 0
        for round in 0..<20_000 {
            let change = Self.sampleChange(&rng)
            var text = Array(change.jsonValue.jsonText.utf8)
            // Untouched, then with a number, a string or a bracketed value replaced by an extreme, or bytes damaged.
            damage(&text, times: round % 4 == 0 ? 0 : Int.random(in: 1...3, using: &rng), extremes: Self.extremes, using: &rng)
            let tree = try? Change(json: try JSONParser(maxDepth: 8).parse(text))
            let direct = try? Change(text: text, maxDepth: 8)
            #expect(tree == direct, "\(String(decoding: text, as: UTF8.self))")
            if round % 4 == 0 { #expect(direct == change) } else { accepted += direct == nil ? 0 : 1 }
        }
        #expect(accepted > 100, "too few damaged texts accepted to compare the changes read (\(accepted))")
    }

    /// A key given twice is refused by both, in a change, in an op, and among many keys; unknown keys are ignored.
    @Test func duplicateKeysAreRefusedAndUnknownOnesIgnored() throws {
        let head = #"{"d":{},"h":1,"o":"01010101010101010101010101010101","s":1,"x":[{"c":"c","i":"d","k":"doc","l":1,"#
        let many = (0..<20).map { "\"u\($0)\":1," }.joined()
        let texts = [
            head + #""set":{"a":1},"set":{"a":2}}]}"#, head + #""set":{"a":1}}],"s":1}"#,
            head + many + #""u7":2,"set":{"a":1}}]}"#, head + many + #""set":{"a":1}}]}"#,
        ]
        for (n, text) in texts.enumerated() {
            let bytes = Array(text.utf8)
            let tree = try? Change(json: try JSONParser(maxDepth: 8).parse(bytes))
            let direct = try? Change(text: bytes, maxDepth: 8)
            #expect(tree == direct, "\(text)")
            #expect((direct != nil) == (n == 3), "\(text)")
        }
    }

    /// Nesting deeper than the limit is refused by both, at the same depth.
    @Test func theDepthLimitIsTheParsers() throws {
        let key = DocKey(collection: "c", id: "d")
        var value: JSONValue = 1
        for _ in 0..<5 { value = .array([value]) }
        let change = Change(
            origin: NodeID(bytes: Array(repeating: 1, count: 16)), seq: 1, hlc: HLC(milliseconds: 1), deps: VersionVector(),
            ops: [.doc(DocOp(key: key, cl: 1, set: ["v": value]))])
        let text = Array(change.jsonValue.jsonText.utf8)
        for depth in 6...12 {
            let tree = try? Change(json: try JSONParser(maxDepth: depth).parse(text))
            #expect((try? Change(text: text, maxDepth: depth)) == tree, "depth \(depth)")
            #expect((tree == nil) == (depth < 9), "depth \(depth)")
        }
    }
}
