import BlazeProtocol

/// The list of a blob's chunks, in order, with their lengths: what a blob is, stored and sent as a chunk of its own.
///
/// A blob's id is the id of its manifest chunk, so it is keyed per space like every chunk, names the whole content
/// (each chunk id names its content, and the manifest names the chunks in order), and equal files in one space have
/// one id. Layout: `"BZB1"`, the blob's size (8 bytes, big-endian), the chunk count (4 bytes, big-endian), then per
/// chunk its id (32 bytes) and length (4 bytes, big-endian). Decoding checks every count and length before
/// allocating: a manifest comes from peers, relays and folders like any chunk.
public struct BlobManifest: Sendable, Equatable {
    /// One chunk of the blob.
    public struct Piece: Sendable, Equatable {
        /// The chunk's id.
        public let id: ChunkID
        /// The chunk's length in bytes.
        public let length: Int
    }

    /// The chunks, in order.
    public let pieces: [Piece]
    /// The blob's size in bytes: the sum of the pieces' lengths.
    public let size: Int

    /// The first four bytes of every manifest.
    static let magic = Array("BZB1".utf8)
    /// Bytes before the first piece.
    static let headerCount = 4 + 8 + 4
    /// Bytes per piece.
    static let pieceCount = ChunkID.count + 4

    /// A manifest of `pieces`.
    public init(pieces: [Piece]) {
        self.pieces = pieces
        size = pieces.reduce(0) { $0 + $1.length }
    }

    /// The most chunks a manifest that fits in one chunk of `maximum` bytes can list.
    public static func maxPieces(chunkMaximum maximum: Int) -> Int { (maximum - headerCount) / pieceCount }

    /// The manifest's bytes.
    public var encoded: [UInt8] {
        var out = Self.magic
        out.reserveCapacity(Self.headerCount + pieces.count * Self.pieceCount)
        withUnsafeBytes(of: UInt64(size).bigEndian) { out += $0 }
        withUnsafeBytes(of: UInt32(pieces.count).bigEndian) { out += $0 }
        for piece in pieces {
            out += piece.id.bytes
            withUnsafeBytes(of: UInt32(piece.length).bigEndian) { out += $0 }
        }
        return out
    }

    /// Decodes a manifest, refusing one whose counts or lengths do not add up, whose chunks are empty or longer than
    /// `chunkMaximum`, or whose size is over `maxSize`.
    public init(decoding bytes: [UInt8], chunkMaximum: Int, maxSize: Int) throws(ChunkError) {
        guard bytes.count >= Self.headerCount, bytes.starts(with: Self.magic) else { throw ChunkError("not a blob manifest") }
        let size = bytes[4..<12].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        let count = bytes[12..<16].reduce(0) { $0 << 8 | Int($1) }
        guard size <= UInt64(maxSize) else { throw ChunkError("a blob of \(size) bytes is over the \(maxSize)-byte limit") }
        guard count <= Self.maxPieces(chunkMaximum: chunkMaximum), bytes.count == Self.headerCount + count * Self.pieceCount else {
            throw ChunkError("a blob manifest's chunk count (\(count)) does not match its \(bytes.count) bytes")
        }
        var pieces: [Piece] = []
        pieces.reserveCapacity(count)
        var total = 0
        for k in 0..<count {
            let start = Self.headerCount + k * Self.pieceCount
            let id = ChunkID(bytes: Array(bytes[start..<(start + ChunkID.count)]))!
            let length = bytes[(start + ChunkID.count)..<(start + Self.pieceCount)].reduce(0) { $0 << 8 | Int($1) }
            guard length >= 1, length <= chunkMaximum else {
                throw ChunkError("a blob manifest lists a chunk of \(length) bytes (1 to \(chunkMaximum) allowed)")
            }
            total += length
            pieces.append(Piece(id: id, length: length))
        }
        guard total == Int(size) else { throw ChunkError("a blob manifest's chunks add up to \(total) bytes, not \(size)") }
        self.pieces = pieces
        self.size = total
    }

    /// The pieces overlapping bytes `offset..<offset + length` of the blob, each with the range of it they cover.
    public func pieces(overlapping offset: Int, length: Int) -> [(piece: Piece, range: Range<Int>)] {
        guard offset >= 0, length > 0, offset < size else { return [] }
        let end = min(size, offset + min(length, size))
        var out: [(piece: Piece, range: Range<Int>)] = []
        var start = 0
        for piece in pieces {
            let pieceEnd = start + piece.length
            if pieceEnd > offset && start < end {
                out.append((piece, max(offset, start) - start..<min(end, pieceEnd) - start))
            }
            if pieceEnd >= end { break }
            start = pieceEnd
        }
        return out
    }
}
