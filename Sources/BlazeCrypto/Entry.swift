import BlazeProtocol
import Crypto
import Foundation

/// The plaintext header of an entry, authenticated as the AEAD's associated data (ARCHITECTURE.md, "Sync and
/// transports").
///
/// Binary layout, big-endian: version (1) · space id (16) · origin (16) · seq (8) · prev (32) · epoch (4) · nonce (12).
/// Version 2 pads the plaintext to a size bucket (`EntryPadding`); version 1 (entries sealed before padding) does
/// not, and is still opened. Version 3 is version 2 whose payload carries vector values as bytes (`VectorPacking`),
/// sealed only in spaces whose every member has stated that it opens it (`FormatStatement`).
public struct EntryHeader: Sendable, Equatable {
    /// The format every build since padding opens: what is sealed unless every member opens a newer one.
    public static let version: UInt8 = 2
    /// The newest format this build seals.
    public static let newestVersion: UInt8 = 3
    /// Versions read.
    public static let versions: ClosedRange<UInt8> = 1...3
    /// Encoded size in bytes.
    public static let size = 1 + 16 + 16 + 8 + 32 + 4 + 12

    /// This entry's format version.
    public var version: UInt8
    /// The space (database) the entry belongs to.
    public var space: SpaceID
    /// The authoring device's node id.
    public var origin: [UInt8]
    /// The change's sequence number within its origin (from 1).
    public var seq: UInt64
    /// SHA-256 of the origin's previous entry; 32 zero bytes for seq 1.
    public var prev: [UInt8]
    /// Key epoch the entry is sealed with.
    public var epoch: Epoch
    /// AEAD nonce (random).
    public var nonce: [UInt8]

    /// The encoded header.
    public var bytes: [UInt8] {
        var out: [UInt8] = [version]
        out.reserveCapacity(Self.size)
        out += space.bytes
        out += origin
        out.appendBE(seq)
        out += prev
        out.appendBE(epoch)
        out += nonce
        return out
    }

    /// Decodes a header from the start of `bytes`.
    public init(decoding bytes: ArraySlice<UInt8>) throws(SyncRejection) {
        var r = ByteReader(bytes)
        guard let version = r.readUInt8(), Self.versions.contains(version), let space = r.readSpaceID(), let origin = r.read(16),
            let seq = r.readUInt64(), SyncBounds.isValidSeq(seq), let prev = r.read(32), let epoch = r.readEpoch(),
            let nonce = r.read(12)
        else { throw .malformed }
        self.init(
            version: version, space: space, origin: Array(origin), seq: seq, prev: Array(prev), epoch: epoch,
            nonce: Array(nonce))
    }

    /// Creates a header (of the current version unless told).
    public init(
        version: UInt8 = EntryHeader.version, space: SpaceID, origin: [UInt8], seq: UInt64, prev: [UInt8], epoch: Epoch,
        nonce: [UInt8]
    ) {
        self.version = version
        self.space = space
        self.origin = origin
        self.seq = seq
        self.prev = prev
        self.epoch = epoch
        self.nonce = nonce
    }
}

/// A sealed op-log entry as it travels and is stored by peers, relays and folders: header, then ciphertext and tag.
public struct SealedEntry: Sendable, Equatable {
    /// The encoded entry.
    public let bytes: [UInt8]
    /// Its decoded header.
    public let header: EntryHeader
    /// SHA-256 of the whole entry: what `prev` of the next entry and signed heads refer to.
    public let hash: [UInt8]

    /// The 32 zero bytes that stand for "no previous entry".
    public static let genesis = [UInt8](repeating: 0, count: 32)

    /// Seals `payload` (the canonical change text), padded to its size bucket, as entry `seq` of `origin`, chained
    /// to `prev`: in format 3 when `format` allows it (unless the payload holds a `$vector` string format 3 cannot
    /// carry exactly, which no write accepts), in format 2 otherwise.
    public static func seal(
        _ payload: some DataProtocol, space key: SpaceKey, origin: [UInt8], seq: UInt64, prev: [UInt8],
        format: UInt8 = EntryHeader.version
    ) -> SealedEntry {
        var version = EntryHeader.version
        let padded: [UInt8]
        if format >= 3, let packed = VectorPacking.pack(payload) {
            version = 3
            padded = EntryPadding.pad(packed)
        } else {
            padded = EntryPadding.pad(payload)
        }
        let nonce = ChaChaPoly.Nonce()
        let header = EntryHeader(
            version: version, space: key.id, origin: origin, seq: seq, prev: prev, epoch: key.epoch, nonce: Array(nonce))
        let headerBytes = header.bytes
        // Callers check `key.canSeal`; sealing with a valid key and nonce cannot fail.
        let box = try! ChaChaPoly.seal(padded, using: key.sealing!, nonce: nonce, authenticating: headerBytes)
        let bytes = headerBytes + box.ciphertext + box.tag
        return SealedEntry(bytes: bytes, header: header, hash: Array(SHA256.hash(data: bytes)))
    }

