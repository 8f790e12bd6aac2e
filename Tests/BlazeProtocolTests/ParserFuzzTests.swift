import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

/// Seeded fuzzing of the RPC line decoder: mutated request lines never trap, and whatever parses round-trips.
@Suite struct ParserFuzz {
    static let corpus: [String] = [
        #"{"jsonrpc":"2.0","id":1,"method":"doc.get","params":{"db":"a","collection":"c","id":"x"}}"#,
        #"[{"jsonrpc":"2.0","id":"a","method":"db.list"},{"jsonrpc":"2.0","method":"daemon.info","params":{}}]"#,
        #"{"jsonrpc":"2.0","id":2,"method":"doc.insert","params":{"db":"d","collection":"c","doc":{"n":-0.0,"s":"é\u0301","a":[1,2.5e-3,true,null,{"k":[]}]}}}"#,
        #"{"jsonrpc":"2.0","id":3,"method":"query.find","params":{"where":{"$or":[{"n":{"$gte":1e10}},{"t":{"$prefix":"\ud83d\ude00"}}]}}}"#,
    ]
    static let fragments: [[UInt8]] = [
        Array("{".utf8), Array("}".utf8), Array("[".utf8), Array("]".utf8), Array("\"".utf8), Array("\\".utf8),
        Array("\\u".utf8), Array("\\ud800".utf8), Array("1e400".utf8), Array("1e-400".utf8), Array("-".utf8),
        Array("18446744073709551616".utf8), Array(",".utf8), Array(":".utf8), [0xFF], [0xC0, 0x80], [0xED, 0xA0, 0x80],
        [0], Array(String(repeating: "[", count: 100).utf8), Array("null".utf8), Array("4.9e-324".utf8),
    ]

    @Test func mutatedRequestLinesNeverTrapAndWhatParsesRoundTrips() throws {
        let seed = testSeed("RPC parser fuzz")
        var rng = SeededRandom(seed: seed)
        var parsed = 0
        for line in Self.corpus {
            guard case .single = RPCCodec.decode(line: Array(line.utf8), maxDepth: 64, maxBatch: 256) else {
                if !line.hasPrefix("[") { Issue.record("a valid line did not decode: \(line)") }
                continue
            }
        }
        for _ in 0..<50_000 {
            var bytes = Array(Self.corpus.randomElement(using: &rng)!.utf8)
            for _ in 0..<Int.random(in: 1...4, using: &rng) {
                let at = Int.random(in: 0...bytes.count, using: &rng)
                switch Int.random(in: 0..<4, using: &rng) {
                case 0 where at < bytes.count: bytes[at] = UInt8.random(in: 0...255, using: &rng)
                case 1: bytes.insert(contentsOf: Self.fragments.randomElement(using: &rng)!, at: at)
                case 2 where at < bytes.count: bytes.removeSubrange(at..<min(bytes.count, at + Int.random(in: 1...8, using: &rng)))
                default: bytes = Array(bytes.prefix(at))
                }
            }
            _ = RPCCodec.decode(line: bytes, maxDepth: 64, maxBatch: 256)
            if let value = try? JSONParser(maxDepth: 64).parse(bytes) {
                parsed += 1
                // What the parser accepts is written back canonically and reads back as the same value.
                let again = try JSONParser(maxDepth: 64).parse(value.jsonText)
                #expect(again == value, "round trip of \(String(decoding: bytes, as: UTF8.self))")
            }
        }
        #expect(parsed > 100, "the mutations left too few parseable lines to test the round trip (\(parsed))")
    }
}
