import BlazeProtocol

/// Reads a blob out of a chunk store: its manifest, then ranges of its content a chunk at a time.
public struct BlobReader: Sendable {
    /// Where the chunks are.
    public let store: ChunkStore
    /// The largest blob accepted, in bytes.
    public let maxSize: Int

    /// The largest chunk accepted, in bytes (a manifest is a chunk too).
    public let chunkMaximum: Int

    /// A reader of the blobs in `store`, refusing manifests of blobs over `maxSize` bytes or listing chunks over
    /// `chunkMaximum` bytes. Reading needs no key: chunks are held here by id.
    public init(store: ChunkStore, maxSize: Int, chunkMaximum: Int = Chunker.Sizes.standard.maximum) {
        self.store = store
        self.maxSize = maxSize
        self.chunkMaximum = chunkMaximum
    }

    /// The manifest of blob `id`; nil when its manifest chunk is not held here.
    public func manifest(_ id: ChunkID) throws(ChunkStoreError) -> BlobManifest? {
        let maximum = chunkMaximum
        guard let size = store.size(of: id) else { return nil }
        guard size <= maximum else { throw ChunkStoreError("blob \(id)'s manifest is \(size) bytes, over \(maximum)", reason: .invalid) }
        guard let bytes = try store.read(id) else { return nil }
        let manifest: BlobManifest
        do {
            manifest = try BlobManifest(decoding: bytes, chunkMaximum: maximum, maxSize: .max)
        } catch {
            throw ChunkStoreError("blob \(id) has a bad manifest: \(error.description)", reason: .invalid)
        }
        // Well formed, but larger than this reader takes: a limit, not damage.
        guard manifest.size <= maxSize else {
            throw ChunkStoreError("blob \(id) is \(manifest.size) bytes, over the \(maxSize)-byte limit", reason: .limit)
        }
        return manifest
    }

    /// The chunks of `manifest` not held here, in order, without repeats.
    public func missing(_ manifest: BlobManifest) -> [ChunkID] {
        var seen = Set<ChunkID>()
        return manifest.pieces.compactMap { seen.insert($0.id).inserted && !store.contains($0.id) ? $0.id : nil }
    }

    /// Writes the blob's bytes from `offset` for `length` bytes (to its end when shorter) to file descriptor
    /// `output`, copied in the kernel chunk by chunk. Throws when a chunk it needs is not held.
    public func copy(_ manifest: BlobManifest, offset: Int = 0, length: Int = .max, to output: Int32) throws(ChunkStoreError) {
        for (piece, range) in manifest.pieces(overlapping: offset, length: length) {
            guard try store.copy(piece.id, offset: range.lowerBound, length: range.count, to: output) else {
                throw ChunkStoreError("chunk \(piece.id) of the blob is not held here", reason: .missing)
            }
        }
    }

    /// Writes the blob's pieces from piece `first` on to file descriptor `output` (at its position), in order, up to
    /// the first one whose chunk is not held here; returns the index after the last piece written.
    public func copyHeld(_ manifest: BlobManifest, from first: Int, to output: Int32) throws(ChunkStoreError) -> Int {
        var next = first
        while next < manifest.pieces.count {
            let piece = manifest.pieces[next]
            guard try store.copy(piece.id, offset: 0, length: piece.length, to: output) else { break }
            next += 1
        }
        return next
    }

    /// Calls `body` with the blob's bytes from `offset` for `length` bytes (to its end when shorter), one chunk's part
    /// at a time, in order. Throws when a chunk it needs is not held (`missing` names them).
    public func read(
        _ manifest: BlobManifest, offset: Int, length: Int, _ body: ([UInt8]) throws(ChunkStoreError) -> Void
    ) throws(ChunkStoreError) {
        for (piece, range) in manifest.pieces(overlapping: offset, length: length) {
            guard let part = try store.read(piece.id, offset: range.lowerBound, length: range.count), part.count == range.count
            else { throw ChunkStoreError("chunk \(piece.id) of the blob is not held here", reason: .missing) }
            try body(part)
        }
    }
}
