import BlazeTestSupport
import Foundation
import Testing

@testable import BlazeProtocol

/// Bitwise equality: distinguishes -0.0 from 0.0 and int from double, which `==` on doubles does not.
func identical(_ a: JSONValue, _ b: JSONValue) -> Bool {
    switch (a, b) {
    case (.double(let x), .double(let y)): return x.bitPattern == y.bitPattern
    case (.string(let x), .string(let y)): return utf8Equal(x, y)
    case (.array(let x), .array(let y)): return x.count == y.count && zip(x, y).allSatisfy(identical)
    case (.object(let x), .object(let y)):
        return x.count == y.count && x.allSatisfy { k, v in y[k].map { identical(v, $0) } ?? false }
    default: return a == b
    }
}

func randomValue(_ rng: inout SeededRandom, depth: Int = 0) -> JSONValue {
    let pick = Int.random(in: 0..<(depth > 3 ? 6 : 9), using: &rng)
    switch pick {
    case 0: return .null
    case 1: return .bool(Bool.random(using: &rng))
    case 2:
        let specials: [Int64] = [0, -1, 1, Int64.max, Int64.min, 1 << 53, (1 << 53) + 1, -(1 << 53) - 1]
        return .int(Bool.random(using: &rng) ? specials.randomElement(using: &rng)! : Int64.random(in: .min ... .max, using: &rng))
    case 3:
        let specials: [Double] = [
            0.0, -0.0, .leastNonzeroMagnitude, -.leastNonzeroMagnitude, 2.2250738585072014e-308, 1.7976931348623157e308, 0.1, 1.0, -1.5, 1e16, 1e-7,
            123456789.123456789, Double.ulpOfOne,
        ]
        if Bool.random(using: &rng) { return .double(specials.randomElement(using: &rng)!) }
        var d: Double
        repeat { d = Double(bitPattern: rng.next()) } while !d.isFinite
        return .double(d)
    case 4, 5:
        let pieces = ["a", "é", "e\u{301}", "\"", "\\", "\n", "\u{0}", "\u{1F}", "日本", "😀", " ", "/", "\u{2028}", "\u{7F}"]
        return .string((0..<Int.random(in: 0..<6, using: &rng)).map { _ in pieces.randomElement(using: &rng)! }.joined())
    case 6, 7:
        return .array((0..<Int.random(in: 0..<4, using: &rng)).map { _ in randomValue(&rng, depth: depth + 1) })
    default:
        var o: [String: JSONValue] = [:]
        for _ in 0..<Int.random(in: 0..<4, using: &rng) {
            o[["k", "é", "_id", "a.b", "", "x\"y"].randomElement(using: &rng)! + String(Int.random(in: 0..<3, using: &rng))] =
                randomValue(&rng, depth: depth + 1)
        }
        return .object(o)
    }
}

@Suite struct JSONRoundTrip {
    @Test func randomValuesRoundTripExactly() throws {
        let seed = testSeed("JSON round trip")
        var rng = SeededRandom(seed: seed)
        for i in 0..<20_000 {
            let value = randomValue(&rng)
            let text = value.jsonText
            let back = try JSONParser(maxDepth: 100).parse(text)
            #expect(identical(back, value), "seed \(seed) (replay: BLAZE_SEED=\(seed)) case \(i): \(text)")
            #expect(back.jsonText == text, "canonical text must be stable; seed \(seed) case \(i)")
        }
    }

    @Test(arguments: [
        ("-0.0", JSONValue.double(-0.0)), ("0", .int(0)), ("-0", .int(0)), ("1.0", .double(1.0)),
        ("9223372036854775807", .int(.max)), ("-9223372036854775808", .int(.min)),
        ("9007199254740993", .int(9_007_199_254_740_993)), ("5e-324", .double(.leastNonzeroMagnitude)), ("1E2", .double(100)),
        ("0e-400", .double(0)), ("\"\\ud83d\\ude00\"", .string("😀")), ("\"e\u{301}\"", .string("e\u{301}")),
    ])
    func parsesNumbersAndStringsExactly(text: String, expected: JSONValue) throws {
        #expect(identical(try JSONParser().parse(text), expected))
    }

