import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

@testable import BlazeBlob

#if canImport(Glibc)
import Glibc
#endif

/// Blobs put a piece at a time and read back by range; manifests decoded as hostile input.
@Suite struct BlobTests {
    let keys = try! BlobKeys(
        space: SpaceID(bytes: [UInt8](repeating: 5, count: 16))!, genesis: [UInt8](repeating: 6, count: 32),
        sizes: try! Chunker.Sizes(minimum: 2 << 10, average: 8 << 10, maximum: 32 << 10))

    /// A chunk store in a fresh temporary directory, removed by the caller.
    func store() throws -> ChunkStore {
        try ChunkStore(directory: NSTemporaryDirectory() + "blaze-blobs-\(UUID().uuidString)")
    }

    func bytes(_ count: Int, _ random: inout SeededRandom) -> [UInt8] {
        (0..<count).map { _ in UInt8(truncatingIfNeeded: random.next()) }
    }

    /// Puts `content` appended in pieces of random sizes; returns the blob's id, manifest and new bytes stored.
    func put(_ content: [UInt8], _ store: ChunkStore, _ random: inout SeededRandom) throws -> (ChunkID, BlobManifest, Int) {
        var writer = BlobWriter(keys: keys, store: store, maxSize: 1 << 30)
        var start = 0
        while start < content.count {
            let n = min(content.count - start, Int(random.next() % 100_000) + 1)
            try writer.append(Array(content[start..<(start + n)]))
            start += n
        }
        let put = try writer.finish()
        return (put.id, put.manifest, put.storedBytes)
    }

    @Test func aBlobPutInPiecesReadsBackWholeAndByRange() throws {
        var random = SeededRandom(seed: testSeed("blob put"))
        let store = try store()
        defer { try? FileManager.default.removeItem(atPath: store.directory) }
        let content = bytes(600_000, &random)
        let (id, manifest, stored) = try put(content, store, &random)
        #expect(manifest.size == content.count && stored == content.count)
        #expect(manifest.pieces.map(\.length) == keys.chunker.cuts(of: content))
        let reader = BlobReader(store: store, maxSize: 1 << 30, chunkMaximum: keys.chunker.sizes.maximum)
        #expect(try reader.manifest(id) == manifest)
        #expect(reader.missing(manifest).isEmpty)
        var whole: [UInt8] = []
        try reader.read(manifest, offset: 0, length: .max) { whole += $0 }
        #expect(whole == content)
        for _ in 0..<50 {
            let offset = Int(random.next() % UInt64(content.count + 10))
            let length = Int(random.next() % 100_000)
            var part: [UInt8] = []
            try reader.read(manifest, offset: offset, length: length) { part += $0 }
            let end = min(content.count, offset + length)
            #expect(part == (offset < end ? Array(content[offset..<end]) : []), "offset \(offset) length \(length)")
        }
    }

