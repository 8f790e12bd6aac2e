#if canImport(Glibc)
import Glibc
#endif

/// Puts a blob into a chunk store a piece at a time, never holding more than two maximum chunks of it: bytes are
/// appended as they come (from a file or from a client's in-band pieces), cut into chunks by the space's chunker,
/// each chunk stored durably under its id, and `finish` stores the manifest and returns it with the blob's id.
///
/// One writer per blob, used by one thread at a time; call `finish` once.
public struct BlobWriter: Sendable {
    /// The space's keys.
    public let keys: BlobKeys
    /// Where the chunks go.
    public let store: ChunkStore
    /// The largest blob accepted, in bytes.
    public let maxSize: Int
    /// Bytes appended and not yet cut into a chunk.
    private var pending: [UInt8] = []
    /// The chunks stored so far.
    private var pieces: [BlobManifest.Piece] = []
    /// Bytes appended so far.
    public private(set) var size = 0
    /// Bytes of chunks that were new to the store (the rest were held already).
    public private(set) var storedBytes = 0

    /// A writer of one blob into `store`, of at most `maxSize` bytes.
    public init(keys: BlobKeys, store: ChunkStore, maxSize: Int) {
        self.keys = keys
        self.store = store
        self.maxSize = maxSize
        pending.reserveCapacity(2 * keys.chunker.sizes.maximum)
    }

    /// Appends `bytes` to the blob, storing every chunk they complete.
    public mutating func append(_ bytes: UnsafeRawBufferPointer) throws(ChunkStoreError) {
        guard bytes.count <= maxSize - size else {
            throw ChunkStoreError("the blob is over the \(maxSize)-byte limit", reason: .limit)
        }
        size += bytes.count
        var rest = bytes
        let maximum = keys.chunker.sizes.maximum
        while !rest.isEmpty {
            // Fill up to two maximum chunks, so that a cut is always decided inside the pending bytes.
            let take = min(rest.count, 2 * maximum - pending.count)
            pending.append(contentsOf: UnsafeRawBufferPointer(rebasing: rest[..<take]))
            rest = UnsafeRawBufferPointer(rebasing: rest[take...])
            if pending.count == 2 * maximum { try cut(atEnd: false) }
        }
    }

    /// Appends `bytes` to the blob (see `append(_:)` for raw bytes).
    public mutating func append(_ bytes: [UInt8]) throws(ChunkStoreError) {
        let result = bytes.withUnsafeBytes { raw in Result { () throws(ChunkStoreError) in try append(raw) } }
        try result.get()
    }

    /// Reads file descriptor `fd` to its end and appends what it reads, 1 MiB at a time; `progress` is called with
    /// the bytes read so far after each read.
    public mutating func append(reading fd: Int32, progress: (Int) -> Void = { _ in }) throws(ChunkStoreError) {
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress!, $0.count) }
            if n < 0 && errno == EINTR { continue }
            if n < 0 { throw .system("read the blob's file", errno) }
            if n == 0 { return }
            let result = buffer.withUnsafeBytes { raw in
                Result { () throws(ChunkStoreError) in try append(UnsafeRawBufferPointer(rebasing: raw[..<n])) }
            }
            try result.get()
            progress(size)
        }
    }

    /// Stores the chunks of the pending bytes up to where the chunker cuts (all of them at the end).
    private mutating func cut(atEnd: Bool) throws(ChunkStoreError) {
        var start = 0
        let count = pending.count
        let result = pending.withUnsafeBytes { raw -> Result<[BlobManifest.Piece], ChunkStoreError> in
            var cuts: [BlobManifest.Piece] = []
            var stored = 0
            while let n = keys.chunker.firstCut(in: UnsafeRawBufferPointer(rebasing: raw[start..<count]), atEnd: atEnd) {
                let chunk = UnsafeRawBufferPointer(rebasing: raw[start..<(start + n)])
                let id = keys.id(of: chunk)
                do throws(ChunkStoreError) {
                    if try store.put(id, chunk) { stored += n }
                } catch {
                    return .failure(error)
                }
                cuts.append(BlobManifest.Piece(id: id, length: n))
                start += n
                // Not at the end, stop while a whole maximum chunk is left: the next cut needs the bytes after it.
                if !atEnd && count - start < keys.chunker.sizes.maximum { break }
            }
            storedBytes += stored
            return .success(cuts)
        }
        pieces += try result.get()
        pending.removeFirst(start)
    }

    /// Stores the last chunk and the manifest; returns the blob's id, its manifest and the bytes of chunks that were
    /// new to the store (the manifest's own chunk not counted).
    public mutating func finish() throws(ChunkStoreError) -> (id: ChunkID, manifest: BlobManifest, storedBytes: Int) {
        try cut(atEnd: true)
        let manifest = BlobManifest(pieces: pieces)
        guard manifest.pieces.count <= BlobManifest.maxPieces(chunkMaximum: keys.chunker.sizes.maximum) else {
            throw ChunkStoreError("the blob has more chunks than one manifest can list", reason: .limit)
        }
        let encoded = manifest.encoded
        let id = keys.id(of: encoded)
        try store.put(id, encoded)
        return (id, manifest, storedBytes)
    }
}
