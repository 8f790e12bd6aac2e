import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

@testable import BlazeCrypto

/// Entry format 3 (vector values as bytes inside the sealed entry) and the signed statements that decide when a
/// device seals it (SYNC.md §6, "Entry formats").
@Suite struct EntryFormatTests {
    let key = SpaceKey.generate()
    let device = DeviceIdentity()

    /// Canonical base64 of `n` float32 drawn from `rng`.
    static func vectorText(_ n: Int, _ rng: inout SeededRandom) -> String {
        var bytes: [UInt8] = []
        for _ in 0..<n { withUnsafeBytes(of: Float.random(in: -1...1, using: &rng).bitPattern.littleEndian) { bytes += $0 } }
        return Base64.encode(bytes)
    }

    /// A change's text with one vector of `d` components per document.
    static func changeText(docs: Int, d: Int, seed: UInt64) -> String {
        var rng = SeededRandom(seed: seed)
        let ops = (0..<docs).map { i in
            #"{"c":"p","i":"p\#(i)","k":"doc","l":1,"set":{"e":{"$vector":"\#(vectorText(d, &rng))"},"t":"photo \#(i)"}}"#
        }
        return #"{"d":{},"h":1,"o":"00112233445566778899aabbccddeeff","s":1,"x":["# + ops.joined(separator: ",") + "]}"
    }