    @Test func aBlobIsCopiedOutAsItsChunksArriveInOrder() throws {
        var random = SeededRandom(seed: testSeed("blob copy held"))
        let store = try store()
        defer { try? FileManager.default.removeItem(atPath: store.directory) }
        // A block repeated: its chunks recur in the manifest.
        let block = bytes(90_000, &random)
        let content = block + bytes(50_000, &random) + block + block
        let (_, manifest, _) = try put(content, store, &random)
        let ids = manifest.pieces.map(\.id)
        #expect(Set(ids).count < ids.count, "a chunk of the repeated block recurs")
        // Two chunks not held yet (as while a fetch is under way): the later of them recurs.
        let recurring = try #require(ids.first { id in ids.filter { $0 == id }.count > 1 })
        let gone = Array(Set([ids[1], recurring].filter { $0 != ids[0] }))
        var held: [ChunkID: [UInt8]] = [:]
        for id in gone {
            held[id] = try #require(try store.read(id))
            unlink(store.path(of: id))
        }
        let path = NSTemporaryDirectory() + "blaze-copy-\(UUID().uuidString)"
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0o600)
        #expect(fd >= 0)
        defer {
            close(fd)
            unlink(path)
        }
        let reader = BlobReader(store: store, maxSize: 1 << 30, chunkMaximum: keys.chunker.sizes.maximum)
        // Only the pieces before the first missing one are written.
        let first = try reader.copyHeld(manifest, from: 0, to: fd)
        #expect(first == ids.firstIndex { gone.contains($0) })
        let prefix = manifest.pieces[..<first].reduce(0) { $0 + $1.length }
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == Data(content[..<prefix]))
        // Nothing arrived: nothing more is written.
        #expect(try reader.copyHeld(manifest, from: first, to: fd) == first)
        // Once they arrive, the rest follows, a recurring chunk at each of its places; pages let go stay readable.
        for (id, bytes) in held { try store.put(id, bytes) }
        store.dropCached(ids)
        #expect(try reader.copyHeld(manifest, from: first, to: fd) == ids.count)
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == Data(content))
    }

    @Test func theSameFileAgainStoresNothingAndAnEditStoresOnlyItsChunks() throws {
        var random = SeededRandom(seed: testSeed("blob dedup"))
        let store = try store()
        defer { try? FileManager.default.removeItem(atPath: store.directory) }
        let content = bytes(1 << 20, &random)
        let (id, manifest, _) = try put(content, store, &random)
        let (again, _, storedAgain) = try put(content, store, &random)
        #expect(again == id && storedAgain == 0)
        var edited = content
        edited.replaceSubrange(500_000..<500_100, with: bytes(100, &random))
        let (editedID, editedManifest, storedEdit) = try put(edited, store, &random)
        #expect(editedID != id)
        // One chunk, or a few when the cuts around the edit moved: far less than the file (~120 chunks of ~9 KiB).
        #expect(storedEdit > 0 && storedEdit <= 8 * keys.chunker.sizes.maximum, "\(storedEdit) bytes stored again")
        let reader = BlobReader(store: store, maxSize: 1 << 30, chunkMaximum: keys.chunker.sizes.maximum)
        var back: [UInt8] = []
        try reader.read(editedManifest, offset: 0, length: .max) { back += $0 }
        #expect(back == edited)
        // A chunk gone: reading names it, and `missing` lists it.
        let lost = manifest.pieces[3].id
        #expect(store.remove(lost))
        #expect(reader.missing(manifest) == [lost])
        #expect(throws: ChunkStoreError.self) { try reader.read(manifest, offset: 0, length: .max) { _ in } }
    }

    @Test func aBlobIsReadFromAFileDescriptorAndHeldToItsLimit() throws {
        var random = SeededRandom(seed: testSeed("blob file"))
        let store = try store()
        defer { try? FileManager.default.removeItem(atPath: store.directory) }
        let path = store.directory + "-input"
        let content = bytes(300_000, &random)
        #expect(FileManager.default.createFile(atPath: path, contents: Data(content)))
        defer { unlink(path) }
        let fd = open(path, O_RDONLY)
        defer { close(fd) }
        var writer = BlobWriter(keys: keys, store: store, maxSize: 1 << 30)
        var reported: [Int] = []
        try writer.append(reading: fd) { reported.append($0) }
        let (id, manifest, _) = try writer.finish()
        #expect(reported.last == content.count && manifest.size == content.count)
        #expect(try BlobReader(store: store, maxSize: 1 << 30, chunkMaximum: keys.chunker.sizes.maximum).manifest(id) == manifest)
        // Over the limit: refused as it grows.
        var small = BlobWriter(keys: keys, store: store, maxSize: 1000)
        try small.append([UInt8](repeating: 1, count: 1000))
        #expect(throws: ChunkStoreError.self) { try small.append([1]) }
        // An empty blob is a manifest of no chunks.
        var emptyWriter = BlobWriter(keys: keys, store: store, maxSize: 10)
        let empty = try emptyWriter.finish()
        #expect(empty.manifest.size == 0 && empty.manifest.pieces.isEmpty)
    }

    @Test func hostileManifestsAreRefusedBeforeAllocating() throws {
        let id = keys.id(of: [1])
        let good = BlobManifest(pieces: [.init(id: id, length: 10), .init(id: id, length: 20)])
        let maximum = keys.chunker.sizes.maximum
        #expect(try BlobManifest(decoding: good.encoded, chunkMaximum: maximum, maxSize: 100) == good)
        var bytes = good.encoded
        // Size over the limit, a count that does not match the bytes, a count far past what fits, lengths that do
        // not add up, a zero-length or oversize chunk, the wrong magic, truncated.
        #expect(throws: ChunkError.self) { try BlobManifest(decoding: bytes, chunkMaximum: maximum, maxSize: 29) }
        bytes[15] = 3
        #expect(throws: ChunkError.self) { try BlobManifest(decoding: bytes, chunkMaximum: maximum, maxSize: 100) }
        bytes[12] = 0xFF
        #expect(throws: ChunkError.self) { try BlobManifest(decoding: bytes, chunkMaximum: maximum, maxSize: 100) }
        var sizes = good.encoded
        sizes[11] = 31
        #expect(throws: ChunkError.self) { try BlobManifest(decoding: sizes, chunkMaximum: maximum, maxSize: 100) }
        let zero = BlobManifest(pieces: [.init(id: id, length: 0)]).encoded
        #expect(throws: ChunkError.self) { try BlobManifest(decoding: zero, chunkMaximum: maximum, maxSize: 100) }
        let oversize = BlobManifest(pieces: [.init(id: id, length: maximum + 1)]).encoded
        #expect(throws: ChunkError.self) { try BlobManifest(decoding: oversize, chunkMaximum: maximum, maxSize: 1 << 30) }
        var magic = good.encoded
        magic[0] = 0
        #expect(throws: ChunkError.self) { try BlobManifest(decoding: magic, chunkMaximum: maximum, maxSize: 100) }
        #expect(throws: ChunkError.self) { try BlobManifest(decoding: Array(good.encoded.dropLast()), chunkMaximum: maximum, maxSize: 100) }
        #expect(throws: ChunkError.self) { try BlobManifest(decoding: [], chunkMaximum: maximum, maxSize: 100) }
    }

    @Test func aChunkFailingMidwayFailsThePutAndTheOthersStayUnnamed() throws {
        var random = SeededRandom(seed: testSeed("blob failure midway"))
        let store = try store()
        defer { try? FileManager.default.removeItem(atPath: store.directory) }
        let content = bytes(600_000, &random)
        // The chunk shard of one chunk in the middle of the blob is taken by a file: that chunk alone cannot be stored.
        let lengths = keys.chunker.cuts(of: content)
        let start = lengths[..<(lengths.count / 2)].reduce(0, +)
        let end = start + lengths[lengths.count / 2]
        let victim = keys.id(of: Array(content[start..<end]))
        #expect(FileManager.default.createFile(atPath: store.directory + "/" + String(victim.hex.prefix(2)), contents: Data()))
        var writer = BlobWriter(keys: keys, store: store, maxSize: 1 << 30)
        do {
            // The chunks are stored on the writer's lanes: the failure ends the writer by `finish` at the latest.
            try writer.append(content)
            _ = try writer.finish()
            Issue.record("a put whose chunk could not be stored succeeded")
        } catch {}
        #expect(throws: ChunkStoreError.self) { try writer.finish() }
        #expect(!store.contains(victim))
        // Retried once the way is clear, the put stores only what the failed one left out, and reads back whole.
        unlink(store.directory + "/" + String(victim.hex.prefix(2)))
        let (_, manifest, stored) = try put(content, store, &random)
        #expect(manifest.pieces.map(\.length).reduce(0, +) == content.count)
        #expect(stored < content.count)
        #expect(stored >= end - start)
        #expect(store.contains(victim))
    }

    @Test func aFailedPutEndsTheWriter() throws {
        var random = SeededRandom(seed: testSeed("blob failure"))
        let store = try store()
        defer { try? FileManager.default.removeItem(atPath: store.directory) }
        // A file where every shard directory would go: storing any chunk fails.
        for shard in 0..<256 {
            #expect(FileManager.default.createFile(atPath: store.directory + "/" + String(format: "%02x", shard), contents: Data()))
        }
        var writer = BlobWriter(keys: keys, store: store, maxSize: 1 << 30)
        // Chunks are stored on the writer's lanes while it reads on: the failure ends the writer at the next call
        // after it, at the latest at `finish`, which never names content it did not store.
        let failedEarly = (try? writer.append(bytes(300_000, &random))) == nil
        #expect(throws: ChunkStoreError.self) { try writer.finish() }
        // Every later call fails the same way: nothing more is stored or named.
        #expect(throws: ChunkStoreError.self) { try writer.append([1]) }
        #expect(throws: ChunkStoreError.self) { try writer.finish() }
        if failedEarly { #expect(throws: ChunkStoreError.self) { try writer.append(bytes(300_000, &random)) } }
        #expect(store.all().isEmpty)
    }
}
