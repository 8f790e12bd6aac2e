import BlazeProtocol
import Crypto
import Foundation

/// One sealed piece of a state snapshot (SYNC.md §11): the pieces form a hash chain that the snapshot's signed
/// manifest ends, so none can be altered, dropped, repeated or reordered.
///
/// Layout: index (4) · prev (32, the previous piece's hash; zeros for the first) · epoch (4) · nonce (12) ·
/// ChaCha20-Poly1305 ciphertext and tag (16) of the records, sealed with the space's entry key for `epoch`; the
/// associated data is `"blazedb snapshot part v1"` · space · everything before the ciphertext.
public struct SnapshotPart: Sendable, Equatable {
    /// The encoded piece.
    public let bytes: [UInt8]
    /// Its position, from 0.
    public let index: UInt32
    /// The hash of the piece before it (zeros for the first).
    public let prev: [UInt8]
    /// SHA-256 of `bytes`: what the next piece's `prev` and the manifest name.
    public let hash: [UInt8]

    static let headerSize = 4 + 32 + 4 + 12
    /// The smallest piece: the framing of an empty one.
    public static let minBytes = headerSize + 16
    /// The largest piece accepted: 4 MiB of records and the framing.
    public static let maxBytes = (4 << 20) + headerSize + 16

    /// Seals `records` as piece `index`, chained to `prev`.
    public static func seal(_ records: [UInt8], index: UInt32, prev: [UInt8], key: SpaceKey) -> SnapshotPart {
        var header: [UInt8] = []
        header.appendBE(index)
        header += prev
        header.appendBE(key.epoch)
        let nonce = ChaChaPoly.Nonce()
        header += Array(nonce)
        // Callers check `key.canSeal`; sealing with a valid key and nonce cannot fail.
        let box = try! ChaChaPoly.seal(records, using: key.sealing!, nonce: nonce, authenticating: aad(key.id, header))
        let bytes = header + box.ciphertext + box.tag
        return SnapshotPart(bytes: bytes, index: index, prev: prev, hash: Array(SHA256.hash(data: bytes)))
    }

    private init(bytes: [UInt8], index: UInt32, prev: [UInt8], hash: [UInt8]) {
        self.bytes = bytes
        self.index = index
        self.prev = prev
        self.hash = hash
    }

    private static func aad(_ space: SpaceID, _ header: some Collection<UInt8>) -> [UInt8] {
        Array("blazedb snapshot part v1".utf8) + space.bytes + header
    }

    /// Parses a piece (its bounds only; `open` authenticates it).
    public init(bytes: [UInt8]) throws(SyncRejection) {
        guard bytes.count >= Self.headerSize + 16, bytes.count <= Self.maxBytes else { throw .malformed }
        var r = ByteReader(bytes[...])
        guard let index = r.readUInt32(), let prev = r.read(32) else { throw .malformed }
        self.init(bytes: bytes, index: index, prev: Array(prev), hash: Array(SHA256.hash(data: bytes)))
    }

    /// Authenticates and decrypts the records with the space key.
    public func open(with key: SpaceKey) throws(SyncRejection) -> [UInt8] {
        var r = ByteReader(bytes[...])
        _ = r.read(36)
        guard let epoch = r.readEpoch(), let nonceBytes = r.read(12), let nonce = try? ChaChaPoly.Nonce(data: nonceBytes) else {
            throw .malformed
        }
        let n = Self.headerSize
        guard
            let box = try? ChaChaPoly.SealedBox(nonce: nonce, ciphertext: bytes[n..<(bytes.count - 16)], tag: bytes[(bytes.count - 16)...])
        else { throw .badSnapshot }
        let keys = key.entryKeys(epoch: epoch)
        guard !keys.isEmpty else { throw .unknownEpoch }
        for entryKey in keys {
            if let plain = try? ChaChaPoly.open(box, using: entryKey, authenticating: Self.aad(key.id, bytes[..<n])) {
                return Array(plain)
            }
        }
        throw .badSnapshot
    }
}

/// The signed description of a state snapshot (SYNC.md §11): who made it, in which space, how many pieces and the
/// last one's hash, and per origin what it covers with the hash of that origin's entry there.
///
/// Layout: space (16) · author Ed25519 key (32) · created (8, Unix ms) · pieces (4) · size (8, the pieces' bytes in
/// all) · last piece hash (32) · count (4)
/// · count × (origin (16) · seq (8) · hash (32)), origins ascending · signed count (4) · signed count × the
/// origin's `SignedHead` (152) of exactly that entry, origins ascending · signature (64) over
/// `"blazedb snapshot v2"` · everything before it.
public struct SnapshotManifest: Sendable, Equatable {
    /// The space.
    public let space: SpaceID
    /// The author's Ed25519 public key.
    public let authorKey: [UInt8]
    /// When it was made (author's clock).
    public let createdMs: UInt64
    /// How many pieces.
    public let parts: UInt32
    /// The pieces' encoded bytes in all: a receiver bounds what it takes by it before the first piece comes.
    public let size: UInt64
    /// The last piece's hash.
    public let lastPart: [UInt8]
    /// Per origin (node id), the sequence the snapshot covers and the hash of that entry (zeros: the origin's chain
    /// starts after it).
    public let heads: [[UInt8]: (seq: UInt64, hash: [UInt8])]
    /// For some of those origins, the head the origin itself signed over exactly that entry (what the author holds):
    /// a device installing the snapshot keeps them, so it can later remove such an origin with a cutoff it proves.
    /// Decoding checks that each names an origin of `heads` at its seq and hash; `verify` checks the signatures.
    public let signedHeads: [SignedHead]
    /// The encoded, signed manifest.
    public let bytes: [UInt8]

