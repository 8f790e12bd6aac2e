import BlazeProtocol
import Crypto
import Foundation

/// The keys the blobs of one space are chunked and named with, derived from the space's epoch-1 secret (which every
/// member holds and a relay never does). They do not change when the space's key rotates, so a file put before and
/// after a revocation shares its chunks; the chunks' contents are sealed with the epoch keys (`SealedChunk`).
public struct BlobKeys: Sendable {
    /// The space's id.
    public let space: SpaceID
    /// The space's chunker (its gear table keyed by the space).
    public let chunker: Chunker
    /// The key chunk ids are computed with (its bytes: `SymmetricKey` is not `Sendable`).
    private let idKey: [UInt8]

    /// The keys of space `space` whose epoch-1 secret is `genesis` (32 bytes).
    public init(space: SpaceID, genesis: [UInt8], sizes: Chunker.Sizes = .standard) throws(ChunkError) {
        guard genesis.count == 32 else { throw ChunkError("blob keys need a 32-byte secret") }
        self.space = space
        let secret = SymmetricKey(data: genesis)
        func derive(_ label: String) -> [UInt8] {
            HKDF<SHA256>.deriveKey(inputKeyMaterial: secret, salt: space.bytes, info: Array(label.utf8), outputByteCount: 32)
                .withUnsafeBytes { Array($0) }
        }
        do {
            chunker = try Chunker(key: derive("blazedb blob chunking v1"), sizes: sizes)
        } catch {
            throw ChunkError(error.description)
        }
        idKey = derive("blazedb blob chunk id v1")
    }

    /// The id of a chunk with `content`.
    public func id(of content: UnsafeRawBufferPointer) -> ChunkID {
        ChunkID(bytes: Array(HMAC<SHA256>.authenticationCode(for: content, using: SymmetricKey(data: idKey))))!
    }

    /// The id of a chunk with `content`.
    public func id(of content: [UInt8]) -> ChunkID { content.withUnsafeBytes { id(of: $0) } }
}


/// A chunk as it travels and as relays and folders hold it: its content sealed with an epoch key of its space.
///
/// Layout: `"BZC1"`, the epoch (4 bytes, big-endian), a 12-byte nonce, then the ChaCha20-Poly1305 box of the content's
/// length (4 bytes, big-endian), the content and zero bytes up to a multiple of `padding`, with its 16-byte tag. The
/// header, the space id and the chunk id are authenticated with it, so a sealed chunk opens only as the chunk it was
/// sealed as. The nonce is 12 random bytes from the system's generator, drawn for each sealing: no two sealings share
/// a (key, nonce) pair, even of two different plaintexts given under one id (a damaged chunk file), without a pass
/// over the content to derive it (the 2^32 sealings per epoch key random 96-bit nonces allow is far beyond what a
/// space's epoch sees). Opening checks the tag and the content against the id (see
/// `open(_:id:keys:secrets:maximum:_:)`). Builds up to 0.4.0 derived the nonce from the content (an HMAC); opening
/// never looked at how it was made, so their chunks and these open alike.
public enum SealedChunk {
    /// The first four bytes of every sealed chunk.
    static let magic = SealedChunkLayout.magic
    /// Bytes before the box: magic, epoch, nonce.
    static let headerCount = SealedChunkLayout.headerCount
    /// The sealed content is padded to a multiple of this many bytes, so a sealed chunk's size tells its content's
    /// size only to within 4 KiB.
    public static let padding = SealedChunkLayout.padding

    /// The largest sealed chunk of content up to `maximum` bytes: larger ones are refused before any allocation.
    public static func maxSealedCount(content maximum: Int) -> Int {
        headerCount + padded(maximum) + 16
    }

    /// Bytes of the box's plaintext for content of `count` bytes: the length field, the content and the padding.
    static func padded(_ count: Int) -> Int { (4 + count + padding - 1) / padding * padding }

    /// The key an epoch's secret seals chunks with.
    static func chunkKey(space: SpaceID, epoch: UInt32, secret: [UInt8]) -> SymmetricKey {
        var info = Array("blazedb chunk key v1".utf8)
        withUnsafeBytes(of: epoch.bigEndian) { info += $0 }
        return HKDF<SHA256>.deriveKey(inputKeyMaterial: SymmetricKey(data: secret), salt: space.bytes, info: info, outputByteCount: 32)
    }

