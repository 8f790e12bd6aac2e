import BlazeProtocol
import Dispatch
#if canImport(Glibc)
import Glibc
#endif

/// Puts a blob into a chunk store a piece at a time, never holding more than twice `window` maximum chunks of it (the
/// bytes not yet cut, and the chunks cut and not yet stored): bytes are appended as they come (from a file or from a
/// client's in-band pieces), cut into chunks by the space's chunker, each chunk stored durably under its id by the
/// writer's lanes, and `finish` waits for them, stores the manifest and returns it with the blob's id.
///
/// One writer per blob, used by one thread at a time; call `finish` once. Any failure ends the writer: every later
/// call throws the same error, so a failed put never goes on to name content it did not store whole.
public struct BlobWriter: Sendable {
    /// The space's keys.
    public let keys: BlobKeys
    /// Where the chunks go.
    public let store: ChunkStore
    /// The largest blob accepted, in bytes.
    public let maxSize: Int
    /// Bytes appended and not yet cut into a chunk.
    private var pending: [UInt8] = []
    /// The lengths of the chunks handed to the lanes so far, in order.
    private var lengths: [Int] = []
    /// The threads naming and storing the chunks cut so far.
    private let lanes: ChunkLanes
    /// Bytes appended so far.
    public private(set) var size = 0
    /// Bytes of chunks that were new to the store (the rest were held already), known once `finish` has returned.
    public private(set) var storedBytes = 0
    /// The failure that ended this writer, if any.
    private var failure: ChunkStoreError?

    /// Maximum chunks a writer holds at once (16 MiB with the standard sizes).
    static let window = 4

    /// A writer of one blob into `store`, of at most `maxSize` bytes.
    public init(keys: BlobKeys, store: ChunkStore, maxSize: Int) {
        self.keys = keys
        self.store = store
        self.maxSize = maxSize
        pins = ChunkPins(store: store)
        lanes = ChunkLanes(keys: keys, store: store, pins: pins, limit: Self.window * keys.chunker.sizes.maximum)
    }

    /// The chunks this writer stored or found held, pinned in the store until the writer goes: a sweep leaves them,
    /// however long the put takes.
    private let pins: ChunkPins

    /// Appends `bytes` to the blob, storing every chunk they complete.
    public mutating func append(_ bytes: UnsafeRawBufferPointer) throws(ChunkStoreError) {
        if let failure { throw failure }
        guard bytes.count <= maxSize - size else {
            throw ended(ChunkStoreError("the blob is over the \(maxSize)-byte limit", reason: .limit))
        }
        // The window is allocated with the first bytes, not when the writer is made (an upload that never sends
        // holds nothing).
        if pending.capacity == 0 { pending.reserveCapacity(Self.window * keys.chunker.sizes.maximum) }
        size += bytes.count
        var rest = bytes
        let maximum = keys.chunker.sizes.maximum
        while !rest.isEmpty {
            // Fill a window of several maximum chunks, so that cuts are decided inside the pending bytes and several
            // chunks are stored at once.
            let take = min(rest.count, Self.window * maximum - pending.count)
            pending.append(contentsOf: UnsafeRawBufferPointer(rebasing: rest[..<take]))
            rest = UnsafeRawBufferPointer(rebasing: rest[take...])
            if pending.count == Self.window * maximum { try cut(atEnd: false) }
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
            if n < 0 { throw ended(.system("read the blob's file", errno)) }
            if n == 0 { return }
            let result = buffer.withUnsafeBytes { raw in
                Result { () throws(ChunkStoreError) in try append(UnsafeRawBufferPointer(rebasing: raw[..<n])) }
            }
            try result.get()
            progress(size)
        }
    }

    /// Hands the chunks of the pending bytes up to where the chunker cuts (all of them at the end) to the lanes that
    /// name and store them.
    ///
    /// The cuts are found here (one pass, cheap); naming (HMAC-SHA256) and the synced write of each chunk's file are
    /// most of a put's time, and run on the lanes' threads while this one reads and cuts the bytes that follow.
    private mutating func cut(atEnd: Bool) throws(ChunkStoreError) {
        do throws(ChunkStoreError) {
            try cutWindow(atEnd: atEnd)
        } catch {
            throw ended(error)
        }
    }

    /// Records `error` as the one that ended this writer, and returns it.
    private mutating func ended(_ error: ChunkStoreError) -> ChunkStoreError {
        failure = error
        pending = []
        return error
    }

    /// `cut(atEnd:)`'s work.
    private mutating func cutWindow(atEnd: Bool) throws(ChunkStoreError) {
        let count = pending.count
        let chunker = keys.chunker
        let maximum = chunker.sizes.maximum
        var cuts: [Range<Int>] = []
        var start = 0
        pending.withUnsafeBytes { raw in
            while let n = chunker.firstCut(in: UnsafeRawBufferPointer(rebasing: raw[start..<count]), atEnd: atEnd) {
                cuts.append(start..<(start + n))
                start += n
                // Not at the end, stop while a whole maximum chunk is left: the next cut needs the bytes after it.
                if !atEnd && count - start < maximum { break }
            }
        }
        guard !cuts.isEmpty else { return }
        // A manifest lists a bounded number of chunks: refused as the blob grows, not after storing all of it.
        guard lengths.count + cuts.count <= BlobManifest.maxPieces(chunkMaximum: maximum) else {
            throw ChunkStoreError("the blob has more chunks than one manifest can list", reason: .limit)
        }
        for range in cuts {
            try lanes.submit(lengths.count, Array(pending[range]))
            lengths.append(range.count)
        }
        pending.removeFirst(start)
    }

    /// Stores the last chunk and the manifest; returns the blob's id, its manifest and the bytes of chunks that were
    /// new to the store (the manifest's own chunk not counted).
    public mutating func finish() throws(ChunkStoreError) -> (id: ChunkID, manifest: BlobManifest, storedBytes: Int) {
        if let failure { throw failure }
        try cut(atEnd: true)
        let stored: [Int: (id: ChunkID, new: Bool)]
        do throws(ChunkStoreError) { stored = try lanes.drain() } catch { throw ended(error) }
        var pieces: [BlobManifest.Piece] = []
        pieces.reserveCapacity(lengths.count)
        for (k, length) in lengths.enumerated() {
            guard let chunk = stored[k] else { throw ended(ChunkStoreError("chunk \(k) of the blob was not stored", reason: .invalid)) }
            if chunk.new { storedBytes += length }
            pieces.append(BlobManifest.Piece(id: chunk.id, length: length))
        }
        let manifest = BlobManifest(pieces: pieces)
        guard manifest.pieces.count <= BlobManifest.maxPieces(chunkMaximum: keys.chunker.sizes.maximum) else {
            throw ChunkStoreError("the blob has more chunks than one manifest can list", reason: .limit)
        }
        let encoded = manifest.encoded
        let id = keys.id(of: encoded)
        do throws(ChunkStoreError) { try store.put(id, encoded, pinning: pins) } catch { throw ended(error) }
        return (id, manifest, storedBytes)
    }
}