    /// The author's node id.
    public var author: [UInt8] { Array(SHA256.hash(data: authorKey).prefix(16)) }

    /// Signs a manifest with `identity`.
    public init(
        space: SpaceID, createdMs: UInt64, parts: UInt32, size: UInt64, lastPart: [UInt8],
        heads: [[UInt8]: (seq: UInt64, hash: [UInt8])], signedHeads: [SignedHead] = [], identity: DeviceIdentity
    ) {
        let signed = signedHeads.filter { h in heads[h.origin].map { $0.seq == h.seq && $0.hash == h.hash } ?? false }
            .sorted { $0.origin.lexicographicallyPrecedes($1.origin) }
        let key = Array(identity.signingKey.publicKey.rawRepresentation)
        var body = space.bytes + key
        body.appendBE(createdMs)
        body.appendBE(parts)
        body.appendBE(size)
        body += lastPart
        body.appendBE(UInt32(heads.count))
        for (origin, head) in heads.sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
            body += origin
            body.appendBE(head.seq)
            body += head.hash
        }
        body.appendBE(UInt32(signed.count))
        for head in signed { body += head.bytes }
        // Signing with a valid key cannot fail.
        let signature = Array(try! identity.signingKey.signature(for: Self.domain + body))
        self.space = space
        self.authorKey = key
        self.createdMs = createdMs
        self.parts = parts
        self.size = size
        self.lastPart = lastPart
        self.heads = heads
        self.signedHeads = signed
        self.bytes = body + signature
    }

    /// What the signature covers before the body (the layout's version).
    static let domain = Array("blazedb snapshot v2".utf8)

    /// Decodes and verifies a manifest: bounds, origins strictly ascending, the signature.
    public init(bytes: [UInt8]) throws(SyncRejection) {
        var r = ByteReader(bytes[...])
        guard let space = r.readSpaceID(), let key = r.read(32), let created = r.readUInt64(), let parts = r.readUInt32(),
            parts > 0, let size = r.readUInt64(), let last = r.read(32), let n = r.readUInt32(), Int(n) * 56 + 68 <= r.remaining
        else { throw .malformed }
        var heads: [[UInt8]: (seq: UInt64, hash: [UInt8])] = [:]
        var previous: [UInt8]?
        for _ in 0..<n {
            guard let o = r.read(16).map(Array.init), let s = r.readUInt64(), SyncBounds.isValidSeq(s), let h = r.read(32),
                previous.map({ $0.lexicographicallyPrecedes(o) }) ?? true
            else { throw .malformed }
            heads[o] = (s, Array(h))
            previous = o
        }
        guard let m = r.readUInt32(), m <= n, Int(m) * SignedHead.size + 64 == r.remaining else { throw .malformed }
        var signed: [SignedHead] = []
        for _ in 0..<m {
            guard let b = r.read(SignedHead.size) else { throw .malformed }
            let head = try SignedHead(bytes: b)
            guard let covered = heads[head.origin], covered.seq == head.seq, covered.hash == head.hash,
                signed.last.map({ $0.origin.lexicographicallyPrecedes(head.origin) }) ?? true
            else { throw .malformed }
            signed.append(head)
        }
        guard let signature = r.read(64), let publicKey = try? Curve25519.Signing.PublicKey(rawRepresentation: key),
            publicKey.isValidSignature(signature, for: Self.domain + bytes[..<(bytes.count - 64)])
        else { throw .badSnapshot }
        self.space = space
        self.authorKey = Array(key)
        self.createdMs = created
        self.parts = parts
        self.size = size
        self.lastPart = Array(last)
        self.heads = heads
        self.signedHeads = signed
        self.bytes = bytes
    }

    /// Checks each signed head's signature in this manifest's space, and that its key is `keyOf` its origin when
    /// that gives one (the key the log lists): `badHead` otherwise.
    public func verifySignedHeads(keyOf: ([UInt8]) -> [UInt8]?) throws(SyncRejection) {
        for head in signedHeads {
            try head.verify(space: space)
            if let listed = keyOf(head.origin), listed != head.publicKey { throw .badHead }
        }
    }

    /// Equal when the encoded bytes are.
    public static func == (a: SnapshotManifest, b: SnapshotManifest) -> Bool { a.bytes == b.bytes }
}