    @Test func vectorsTravelAsBytesInFormatThreeAndOpenToTheSameText() throws {
        for (docs, d) in [(1, 768), (3, 1), (5, 2), (2, 3), (1, 4096)] {
            let text = Array(Self.changeText(docs: docs, d: d, seed: UInt64(docs * 10_000 + d)).utf8)
            let three = SealedEntry.seal(text, space: key, origin: device.nodeID, seq: 1, prev: SealedEntry.genesis, format: 3)
            let two = SealedEntry.seal(text, space: key, origin: device.nodeID, seq: 1, prev: SealedEntry.genesis)
            #expect(three.header.version == 3 && two.header.version == 2)
            #expect(try SealedEntry(bytes: three.bytes).open(with: key) == text, "docs \(docs), d \(d)")
            #expect(try SealedEntry(bytes: two.bytes).open(with: key) == text)
            if d >= 768 { #expect(Double(three.bytes.count) < Double(two.bytes.count) * 0.8, "\(three.bytes.count) vs \(two.bytes.count)") }
        }
        // A change without vectors is sealed in format 3 too (so the header does not tell which changes hold some).
        let none = Array(#"{"x":[{"set":{"a":1}}]}"#.utf8)
        let packedNone = SealedEntry.seal(none, space: key, origin: device.nodeID, seq: 1, prev: SealedEntry.genesis, format: 3)
        #expect(packedNone.header.version == 3)
        #expect(try packedNone.open(with: key) == none)
        // A `$vector` string format 3 cannot carry exactly (no write accepts one): format 2 whatever the caller allows.
        let plain = [
            #"{"x":[{"set":{"e":{"$vector":""}}}]}"#,  // an empty one already
            #"{"x":[{"set":{"e":{"$vector":"AAAA"},"f":{"$vector":"AAF="}}}]}"#,  // unused bits set: not canonical
            #"{"x":[{"set":{"e":{"$vector":"AA\"AA"}}}]}"#,  // an escape inside
            #"{"x":[{"set":{"e":{"$vector":"AAAA"#,  // cut short
            #"{"x":[{"set":{"e":{"$vector":"@@@@"}}}]}"#,  // outside the alphabet
        ]
        for text in plain {
            let e = SealedEntry.seal(Array(text.utf8), space: key, origin: device.nodeID, seq: 1, prev: SealedEntry.genesis, format: 3)
            #expect(e.header.version == 2, "\(text)")
            #expect(try e.open(with: key) == Array(text.utf8))
        }
        // A string that only looks like the member (escaped quotes) is left as it is.
        let lookalike = Array(#"{"t":"\"$vector\":\"AAAA\"","v":{"$vector":"AAAAAA=="}}"#.utf8)
        let packed = try #require(VectorPacking.pack(lookalike))
        #expect(try VectorPacking.unpack(packed) == lookalike)
        // A key ending in an escaped quote before `$vector` holds the raw sequence too: emptied and restored alike.
        let keyed = Array(#"{"a\"$vector":"AAAA","b":{"$vector":"AAAAAA=="}}"#.utf8)
        #expect(try VectorPacking.unpack(try #require(VectorPacking.pack(keyed))) == keyed)
    }

    @Test func packedPayloadsRefuseWhatPackCannotHaveWritten() throws {
        func packed(_ text: [UInt8], _ values: [[UInt8]], count: UInt32? = nil) -> [UInt8] {
            var out: [UInt8] = []
            out.appendBE(UInt32(text.count))
            out += text
            out.appendBE(count ?? UInt32(values.count))
            for v in values {
                out.appendBE(UInt32(v.count))
                out += v
            }
            return out
        }
        let one = Array(#"{"v":{"$vector":""}}"#.utf8)
        #expect(try VectorPacking.unpack(packed(one, [[1, 2, 3, 4]])) == Array(#"{"v":{"$vector":"AQIDBA=="}}"#.utf8))
        #expect(try VectorPacking.unpack(packed(Array("{}".utf8), [])) == Array("{}".utf8))
        let bad: [(String, [UInt8])] = [
            ("no values for a member", packed(one, [])),
            ("more values than members", packed(one, [[1], [2]])),
            ("fewer values than members", packed(Array(#"{"v":{"$vector":""},"w":{"$vector":""}}"#.utf8), [[1]])),
            ("an empty value", packed(one, [[]])),
            ("a value past the bound", packed(one, [[UInt8](repeating: 1, count: VectorPacking.maxValueBytes + 1)])),
            ("a member left full", packed(Array(#"{"v":{"$vector":"AAAA"}}"#.utf8), [[1]])),
            ("bytes left over", packed(one, [[1]]) + [0]),
            ("a count past the bytes", packed(one, [[1]], count: 1 << 30)),
            ("a text length past the bytes", [0xFF, 0xFF, 0xFF, 0xFF] + one),
            ("nothing", []),
        ]
        for (what, bytes) in bad {
            #expect(throws: SyncRejection.badPayload, "\(what)") { try VectorPacking.unpack(bytes) }
        }
        // Random bytes and every cut of a real payload: refused or opened, never a trap.
        var rng = SeededRandom(seed: 5)
        let real = try #require(VectorPacking.pack(Array(Self.changeText(docs: 2, d: 8, seed: 1).utf8)))
        for cut in 0..<real.count { _ = try? VectorPacking.unpack(Array(real.prefix(cut))) }
        for _ in 0..<2_000 {
            var bytes = real
            bytes[Int.random(in: 0..<bytes.count, using: &rng)] ^= UInt8.random(in: 1...255, using: &rng)
            _ = try? VectorPacking.unpack(bytes)
            _ = try? VectorPacking.unpack((0..<Int.random(in: 0..<64, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) })
        }
    }

    @Test func statementsAreSignedAndEveryAlterationIsRefused() throws {
        let s = FormatStatement(space: key.id, formats: 1...3, issuedMs: 1_000, identity: device)
        let decoded = try FormatStatement(bytes: s.bytes)
        #expect(decoded == s && decoded.formats == 1...3 && decoded.node == device.nodeID && decoded.issuedMs == 1_000)
        #expect(s.bytes.count == FormatStatement.size)
        for i in s.bytes.indices {
            var b = s.bytes
            b[i] ^= 0x01
            #expect(throws: (any Error).self, "byte \(i)") { try FormatStatement(bytes: b) }
        }
        #expect(throws: SyncRejection.malformed) { try FormatStatement(bytes: s.bytes + [0]) }
        #expect(throws: SyncRejection.malformed) { try FormatStatement(bytes: Array(s.bytes.dropLast())) }
        // A range that is empty or starts at 0 is refused even when signed.
        for formats in [0...3, 0...0] as [ClosedRange<UInt8>] {
            let odd = FormatStatement(space: key.id, formats: formats, issuedMs: 1, identity: device)
            #expect(throws: SyncRejection.malformed) { try FormatStatement(bytes: odd.bytes) }
        }
        var reversed = FormatStatement(space: key.id, formats: 2...3, issuedMs: 1, identity: device).bytes
        (reversed[56], reversed[57]) = (3, 2)
        #expect(throws: SyncRejection.malformed) { try FormatStatement(bytes: reversed) }
    }

    @Test func aDeviceSealsTheNewestFormatOnlyWhenEveryMemberOpensIt() {
        let (a, b, c) = (DeviceIdentity(), DeviceIdentity(), DeviceIdentity())
        func stated(_ d: DeviceIdentity, _ f: ClosedRange<UInt8>) -> ([UInt8], FormatStatement) {
            (d.nodeID, FormatStatement(space: key.id, formats: f, issuedMs: 1, identity: d))
        }
        let members = [a.nodeID, b.nodeID, c.nodeID]
        let all = Dictionary(uniqueKeysWithValues: [stated(a, 1...3), stated(b, 1...3), stated(c, 1...3)])
        #expect(FormatStatement.sealedFormat(members: members, statements: all) == 3)
        #expect(FormatStatement.sealedFormat(members: [], statements: [:]) == EntryHeader.newestVersion)
        // One member not heard from, or one that opens only 2, holds everyone at 2.
        var missing = all
        missing[c.nodeID] = nil
        #expect(FormatStatement.sealedFormat(members: members, statements: missing) == 2)
        var older = all
        older[c.nodeID] = stated(c, 1...2).1
        #expect(FormatStatement.sealedFormat(members: members, statements: older) == 2)
        // A newer build's wider range seals no more than this build knows; one without format 2 is held to 2.
        var newer = all
        newer[c.nodeID] = stated(c, 1...9).1
        #expect(FormatStatement.sealedFormat(members: members, statements: newer) == 3)
        newer[c.nodeID] = stated(c, 3...9).1
        #expect(FormatStatement.sealedFormat(members: members, statements: newer) == 2)
    }
}