    /// The authenticated data: the header, the space and the chunk id.
    static func aad(header: ArraySlice<UInt8>, space: SpaceID, id: ChunkID) -> [UInt8] {
        Array(header) + space.bytes + id.bytes
    }

    /// `content` (the chunk `id` of `space`, at most 1 GiB: chunks are at most `Chunker.Sizes` allow) sealed under
    /// the epoch `epoch` whose secret is `secret`.
    public static func seal(_ content: UnsafeRawBufferPointer, id: ChunkID, space: SpaceID, epoch: UInt32, secret: [UInt8]) -> [UInt8] {
        let sealed = seal(count: content.count, id: id, space: space, epoch: epoch, secret: secret, after: []) { (plain) throws(ChunkError) in
            if let source = content.baseAddress, content.count > 0 { plain.baseAddress!.copyMemory(from: source, byteCount: content.count) }
        }
        return try! sealed.get()
    }

    /// Chunk `id` of `space`, read from `store`, sealed under the epoch `epoch` whose secret is `secret` and placed
    /// after `prefix` (a message's header: the chunk is read into the buffer it is sealed from, and sealed into the
    /// one returned, with no other copy); nil when the store does not hold it. A file over `maximum` bytes (the
    /// largest chunk the space's chunker makes: no receiver takes more) is refused before anything is read.
    public static func seal(
        reading id: ChunkID, from store: ChunkStore, space: SpaceID, epoch: UInt32, secret: [UInt8], after prefix: [UInt8] = [],
        maximum: Int = Chunker.Sizes.standard.maximum
    ) throws(ChunkStoreError) -> [UInt8]? {
        guard let (fd, size) = try store.openChunk(id) else { return nil }
        defer { close(fd) }
        guard size <= min(maximum, 1 << 30) else {
            throw ChunkStoreError("chunk \(id)'s file holds \(size) bytes, over the \(maximum)-byte chunk maximum", reason: .invalid)
        }
        return try seal(count: size, id: id, space: space, epoch: epoch, secret: secret, after: prefix) { (plain) throws(ChunkStoreError) in
            try ChunkStore.readFully(fd, into: plain, what: "read chunk \(id)")
        }.get()
    }

    /// Seals `count` bytes of content, written by `fill` into the plaintext buffer, after `prefix`.
    private static func seal<E: Error>(
        count: Int, id: ChunkID, space: SpaceID, epoch: UInt32, secret: [UInt8], after prefix: [UInt8],
        fill: (UnsafeMutableRawBufferPointer) throws(E) -> Void
    ) -> Result<[UInt8], E> {
        precondition(count <= 1 << 30, "a chunk is at most 1 GiB")
        let key = chunkKey(space: space, epoch: epoch, secret: secret)
        var failure: E?
        // Every byte is written before the buffer is used: the length field, the content by `fill`, zero padding.
        let plain = [UInt8](unsafeUninitializedCapacity: padded(count)) { buffer, initialized in
            let raw = UnsafeMutableRawBufferPointer(buffer)
            raw.storeBytes(of: UInt32(count).bigEndian, toByteOffset: 0, as: UInt32.self)
            do throws(E) {
                try fill(UnsafeMutableRawBufferPointer(rebasing: raw[4..<(4 + count)]))
            } catch {
                // Nothing of the buffer counts: it is dropped unread.
                failure = error
                initialized = 0
                return
            }
            UnsafeMutableRawBufferPointer(rebasing: raw[(4 + count)...]).initializeMemory(as: UInt8.self, repeating: 0)
            initialized = buffer.count
        }
        if let failure { return .failure(failure) }
        var generator = SystemRandomNumberGenerator()
        let nonceBytes = (0..<12).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
        var header = magic
        withUnsafeBytes(of: epoch.bigEndian) { header += $0 }
        header += nonceBytes
        let box = try! ChaChaPoly.seal(
            plain, using: key, nonce: try! ChaChaPoly.Nonce(data: nonceBytes),
            authenticating: aad(header: header[...], space: space, id: id))
        // One copy of the box into the result (`header + ciphertext + tag` would make two).
        var sealed = [UInt8]()
        sealed.reserveCapacity(prefix.count + header.count + box.ciphertext.count + box.tag.count)
        sealed += prefix
        sealed += header
        sealed += box.ciphertext
        sealed += box.tag
        return .success(sealed)
    }

