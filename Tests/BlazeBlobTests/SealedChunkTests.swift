import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

@testable import BlazeBlob

/// Chunk ids keyed per space, and chunks sealed so that they open only as the chunk asked for.
@Suite struct SealedChunkTests {
    let space = SpaceID(bytes: [UInt8](repeating: 0xAB, count: 16))!
    let genesis = [UInt8](repeating: 0x11, count: 32)
    let epochSecret = [UInt8](repeating: 0x22, count: 32)

    func keys(space: SpaceID? = nil, genesis: [UInt8]? = nil) throws -> BlobKeys {
        try BlobKeys(space: space ?? self.space, genesis: genesis ?? self.genesis)
    }

    @Test func idsAreKeyedPerSpace() throws {
        let content = Array("a photo".utf8)
        let a = try keys().id(of: content)
        #expect(a == (try keys().id(of: content)))
        #expect(a != (try keys().id(of: Array("a photo!".utf8))))
        // Another space, or another secret for the same space id, names the same content differently.
        #expect(a != (try keys(space: SpaceID(bytes: [UInt8](repeating: 1, count: 16))!).id(of: content)))
        #expect(a != (try keys(genesis: [UInt8](repeating: 2, count: 32)).id(of: content)))
        #expect(ChunkID(hex: a.hex) == a)
        #expect(ChunkID(hex: String(a.hex.dropLast())) == nil)
        #expect(ChunkID(hex: a.hex.uppercased()) == nil)
        #expect(ChunkID(hex: String(repeating: "g", count: 64)) == nil)
        #expect(ChunkID(bytes: [1, 2, 3]) == nil)
        #expect(throws: ChunkError.self) { try BlobKeys(space: space, genesis: [1]) }
    }