    /// Parses an encoded entry (header and length only; `open` authenticates it).
    public init(bytes: [UInt8]) throws(SyncRejection) {
        guard bytes.count >= EntryHeader.size + 16 else { throw .malformed }
        self.header = try EntryHeader(decoding: bytes[...])
        self.bytes = bytes
        self.hash = Array(SHA256.hash(data: bytes))
    }

    /// An entry read back from local storage, where its hash was computed when it was stored.
    public init(stored bytes: [UInt8], hash: [UInt8]) throws(SyncRejection) {
        guard bytes.count >= EntryHeader.size + 16 else { throw .malformed }
        self.header = try EntryHeader(decoding: bytes[...])
        self.bytes = bytes
        self.hash = hash
    }

    init(bytes: [UInt8], header: EntryHeader, hash: [UInt8]) {
        self.bytes = bytes
        self.header = header
        self.hash = hash
    }

    /// The bytes after the header: ciphertext and tag.
    var sealedPart: ArraySlice<UInt8> { bytes[EntryHeader.size...] }

    /// Authenticates and decrypts the payload with the space key.
    public func open(with key: SpaceKey) throws(SyncRejection) -> [UInt8] {
        guard header.space == key.id else { throw .wrongSpace }
        let keys = key.entryKeys(epoch: header.epoch)
        guard !keys.isEmpty else { throw .unknownEpoch }
        let n = EntryHeader.size
        // The box in its combined form (nonce · ciphertext · tag), built with one copy of the sealed part:
        // `SealedBox(nonce:ciphertext:tag:)` concatenates through generic collection code, which cost as much as
        // the decryption on an entry of a few hundred bytes.
        var combined = Data(capacity: header.nonce.count + bytes.count - n)
        combined.append(contentsOf: header.nonce)
        bytes.withUnsafeBufferPointer { combined.append(UnsafeBufferPointer(rebasing: $0[n...])) }
        guard let box = try? ChaChaPoly.SealedBox(combined: combined) else { throw .badSeal }
        // Concurrent rotations can give two keys one epoch number: the one that authenticates is the entry's.
        for entryKey in keys {
            if let plain = try? ChaChaPoly.open(box, using: entryKey, authenticating: bytes[..<n]) {
                guard header.version >= 2 else { return Array(plain) }
                let payload = try EntryPadding.unpad(plain)
                return header.version == 3 ? try VectorPacking.unpack(payload) : payload
            }
        }
        throw .badSeal
    }
}

/// How a version-2 entry hides its payload's exact size (Protocol/SYNC.md §6, "Padding"): the plaintext is the
/// payload, one `0x80` byte, then zeros up to a bucket — at least 128 bytes, above that the Padmé sizes (Nikitin et
/// al., "Reducing Metadata Leakage from Encrypted Files and Communication with PURBs", 2019), which leak
/// O(log log n) bits of a size n and cost at most 12 % more bytes. A relay or folder sees only the bucket.
public enum EntryPadding {
    /// The smallest padded plaintext.
    public static let minimum = 128

    /// The padded size of a plaintext of `length` bytes (marker included).
    public static func bucket(_ length: Int) -> Int {
        guard length > minimum else { return minimum }
        let e = Int.bitWidth - 1 - length.leadingZeroBitCount  // floor(log2 length)
        let s = Int.bitWidth - e.leadingZeroBitCount  // floor(log2 e) + 1
        let mask = (1 << (e - s)) - 1
        return (length + mask) & ~mask
    }

    /// `payload`, the marker, and zeros up to its bucket.
    public static func pad(_ payload: some DataProtocol) -> [UInt8] {
        var out = [UInt8]()
        let size = bucket(payload.count + 1)
        out.reserveCapacity(size)
        out.append(contentsOf: payload)
        out.append(0x80)
        out.append(contentsOf: repeatElement(0, count: size - out.count))
        return out
    }