    /// The epoch `sealed` says it is sealed under; nil when it is not a sealed chunk's header.
    public static func epoch(of sealed: [UInt8]) -> UInt32? { epoch(of: sealed[...]) }

    /// The epoch `sealed` (a slice of the message it arrived in) says it is sealed under, as `epoch(of:)`.
    public static func epoch(of sealed: ArraySlice<UInt8>) -> UInt32? {
        guard sealed.count >= headerCount + 16, sealed.starts(with: magic) else { return nil }
        let start = sealed.startIndex
        return sealed[(start + 4)..<(start + 8)].reduce(0) { $0 << 8 | UInt32($1) }
    }

    /// The content of `sealed`, which must be the chunk `id` of `keys.space`, opened with one of `secrets` (the
    /// secrets this device holds for the epoch the chunk names), at most `maximum` bytes long; its id is checked
    /// against the content, so nothing but the chunk asked for is ever returned.
    public static func open(
        _ sealed: [UInt8], id: ChunkID, keys: BlobKeys, secrets: [[UInt8]], maximum: Int
    ) throws(ChunkError) -> [UInt8] {
        try open(sealed[...], id: id, keys: keys, secrets: secrets, maximum: maximum) { Array($0) }
    }

    /// Opens `sealed` (a slice of the message it arrived in) as `open(_:id:keys:secrets:maximum:)`, and hands the
    /// checked content to `body` where it lies in the opened buffer (not copied out); returns what `body` returns.
    ///
    /// The nonce is not derived again: the tag proves a holder of the epoch key sealed these bytes, and the id check
    /// proves they are the chunk named, so a sealer that chose its nonce otherwise could only have harmed its own
    /// secrecy, which it holds the key to anyway.
    public static func open<R>(
        _ sealed: ArraySlice<UInt8>, id: ChunkID, keys: BlobKeys, secrets: [[UInt8]], maximum: Int,
        _ body: (UnsafeRawBufferPointer) -> R
    ) throws(ChunkError) -> R {
        guard sealed.count <= maxSealedCount(content: maximum) else {
            throw ChunkError("a sealed chunk of \(sealed.count) bytes is over the \(maxSealedCount(content: maximum))-byte limit")
        }
        // Offsets from the slice's start (a slice keeps its message's indices).
        let (start, end) = (sealed.startIndex, sealed.endIndex)
        guard let epoch = epoch(of: sealed), (sealed.count - headerCount - 16) % padding == 0 else {
            throw ChunkError("not a sealed chunk")
        }
        let header = sealed[start..<(start + headerCount)]
        let nonce = try! ChaChaPoly.Nonce(data: sealed[(start + 8)..<(start + headerCount)])
        guard let box = try? ChaChaPoly.SealedBox(nonce: nonce, ciphertext: sealed[(start + headerCount)..<(end - 16)], tag: sealed[(end - 16)...])
        else { throw ChunkError("not a sealed chunk") }
        let aad = aad(header: header, space: keys.space, id: id)
        for secret in secrets {
            guard let opened = try? ChaChaPoly.open(box, using: chunkKey(space: keys.space, epoch: epoch, secret: secret), authenticating: aad)
            else { continue }
            // Checked in the opened bytes where they lie, and handed over there.
            let checked = opened.withUnsafeBytes { plain -> Result<R, ChunkError> in
                let length = plain.prefix(4).reduce(0) { $0 << 8 | Int($1) }
                guard length <= plain.count - 4, padded(length) == plain.count, plain[(4 + length)...].allSatisfy({ $0 == 0 })
                else { return .failure(ChunkError("a sealed chunk's length field does not match its size")) }
                let content = UnsafeRawBufferPointer(rebasing: plain[4..<(4 + length)])
                guard keys.id(of: content) == id else { return .failure(ChunkError("a chunk's content does not match its id \(id)")) }
                return .success(body(content))
            }
            return try checked.get()
        }
        throw ChunkError("no key held for epoch \(epoch) opens chunk \(id)")
    }
}

/// A chunk or its keys refused.
public struct ChunkError: Error, Sendable, CustomStringConvertible {
    /// What was wrong.
    public let description: String

    /// An error saying `description`.
    init(_ description: String) { self.description = description }
}