    @Test func doublesStayDoublesAndIntegersStayIntegers() throws {
        #expect(JSONValue.double(1).jsonText == "1.0")
        #expect(JSONValue.double(-0.0).jsonText == "-0.0")
        #expect(JSONValue.int(1).jsonText == "1")
        for i: Int64 in [0, -1, 9, 10, -10, 1_000_000, .max, .min, .max - 1, .min + 1] {
            #expect(JSONValue.int(i).jsonText == String(i), "integer \(i)")
        }
        #expect(try JSONParser().parse(JSONValue.double(1e300).jsonText) == .double(1e300))
    }

    /// The member scan finds exactly the object's members, each value's text parsing back to that value; it refuses
    /// escaped keys and anything that is not one object.
    @Test func memberScanFindsEveryValue() throws {
        var rng = SeededRandom(seed: 11)
        var scanned = 0
        for _ in 0..<3_000 {
            var o: [String: JSONValue] = [:]
            for _ in 0..<Int.random(in: 0..<6, using: &rng) { o["k\(Int.random(in: 0..<9, using: &rng))é"] = randomValue(&rng) }
            let text = JSONValue.object(o).jsonText
            let bytes = Array(text.utf8)
            guard let members = bytes.withUnsafeBufferPointer({ JSONScan.members($0) }) else {
                #expect(o.keys.contains { $0.contains("\"") }, "scan refused \(text)")
                continue
            }
            scanned += 1
            #expect(members.map(\.key) == o.keys.sorted(by: utf8Less))
            for m in members {
                let value = try JSONParser().parse(String(decoding: bytes[m.value], as: UTF8.self))
                #expect(identical(value, o[m.key]!), "\(m.key) in \(text)")
            }
        }
        #expect(scanned > 2_000)
        for bad in [#"[1]"#, #"{"a":1"#, #"{"a\"b":1}"#, #"{"a":1} x"#, #"{"a":}"#, #"{"a":"x}"#, "", #"{"a":[1,{"b":2}}"#] {
            #expect(Array(bad.utf8).withUnsafeBufferPointer { JSONScan.members($0) } == nil, "\(bad)")
        }
    }