    /// The payload of a padded plaintext; throws `badSeal` when the padding is not there (only a key holder could
    /// have sealed it, so a wrong one is a damaged or malicious entry).
    public static func unpad(_ plain: some DataProtocol) throws(SyncRejection) -> [UInt8] {
        // Scanned in place when the bytes are contiguous (they are, from `open`): one copy, of the payload only.
        func payload(_ bytes: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
            guard let marker = bytes.lastIndex(where: { $0 != 0 }), bytes[marker] == 0x80 else { return nil }
            return Array(bytes[..<marker])
        }
        let result = plain.withContiguousStorageIfAvailable(payload) ?? Array(plain).withUnsafeBufferPointer(payload)
        guard let result else { throw .badSeal }
        return result
    }
}

/// Consecutive entries of one origin packed for the wire (SYNC.md, "Entries on the wire").
///
/// Space, origin, sequence numbers and `prev` links are the same for every entry of a run or follow from the previous
/// entry, so they are sent once: `space (16) · origin (16) · first seq (8) · first prev (32)`, then per entry only
/// `nonce (12) · epoch (varint) · length (varint) · ciphertext and tag`. The receiver rebuilds each full entry, and
/// with it each hash, exactly as sealed; a changed byte anywhere still fails the AEAD or the signed head.
public enum EntryRun {
    /// Bytes of the run's prefix.
    public static let prefixSize = 16 + 16 + 8 + 32

    /// Appends the packed form of `entries`, which must be one origin's consecutive, linked entries.
    public static func pack(_ entries: [SealedEntry], into out: inout [UInt8]) throws(SyncRejection) {
        guard let first = entries.first else { throw .malformed }
        out += first.header.space.bytes
        out += first.header.origin
        out.appendBE(first.header.seq)
        out += first.header.prev
        var prev = first.header.prev
        for (i, e) in entries.enumerated() {
            guard e.header.space == first.header.space, e.header.origin == first.header.origin,
                e.header.seq == first.header.seq + UInt64(i), e.header.prev == prev
            else { throw .malformed }
            out.append(e.header.version)
            out += e.header.nonce
            out.appendVarint(UInt64(e.header.epoch.value))
            out.appendVarint(UInt64(e.bytes.count - EntryHeader.size))
            out += e.sealedPart
            prev = e.hash
        }
    }

    /// Reads `count` packed entries, rebuilding each full entry and its hash.
    public static func unpack(_ r: inout ByteReader, count: Int) throws(SyncRejection) -> [SealedEntry] {
        // Bounds before arithmetic: the run's last seq (`firstSeq + count - 1`) stays below `SyncBounds.maxSeq`.
        guard count > 0, let space = r.readSpaceID(), let origin = r.read(16), let firstSeq = r.readUInt64(),
            SyncBounds.isValidSeq(firstSeq), UInt64(count) <= SyncBounds.maxSeq - firstSeq,
            let firstPrev = r.read(32), count <= r.remaining / (1 + 12 + 1 + 1 + 16)
        else { throw .malformed }
        var entries: [SealedEntry] = []
        entries.reserveCapacity(count)
        var prev = Array(firstPrev)
        for i in 0..<count {
            guard let version = r.readUInt8(), EntryHeader.versions.contains(version), let nonce = r.read(12),
                let epoch = r.readVarint(), epoch <= UInt64(UInt32.max),
                let length = r.readVarint(), length >= 16, length <= UInt64(r.remaining), let sealed = r.read(Int(length))
            else { throw .malformed }
            let header = EntryHeader(
                version: version, space: space, origin: Array(origin), seq: firstSeq + UInt64(i), prev: prev,
                epoch: Epoch(UInt32(epoch)), nonce: Array(nonce))
            let bytes = header.bytes + sealed
            let entry = SealedEntry(bytes: bytes, header: header, hash: Array(SHA256.hash(data: bytes)))
            prev = entry.hash
            entries.append(entry)
        }
        return entries
    }
}

/// An origin's signature over the last entry of a batch it published: `(space, origin, seq, entry hash)`.
///
/// Carries the origin's Ed25519 public key; the node id is the first 16 bytes of its SHA-256, so the key is checked
/// against the origin it claims. Binary layout: origin (16) · seq (8) · hash (32) · public key (32) · signature (64).
public struct SignedHead: Sendable, Hashable {
    /// Encoded size in bytes.
    public static let size = 16 + 8 + 32 + 32 + 64

    /// The origin that signed.
    public let origin: [UInt8]
    /// The sequence of the entry signed.
    public let seq: UInt64
    /// That entry's hash.
    public let hash: [UInt8]
    /// The origin's Ed25519 public key.
    public let publicKey: [UInt8]
    /// Ed25519 signature of `message(space:)`.
    public let signature: [UInt8]