    @Test func aSealedChunkOpensOnlyAsItself() throws {
        let keys = try keys()
        var random = SeededRandom(seed: testSeed("sealed chunk"))
        for size in [0, 1, 4091, 4092, 4093, 100_000] {
            let content = (0..<size).map { _ in UInt8(truncatingIfNeeded: random.next()) }
            let id = keys.id(of: content)
            let sealed = content.withUnsafeBytes { SealedChunk.seal($0, id: id, space: space, epoch: 3, secret: epochSecret) }
            #expect((sealed.count - 36) % SealedChunk.padding == 0)
            #expect(SealedChunk.epoch(of: sealed) == 3)
            // Each sealing draws its own nonce: the same content sealed again shares no (key, nonce) pair, and opens alike.
            let again = content.withUnsafeBytes { SealedChunk.seal($0, id: id, space: space, epoch: 3, secret: epochSecret) }
            #expect(again[8..<20] != sealed[8..<20])
            #expect(try SealedChunk.open(again, id: id, keys: keys, secrets: [epochSecret], maximum: 1 << 20) == content)
            let opened = try SealedChunk.open(sealed, id: id, keys: keys, secrets: [[UInt8](repeating: 9, count: 32), epochSecret], maximum: 1 << 20)
            #expect(opened == content)
            // Asked for as another chunk, under a key of another epoch, or with a byte changed anywhere: refused.
            let other = keys.id(of: content + [0])
            #expect(throws: ChunkError.self) { try SealedChunk.open(sealed, id: other, keys: keys, secrets: [epochSecret], maximum: 1 << 20) }
            #expect(throws: ChunkError.self) {
                try SealedChunk.open(sealed, id: id, keys: keys, secrets: [[UInt8](repeating: 9, count: 32)], maximum: 1 << 20)
            }
            for position in [0, 5, 10, 30, sealed.count / 2, sealed.count - 1] {
                var tampered = sealed
                tampered[position] ^= 1
                #expect(throws: ChunkError.self) { try SealedChunk.open(tampered, id: id, keys: keys, secrets: [epochSecret], maximum: 1 << 20) }
            }
            #expect(throws: ChunkError.self) { try SealedChunk.open(Array(sealed.dropLast()), id: id, keys: keys, secrets: [epochSecret], maximum: 1 << 20) }
        }
    }

    @Test func aMemberSealingContentUnderAnotherIdIsCaught() throws {
        // A member holds the epoch key, so it can seal anything; the id check after opening still refuses content
        // that is not the chunk named.
        let keys = try keys()
        let wanted = keys.id(of: Array("the real chunk".utf8))
        let forged = Array("something else".utf8).withUnsafeBytes {
            SealedChunk.seal($0, id: wanted, space: space, epoch: 1, secret: epochSecret)
        }
        #expect(throws: ChunkError.self) { try SealedChunk.open(forged, id: wanted, keys: keys, secrets: [epochSecret], maximum: 1 << 20) }
        // Each sealing draws its nonce: two contents sealed under one id never share one (no keystream is reused,
        // whatever id a caller gives).
        let real = Array("the real chunk".utf8).withUnsafeBytes { SealedChunk.seal($0, id: wanted, space: space, epoch: 1, secret: epochSecret) }
        #expect(real[8..<20] != forged[8..<20])
    }

    @Test func aChunkSealedFromTheStoreIsTheChunkSealedFromMemory() throws {
        let keys = try keys()
        let store = try ChunkStore(directory: NSTemporaryDirectory() + "blaze-sealed-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(atPath: store.directory) }
        for count in [0, 1, 4091, 4092, 4093, 100_000] {
            let content = (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31) }
            let id = keys.id(of: content)
            try store.put(id, content)
            let prefix: [UInt8] = [12] + id.bytes
            let fromStore = try #require(try SealedChunk.seal(reading: id, from: store, space: space, epoch: 3, secret: epochSecret, after: prefix))
            let fromMemory = content.withUnsafeBytes { SealedChunk.seal($0, id: id, space: space, epoch: 3, secret: epochSecret) }
            // The same layout after the prefix: the header's magic and epoch, then a nonce of its own and a box as long.
            #expect(Array(fromStore.prefix(prefix.count + 8)) == prefix + fromMemory.prefix(8))
            #expect(fromStore.count == prefix.count + fromMemory.count)
            // Opened where it lies, the content handed over is the chunk's.
            let opened = try SealedChunk.open(fromStore[prefix.count...], id: id, keys: keys, secrets: [epochSecret], maximum: 1 << 20) { Array($0) }
            #expect(opened == content)
        }
        // A file over the chunk maximum under a chunk's name is refused before it is read.
        let big = [UInt8](repeating: 3, count: 9000)
        try store.put(keys.id(of: big), big)
        #expect(throws: ChunkStoreError.self) {
            try SealedChunk.seal(reading: keys.id(of: big), from: store, space: space, epoch: 3, secret: epochSecret, maximum: 8192)
        }
        #expect(try SealedChunk.seal(reading: keys.id(of: big), from: store, space: space, epoch: 3, secret: epochSecret, maximum: 9000) != nil)
        // A chunk the store lacks is not sealed.
        #expect(try SealedChunk.seal(reading: keys.id(of: [9, 9]), from: store, space: space, epoch: 3, secret: epochSecret) == nil)
    }

    @Test func oversizeAndMalformedAreRefusedBeforeOpening() throws {
        let keys = try keys()
        let id = keys.id(of: [1])
        let huge = SealedChunk.maxSealedCount(content: 8192) + 1
        #expect(throws: ChunkError.self) { try SealedChunk.open([UInt8](repeating: 0, count: huge), id: id, keys: keys, secrets: [epochSecret], maximum: 8192) }
        #expect(throws: ChunkError.self) { try SealedChunk.open([], id: id, keys: keys, secrets: [epochSecret], maximum: 8192) }
        #expect(throws: ChunkError.self) { try SealedChunk.open(Array("BZC1".utf8) + [UInt8](repeating: 0, count: 40), id: id, keys: keys, secrets: [epochSecret], maximum: 8192) }
        // Content over the maximum the caller accepts is refused by size, even when it is a valid chunk.
        let big = [UInt8](repeating: 7, count: 20_000)
        let sealed = big.withUnsafeBytes { SealedChunk.seal($0, id: keys.id(of: big), space: space, epoch: 1, secret: epochSecret) }
        #expect(throws: ChunkError.self) { try SealedChunk.open(sealed, id: keys.id(of: big), keys: keys, secrets: [epochSecret], maximum: 8192) }
    }
}