    /// The byte-wise comparison agrees with comparing UTF-8 code units one by one, prefixes and non-ASCII included.
    @Test func utf8OrderMatchesCodeUnitOrder() {
        var rng = SeededRandom(seed: 7)
        let alphabet: [String] = ["", "a", "b", "_", "A", "é", "e\u{301}", "\u{10FFFF}", "~", "0"]
        for _ in 0..<5_000 {
            let a = (0..<Int.random(in: 0...3, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }.joined()
            let b = (0..<Int.random(in: 0...3, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }.joined()
            #expect(utf8Less(a, b) == a.utf8.lexicographicallyPrecedes(b.utf8), "\(a.debugDescription) < \(b.debugDescription)")
        }
    }

    @Test func orderedIndicesFollowUTF8Order() {
        var rng = SeededRandom(seed: 11)
        // Long shared prefixes (the first eight bytes tie), NUL (ties with the zero padding), multi-byte characters.
        let alphabet: [String] = ["", "a", "b", "\u{0}", "é", "\u{10FFFF}", "longprefix", "longprefi", "_id", "~"]
        for _ in 0..<2_000 {
            var d: [String: JSONValue] = [:]
            for _ in 0..<Int.random(in: 0...40, using: &rng) {
                let key = (0..<Int.random(in: 0...3, using: &rng)).map { _ in alphabet.randomElement(using: &rng)! }.joined()
                d[key] = .int(Int64(d.count))
            }
            let expected = d.keys.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
            #expect(d.utf8OrderedIndices.map { d[$0].key } == expected, "\(expected)")
        }
    }

    @Test func objectKeysSerializeSortedByUTF8() {
        let v: JSONValue = ["b": 1, "a": 2, "é": 3, "Z": 4]
        #expect(v.jsonText == #"{"Z":4,"a":2,"b":1,"é":3}"#)
    }

    @Test func integersOfEveryLengthParseAsTheStandardLibraryReadsThem() throws {
        // Up to 18 digits the parser reads them itself; from 19 on (where Int64 can overflow) `Int64(_:)` does.
        var rng = SeededRandom(seed: testSeed("JSON integers"))
        var texts = ["0", "-0", "9223372036854775807", "-9223372036854775808", "999999999999999999", "-999999999999999999",
            "1000000000000000000", "-1000000000000000000"]
        for digits in 1...19 {
            for _ in 0..<20 {
                let magnitude = String(UInt64.random(in: 1...9, using: &rng)) + String((1..<digits).map { _ in Character(String(Int.random(in: 0...9, using: &rng))) })
                texts.append(magnitude)
                texts.append("-" + magnitude)
            }
        }
        for text in texts {
            if let want = Int64(text) {
                #expect(try JSONParser().parse(text) == .int(want), "\(text)")
                #expect(try JSONParser().parse("[\(text),\(text)]") == .array([.int(want), .int(want)]), "\(text)")
            } else {
                #expect(throws: JSONParseError.self, "\(text)") { try JSONParser().parse(text) }
            }
        }
        for text in ["9223372036854775808", "-9223372036854775809", "99999999999999999999"] {
            #expect(throws: JSONParseError.self, "\(text)") { try JSONParser().parse(text) }
        }
    }

    @Test(arguments: ["0e-400", "-0.000e5", "4.9e-324", "2.2250738585072014e-308"])
    func zerosAndSubnormalsAreNumbersNotUnderflows(text: String) throws {
        guard case .double(let d) = try JSONParser().parse(text) else { Issue.record("not a double"); return }
        #expect(d == Double(text))
    }

    @Test(arguments: [
        ("1e400", "number_range"), ("-1e400", "number_range"), ("18446744073709551616", "number_range"),
        ("1e-400", "number_range"), ("-0.0001e-320", "number_range"),
        ("[1,]", "syntax"), ("{\"a\" 1}", "syntax"), ("01", "syntax"), ("1.", "syntax"), ("NaN", "syntax"),
        ("Infinity", "syntax"), ("\"\\ud800\"", "invalid_utf8"), ("\"\\udc00x\"", "invalid_utf8"),
        ("{\"a\":1,\"a\":2}", "duplicate_key"), ("\"a\u{1}\"", "syntax"), ("[1] x", "syntax"), ("", "syntax"),
        ("tru", "syntax"), ("\"\\x\"", "syntax"),
    ])
    func rejectsInvalidJSON(text: String, kind: String) {
        #expect(throws: JSONParseError.self) { try JSONParser().parse(text) }
        do {
            _ = try JSONParser().parse(text)
        } catch {
            #expect(error.kind == kind, "\(text): \(error.message)")
        }
    }

    @Test func rejectsInvalidUTF8InStrings() {
        for bytes: [UInt8] in [[0x22, 0xFF, 0x22], [0x22, 0xC3, 0x22], [0x22, 0xED, 0xA0, 0x80, 0x22], [0xC3, 0xA9]] {
            do {
                _ = try JSONParser().parse(bytes)
                Issue.record("accepted invalid UTF-8 \(bytes)")
            } catch {
                #expect(["invalid_utf8", "syntax"].contains(error.kind))
            }
        }
    }

    @Test func enforcesNestingDepth() throws {
        let ok = String(repeating: "[", count: 64) + String(repeating: "]", count: 64)
        #expect(try JSONParser(maxDepth: 64).parse(ok).depth == 64)
        let deep = String(repeating: "[", count: 65) + String(repeating: "]", count: 65)
        #expect(throws: JSONParseError.self) { try JSONParser(maxDepth: 64).parse(deep) }
        // A huge nesting attempt fails fast instead of overflowing the stack.
        let huge = String(repeating: "{\"a\":", count: 100_000)
        #expect(throws: JSONParseError.self) { try JSONParser(maxDepth: 64).parse(huge) }
    }
}

@Suite struct RPCDecoding {
    func decode(_ s: String, maxBatch: Int = 4) -> RPCIncoming {
        RPCCodec.decode(line: Array(s.utf8), maxDepth: 16, maxBatch: maxBatch)
    }

    @Test func decodesRequestsAndNotifications() throws {
        guard case .single(.success(let r)) = decode(#"{"jsonrpc":"2.0","id":"x","method":"db.list"}"#) else {
            Issue.record("not decoded")
            return
        }
        #expect(r.id == .string("x") && r.method == "db.list" && r.params.isEmpty && !r.isNotification)
        guard case .single(.success(let n)) = decode(#"{"jsonrpc":"2.0","method":"db.list","params":{"a":1}}"#) else {
            Issue.record("not decoded")
            return
        }
        #expect(n.isNotification && n.params == ["a": 1])
    }

    @Test(arguments: [
        (#"5"#, -32600), (#""x""#, -32600), (#"{"jsonrpc":"1.0","id":1,"method":"a"}"#, -32600),
        (#"{"jsonrpc":"2.0","id":1}"#, -32600), (#"{"jsonrpc":"2.0","id":1,"method":5}"#, -32600),
        (#"{"jsonrpc":"2.0","id":1,"method":"a","params":[1]}"#, -32602),
        (#"{"jsonrpc":"2.0","id":1,"method":"a","params":3}"#, -32600),
        (#"{"jsonrpc":"2.0","id":{},"method":"a"}"#, -32600), (#"{"jsonrpc":"2.0","id":1,"method":"a","x":1}"#, -32600),
    ])
    func rejectsInvalidRequests(line: String, code: Int) {
        guard case .single(.failure(let f)) = decode(line) else {
            Issue.record("accepted \(line)")
            return
        }
        #expect(f.error.code == code, "\(line): \(f.error)")
    }

    @Test func batchesAreCappedAndMustNotBeEmpty() {
        guard case .failure(let empty) = decode("[]") else { Issue.record("empty batch accepted"); return }
        #expect(empty.error.code == RPCErrorCode.invalidRequest)
        let five = "[" + Array(repeating: #"{"jsonrpc":"2.0","id":1,"method":"a"}"#, count: 5).joined(separator: ",") + "]"
        guard case .failure(let big) = decode(five) else { Issue.record("oversize batch accepted"); return }
        #expect(big.error.code == RPCErrorCode.limitExceeded && big.error.kind == "batch_too_large")
        guard case .batch(let items) = decode(#"[{"jsonrpc":"2.0","id":1,"method":"a"}, 7]"#) else {
            Issue.record("batch not decoded")
            return
        }
        #expect(items.count == 2)
        if case .failure(let f) = items[1] { #expect(f.error.code == RPCErrorCode.invalidRequest) } else {
            Issue.record("scalar in batch accepted")
        }
    }

    @Test func parseErrorsCarryStableKinds() {
        guard case .failure(let f) = decode(#"{"a":1e400}"#) else { Issue.record("accepted"); return }
        #expect(f.error.code == RPCErrorCode.parseError && f.error.kind == "number_out_of_range" && f.id == .null)
        guard case .failure(let d) = decode(String(repeating: "[", count: 40)) else { Issue.record("accepted"); return }
        #expect(d.error.kind == "nesting_too_deep")
    }

    @Test func errorRoundTripsThroughJSON() {
        let e = RPCError(code: -32010, kind: "document_not_found", message: "no", details: ["op": 3])
        #expect(RPCError(json: e.jsonValue) == e)
    }
}
