import BlazeCrypto
import BlazeProtocol
import Testing

@testable import BlazeWire

/// The chunk messages' encodings: what decodes, and what is refused before anything is allocated for it.
@Suite struct ChunkMessageTests {
    func ids(_ n: Int) -> [ChunkID] { (0..<n).map { _ in ChunkID(bytes: SpaceKey.randomBytes(32))! } }

    @Test func wantsAndMissingListsRoundTrip() throws {
        for n in [1, 7, PeerMessage.maxChunkWants] {
            let list = ids(n)
            let want = try PeerMessage.chunkWant(list).encoded()
            #expect(want.count == 3 + 32 * n && want.first == 11)
            guard case .chunkWant(let back) = try PeerMessage(decoding: want) else {
                Issue.record("decoded as another message")
                return
            }
            #expect(back == list)
            guard case .chunkMissing(let missing) = try PeerMessage(decoding: try PeerMessage.chunkMissing(list).encoded()) else {
                Issue.record("decoded as another message")
                return
            }
            #expect(missing == list)
        }
    }

    @Test func aChunkRoundTrips() throws {
        let id = ids(1)[0]
        let sealed = SpaceKey.randomBytes(5000)
        guard case .chunk(let i, let s) = try PeerMessage(decoding: try PeerMessage.chunk(id: id, sealed: sealed).encoded()) else {
            Issue.record("decoded as another message")
            return
        }
        #expect(i == id && s == sealed)
    }

    @Test func badListsAndChunksAreMalformed() {
        let one = ids(1)[0].bytes
        let over = ids(PeerMessage.maxChunkWants + 1).flatMap(\.bytes)
        for type: UInt8 in [11, 13] {
            for bad: [UInt8] in [
                [type],  // no count
                [type, 0, 0],  // an empty list
                [type, 0, 2] + one,  // fewer ids than counted
                [type, 0, 1] + one + [0],  // a trailing byte
                [type, 0, 1] + Array(one.prefix(31)),  // a short id
                [type, 0, 2] + one + one,  // the same id twice
                [type, 0, UInt8(PeerMessage.maxChunkWants + 1)] + over,  // more than a message may ask
                [type, 0xFF, 0xFF],  // a count no message holds
            ] {
                #expect(throws: SyncRejection.malformed) { try PeerMessage(decoding: bad) }
            }
        }
        for bad: [UInt8] in [
            [12] + Array(one.prefix(20)),  // a short id
            [12] + one,  // no sealed bytes
            [12] + one + [UInt8](repeating: 1, count: PeerMessage.maxSealedChunkBytes + 1),  // over the largest sealed chunk
        ] {
            #expect(throws: SyncRejection.malformed) { try PeerMessage(decoding: bad) }
        }
    }
}
