import Foundation
import Testing

@testable import BlazeProtocol

@Suite struct Base64URLTests {
    /// Foundation's standard base64, turned into base64url without padding: what the encoder must produce.
    static func reference(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    @Test func encodesAsFoundationDoesAndDecodesBack() {
        var rng = SystemRandomNumberGenerator()
        for length in 0..<70 {
            for _ in 0..<20 {
                let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &rng) }
                let text = Base64URL.encode(bytes)
                #expect(text == Self.reference(bytes))
                #expect(Base64URL.decode(text) == bytes)
                // With the padding standard base64 would have.
                let padded = text + String(repeating: "=", count: (4 - text.utf8.count % 4) % 4)
                #expect(Base64URL.decode(padded) == bytes)
            }
        }
        #expect(Base64URL.encode([0xFB, 0xFF]) == "-_8")
        #expect(Base64URL.decode("-_8") == [0xFB, 0xFF])
    }

    @Test func rejectsWhatNoEncodingProduces() {
        for bad in ["+_8", "-/8", "ab*c", "a", "abcde", "ab=c", "=abc", "ab===", "a===", "ab c", "é", "abc\n"] {
            #expect(Base64URL.decode(bad) == nil, "\(bad)")
        }
        #expect(Base64URL.decode("") == [])
    }
}
