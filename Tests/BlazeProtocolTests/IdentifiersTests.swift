import Testing

@testable import BlazeProtocol

/// `SpaceID`, `EntryHash` and `Epoch`: bytes of any other length are refused (never trapped on), and the bytes and hex text
/// round-trip unchanged.
@Suite struct IdentifiersTests {
    @Test func aSpaceIDTakesExactly16Bytes() throws {
        let bytes = (0..<16).map { UInt8($0 * 17) }
        let id = try #require(SpaceID(bytes: bytes))
        #expect(id.bytes == bytes)
        #expect(id.hex == hexString(bytes) && SpaceID(hex: id.hex) == id && id.description == id.hex)
        for length in [0, 1, 15, 17, 32] { #expect(SpaceID(bytes: [UInt8](repeating: 1, count: length)) == nil) }
        #expect(SpaceID(hex: String(id.hex.dropLast(2))) == nil && SpaceID(hex: id.hex.uppercased()) == nil)
        #expect(SpaceID(bytes: [UInt8](repeating: 0, count: 16))! < id)
    }

    @Test func anEntryHashTakesExactly32Bytes() throws {
        let bytes = (0..<32).map { UInt8($0 * 7) }
        let hash = try #require(EntryHash(bytes: bytes[...]))
        #expect(hash.bytes == bytes && EntryHash(hex: hash.hex) == hash)
        for length in [0, 16, 31, 33] { #expect(EntryHash(bytes: [UInt8](repeating: 1, count: length)) == nil) }
        #expect(EntryHash.zero.bytes == [UInt8](repeating: 0, count: 32) && EntryHash.zero < hash)
        #expect([hash, EntryHash.zero].sorted() == [EntryHash.zero, hash])
    }

    @Test func epochsCountAndOrderByNumber() {
        let first: Epoch = 1
        #expect(first.next == Epoch(2) && first < first.next && first.next.value == 2 && "\(Epoch(41).next)" == "42")
        #expect([Epoch(9), 3, Epoch(UInt32.max)].max() == Epoch(UInt32.max))
    }
}
