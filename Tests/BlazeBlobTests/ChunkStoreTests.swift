import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

@testable import BlazeBlob

#if canImport(Glibc)
import Glibc
#endif

/// Chunks on disk: durable whole files, ranged reads, and nothing but regular files read back.
@Suite struct ChunkStoreTests {
    /// A fresh directory under the system's temporary directory.
    func temporaryDirectory() -> String {
        let dir = NSTemporaryDirectory() + "blaze-chunks-\(UUID().uuidString)"
        return dir
    }

    let keys = try! BlobKeys(space: SpaceID(bytes: [UInt8](repeating: 5, count: 16))!, genesis: [UInt8](repeating: 6, count: 32))

    @Test func putReadRangeAndRemove() throws {
        let dir = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try ChunkStore(directory: dir)
        let content = (0..<10_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        let id = keys.id(of: content)
        #expect(!store.contains(id))
        #expect(try store.read(id) == nil)
        #expect(try store.put(id, content))
        #expect(try !store.put(id, content))  // held already: deduplicated
        #expect(store.contains(id) && store.size(of: id) == content.count)
        #expect(try store.read(id) == content)
        #expect(try store.read(id, offset: 100, length: 50) == Array(content[100..<150]))
        #expect(try store.read(id, offset: 9_990, length: 50) == Array(content[9_990...]))
        #expect(try store.read(id, offset: 20_000, length: 5) == [])
        #expect(throws: ChunkStoreError.self) { try store.read(id, offset: -1, length: 5) }
        #expect(store.all() == [id])
        #expect(store.remove(id) && !store.remove(id))
        #expect(store.all().isEmpty)
    }

    @Test func aSweepLeavesWhatIsKeptPinnedOrRecentAndRemembersWhatWent() throws {
        let dir = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try ChunkStore(directory: dir)
        let contents = (0..<4).map { k in (0..<5_000).map { UInt8(truncatingIfNeeded: $0 &* (k + 3)) } }
        let ids = contents.map { keys.id(of: $0) }
        var pins: ChunkPins? = ChunkPins(store: store)
        for (k, content) in contents.enumerated() { try store.put(ids[k], content, pinning: k == 2 ? pins : nil) }
        let later = Date().timeIntervalSince1970 + 60
        // A cutoff before they were written: nothing goes.
        #expect(try store.sweep(keeping: [], writtenBefore: later - 3_600) == (0, 0))
        #expect(store.swept(after: 0).ids.isEmpty)
        // Kept (0), pinned by a put under way (2): they stay; the others go, and are remembered in order.
        let first = try store.sweep(keeping: [ids[0]], writtenBefore: later)
        #expect(first.removed == 2 && first.bytes == 10_000)
        #expect(Set(store.all()) == [ids[0], ids[2]])
        let (gone, mark) = store.swept(after: 0)
        #expect(Set(gone) == [ids[1], ids[3]] && mark == 2)
        // Once the put's pins go, so can its chunk; a reader resuming from its mark sees only what went since.
        pins = nil
        #expect(try store.sweep(keeping: [ids[0]], writtenBefore: later).removed == 1)
        #expect(store.swept(after: mark) == ([ids[2]], 3))
        #expect(store.all() == [ids[0]])
        _ = pins
    }

    @Test func leftoversOfACrashedPutAreRemovedAndNeverListed() throws {
        let dir = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let content = Array("chunk".utf8)
        let id = keys.id(of: content)
        let store = try ChunkStore(directory: dir)
        try store.put(id, content)
        let shard = "\(dir)/\(id.hex.prefix(2))"
        let leftover = "\(shard)/.tmp-\(id.hex)-123"
        #expect(FileManager.default.createFile(atPath: leftover, contents: Data([1, 2])))
        #expect(FileManager.default.createFile(atPath: "\(shard)/not-a-chunk", contents: Data([1])))
        #expect(store.all() == [id])
        _ = try ChunkStore(directory: dir)
        #expect(!FileManager.default.fileExists(atPath: leftover))
        #expect(try store.read(id) == content)
    }

    @Test func onlyRegularFilesAreReadBack() throws {
        let dir = temporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try ChunkStore(directory: dir)
        let secret = dir + "-secret"
        #expect(FileManager.default.createFile(atPath: secret, contents: Data("secret".utf8)))
        defer { unlink(secret) }
        // A symbolic link planted under a chunk's name is not followed.
        let linked = keys.id(of: [1])
        try FileManager.default.createDirectory(atPath: "\(dir)/\(linked.hex.prefix(2))", withIntermediateDirectories: true)
        #expect(symlink(secret, store.path(of: linked)) == 0)
        #expect(!store.contains(linked) && store.size(of: linked) == nil)
        #expect(throws: ChunkStoreError.self) { try store.read(linked) }
        // A FIFO under a chunk's name neither hangs the read nor passes for a chunk.
        let fifo = keys.id(of: [2])
        try FileManager.default.createDirectory(atPath: "\(dir)/\(fifo.hex.prefix(2))", withIntermediateDirectories: true)
        #expect(mkfifo(store.path(of: fifo), 0o600) == 0)
        #expect(!store.contains(fifo))
        #expect(throws: ChunkStoreError.self) { try store.read(fifo) }
    }
}
