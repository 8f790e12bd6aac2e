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
        guard case .chunk(let i, let s) = try PeerMessage(decoding: try PeerMessage.chunk(id: id, sealed: sealed[...]).encoded()) else {
            Issue.record("decoded as another message")
            return
        }
        #expect(i == id && Array(s) == sealed)
    }

    @Test func badListsAndChunksAreMalformed() {
        let one = ids(1)[0].bytes
        let over = ids(PeerMessage.maxChunkWants + 1).flatMap(\.bytes)
        for type: UInt8 in [11, 13, 14, 15] {
            #expect(throws: SyncRejection.malformed) { try PeerMessage(decoding: [type]) }  // no count
            if type != 11 {
                // Only a relay's answer to an offer may name no chunk.
                #expect(throws: SyncRejection.malformed) { try PeerMessage(decoding: [type, 0, 0]) }
            }
            for bad: [UInt8] in [
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

    @Test func offersBadCopyReportsAndAnEmptyWantRoundTrip() throws {
        for n in [1, PeerMessage.maxChunkWants] {
            let list = ids(n)
            guard case .chunkOffer(let offer) = try PeerMessage(decoding: try PeerMessage.chunkOffer(list).encoded()),
                case .chunkBad(let bad) = try PeerMessage(decoding: try PeerMessage.chunkBad(list).encoded())
            else {
                Issue.record("decoded as another message")
                return
            }
            #expect(offer == list && bad == list)
        }
        let empty = try PeerMessage.chunkWant([]).encoded()
        #expect(empty == [11, 0, 0])
        guard case .chunkWant(let none) = try PeerMessage(decoding: empty) else {
            Issue.record("decoded as another message")
            return
        }
        #expect(none.isEmpty)
    }

    @Test func keepsRoundTripUpToTheirOwnBound() throws {
        for n in [1, PeerMessage.maxChunkWants + 1, PeerMessage.maxChunkKeep] {
            let list = ids(n)
            guard case .chunkKeep(let kept) = try PeerMessage(decoding: try PeerMessage.chunkKeep(list).encoded()) else {
                Issue.record("decoded as another message")
                return
            }
            #expect(kept == list)
        }
        // None, one over the bound, a repeated id, or a count the bytes do not match: malformed.
        let over = try PeerMessage.chunkKeep(ids(PeerMessage.maxChunkKeep + 1)).encoded()
        let one = ids(1)[0].bytes
        for bad in [[16, 0, 0], over, [16, 0, 2] + one + one, [16, 0, 2] + one] {
            #expect(throws: SyncRejection.malformed) { try PeerMessage(decoding: bad) }
        }
        // A CHUNK_OFFER keeps its own, smaller bound.
        #expect(throws: SyncRejection.malformed) {
            try PeerMessage(decoding: try PeerMessage.chunkOffer(ids(PeerMessage.maxChunkWants + 1)).encoded())
        }
    }

    @Test func onlyTheShapeOfASealedChunkIsCheckedWithoutItsKey() {
        let header = SealedChunkLayout.magic + [0, 0, 0, 1] + [UInt8](repeating: 7, count: 12)
        let good = header + [UInt8](repeating: 9, count: 2 * SealedChunkLayout.padding + 16)
        #expect(SealedChunkLayout.isWellFormed(good, maximum: PeerMessage.maxSealedChunkBytes))
        #expect(!SealedChunkLayout.isWellFormed(good, maximum: good.count - 1))  // over the limit
        #expect(!SealedChunkLayout.isWellFormed(Array(good.dropLast()), maximum: .max))  // not whole blocks
        #expect(!SealedChunkLayout.isWellFormed(header + [UInt8](repeating: 0, count: 16), maximum: .max))  // no block
        #expect(!SealedChunkLayout.isWellFormed([0x41] + good.dropFirst(), maximum: .max))  // not its magic
        #expect(!SealedChunkLayout.isWellFormed([], maximum: .max))
    }
}