    static func message(space: SpaceID, origin: [UInt8], seq: UInt64, hash: [UInt8]) -> [UInt8] {
        var m = Array("blazedb head v1".utf8) + space.bytes + origin
        m.appendBE(seq)
        return m + hash
    }

    /// Signs the head of `entry` with the device's key (the entry's origin must be this device).
    public init(signing entry: SealedEntry, identity: DeviceIdentity) {
        origin = entry.header.origin
        seq = entry.header.seq
        hash = entry.hash
        publicKey = Array(identity.signingKey.publicKey.rawRepresentation)
        let m = Self.message(space: entry.header.space, origin: origin, seq: seq, hash: hash)
        // Signing with a valid key cannot fail.
        signature = Array(try! identity.signingKey.signature(for: m))
    }

    /// Decodes an encoded head (`verify` checks it).
    public init(bytes: ArraySlice<UInt8>) throws(SyncRejection) {
        var r = ByteReader(bytes)
        guard let o = r.read(16), let s = r.readUInt64(), SyncBounds.isValidSeq(s), let h = r.read(32), let k = r.read(32), let sig = r.read(64),
            r.remaining == 0
        else { throw .malformed }
        origin = Array(o)
        seq = s
        hash = Array(h)
        publicKey = Array(k)
        signature = Array(sig)
    }

    /// The encoded head.
    public var bytes: [UInt8] {
        var out = origin
        out.appendBE(seq)
        return out + hash + publicKey + signature
    }

    /// Checks that the key belongs to the origin and the signature covers this head in `space`.
    public func verify(space: SpaceID) throws(SyncRejection) {
        guard Array(SHA256.hash(data: publicKey).prefix(16)) == origin,
            let key = try? Curve25519.Signing.PublicKey(rawRepresentation: publicKey),
            key.isValidSignature(signature, for: Self.message(space: space, origin: origin, seq: seq, hash: hash))
        else { throw .badHead }
    }
}

/// Verifies a batch of one origin's entries as a receiver must before applying any of it.
public enum EntryChain {
    /// Checks that `entries` are consecutive entries of `head.origin` in `key`'s space, each linked to the previous
    /// one (the first to `previousHash`, the hash of the entry before it, when the receiver has that entry), that the
    /// last is the one `head` signs, and that every entry opens. Returns the decrypted payloads in order.
    public static func verify(
        _ entries: [SealedEntry], head: SignedHead, previousHash: [UInt8]?, key: SpaceKey
    ) throws(SyncRejection) -> [[UInt8]] {
        var payloads: [[UInt8]] = []
        payloads.reserveCapacity(entries.count)
        try walk(entries, head: head, previousHash: previousHash, space: key.id) { e throws(SyncRejection) in
            payloads.append(try e.open(with: key))
        }
        return payloads
    }

    /// What a holder without the space's key (a relay) can check of a batch: everything `verify` checks but the
    /// opening of each entry — the head's signature, and that the entries are consecutive entries of its origin in
    /// `space`, linked to each other (and to `previousHash`), ending at the entry the head signs.
    public static func verifyLinks(
        _ entries: [SealedEntry], head: SignedHead, previousHash: [UInt8]?, space: SpaceID
    ) throws(SyncRejection) {
        try walk(entries, head: head, previousHash: previousHash, space: space) { _ throws(SyncRejection) in }
    }

    /// Checks the head and the links, calling `each` on every entry in order once its place in the chain is checked.
    private static func walk(
        _ entries: [SealedEntry], head: SignedHead, previousHash: [UInt8]?, space: SpaceID,
        _ each: (SealedEntry) throws(SyncRejection) -> Void
    ) throws(SyncRejection) {
        guard let first = entries.first, let last = entries.last else { throw .malformed }
        try head.verify(space: space)
        guard last.header.seq == head.seq, last.hash == head.hash else { throw .badHead }
        if first.header.seq == 1 {
            guard first.header.prev == SealedEntry.genesis else { throw .brokenChain }
        } else if let previousHash, first.header.prev != previousHash {
            throw .brokenChain
        }
        var prev: [UInt8]? = nil
        for (i, e) in entries.enumerated() {
            guard e.header.origin == head.origin, e.header.seq == first.header.seq + UInt64(i) else { throw .malformed }
            if let prev, e.header.prev != prev { throw .brokenChain }
            guard e.header.space == space else { throw .wrongSpace }
            try each(e)
            prev = e.hash
        }
    }
}
