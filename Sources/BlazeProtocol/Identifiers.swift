/// A space's id: 16 bytes (random for a legacy space, derived from the creator's key and a salt for a space with a
/// membership log), written as 32 hex digits. Safe to show to relays.
///
/// Ordered by bytes, which is also the order of the hex text. The bytes are exactly what every format encodes.
public struct SpaceID: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The 16 bytes.
    public let bytes: [UInt8]

    /// How many bytes an id has.
    public static let size = 16

    /// Takes `bytes` as an id; nil unless there are exactly 16 (bytes read from a peer, a relay, a file).
    public init?(bytes: some Sequence<UInt8>) {
        let b = Array(bytes)
        guard b.count == Self.size else { return nil }
        self.bytes = b
    }

    /// Takes an id this package computed or generated (always 16 bytes).
    package init(computed id: [UInt8]) {
        precondition(id.count == Self.size, "a space id has 16 bytes")
        self.bytes = id
    }

    /// Parses 32 lowercase hex digits; nil for anything else.
    public init?(hex: String) {
        guard hex.utf8.count == 2 * Self.size, let b = hexBytes(hex) else { return nil }
        self.bytes = b
    }

    /// Lowercase hex of the 16 bytes.
    public var hex: String { hexString(bytes) }

    /// The hex text.
    public var description: String { hex }

    /// Orders by bytes.
    public static func < (a: SpaceID, b: SpaceID) -> Bool { a.bytes.lexicographicallyPrecedes(b.bytes) }
}

/// The hash of a membership operation: 32 bytes (SHA-256 of its encoding), how operations name their parents and
/// how the log's order, heads and epoch keys refer to them.
///
/// Ordered by bytes (operations list their parents ascending).
public struct EntryHash: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The 32 bytes.
    public let bytes: [UInt8]

    /// How many bytes a hash has.
    public static let size = 32

    /// Takes `bytes` as a hash; nil unless there are exactly 32 (bytes read from a peer, a relay, a file).
    public init?(bytes: some Sequence<UInt8>) {
        let b = Array(bytes)
        guard b.count == Self.size else { return nil }
        self.bytes = b
    }

    /// Parses 64 lowercase hex digits; nil for anything else.
    public init?(hex: String) {
        guard hex.utf8.count == 2 * Self.size, let b = hexBytes(hex) else { return nil }
        self.bytes = b
    }

    /// Takes a digest this package computed (always 32 bytes).
    package init(computed digest: [UInt8]) {
        precondition(digest.count == Self.size, "a hash has 32 bytes")
        self.bytes = digest
    }

    /// 32 zero bytes: what a key envelope names for the key of the operation carrying it.
    public static let zero = EntryHash(computed: [UInt8](repeating: 0, count: size))

    /// Lowercase hex of the 32 bytes.
    public var hex: String { hexString(bytes) }

    /// The hex text.
    public var description: String { hex }

    /// Orders by bytes.
    public static func < (a: EntryHash, b: EntryHash) -> Bool { a.bytes.lexicographicallyPrecedes(b.bytes) }
}

/// A key epoch: the number an entry's header carries (4 bytes, big-endian) to name the keys it is sealed with. 1 is a
/// space's first key; each revocation starts the next, and concurrent rotations are combined one past the highest.
/// Every 32-bit value is a well-formed epoch (whether a log reaches it is decided where it is resolved).
public struct Epoch: Hashable, Comparable, Sendable, CustomStringConvertible, ExpressibleByIntegerLiteral {
    /// The number.
    public let value: UInt32

    /// The epoch numbered `value`.
    public init(_ value: UInt32) { self.value = value }

    /// The epoch numbered by a literal.
    public init(integerLiteral value: UInt32) { self.value = value }

    /// The epoch after this one (traps past `UInt32.max`, as the counting it replaces did).
    public var next: Epoch { Epoch(value + 1) }

    /// The number in decimal.
    public var description: String { String(value) }

    /// Orders by number.
    public static func < (a: Epoch, b: Epoch) -> Bool { a.value < b.value }
}

/// A chunk's id (a blob's chunk or manifest): HMAC-SHA256 of its content under its space's chunk-id key, so equal
/// content has one id within a space, and nobody without that key can tell which content an id names or link equal
/// files across spaces. Written as 64 hex digits in documents, file names and RPC.
public struct ChunkID: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The id's bytes.
    public let bytes: [UInt8]
    /// Length of an id in bytes.
    public static let count = 32

    /// An id from bytes that came from outside (a document, a peer, a file name); nil unless they are 32 bytes.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == Self.count else { return nil }
        self.bytes = Array(bytes)
    }

    /// An id from 64 lowercase hex digits; nil for anything else.
    public init?(hex: String) {
        guard hex.utf8.count == Self.count * 2, let bytes = hexBytes(hex) else { return nil }
        self.bytes = bytes
    }

    /// The id as 64 lowercase hex digits.
    public var hex: String { hexString(bytes) }

    /// The id as hex.
    public var description: String { hex }

    /// Orders ids by their bytes.
    public static func < (a: ChunkID, b: ChunkID) -> Bool { a.bytes.lexicographicallyPrecedes(b.bytes) }
}

/// The shape of a sealed chunk that anyone can check without its space's key (a relay, a folder reader): `"BZC1"`,
/// the epoch (4 bytes), a 12-byte nonce, then a box of whole 4 KiB blocks and a 16-byte tag (BlazeBlob's
/// `SealedChunk` seals and opens them).
public enum SealedChunkLayout {
    /// The first four bytes of every sealed chunk.
    public static let magic = Array("BZC1".utf8)
    /// Bytes before the box: magic, epoch, nonce.
    public static let headerCount = 4 + 4 + 12
    /// Bytes of the tag after the box.
    public static let tagCount = 16
    /// The box holds a multiple of this many bytes.
    public static let padding = 4096

    /// Whether `sealed` has a sealed chunk's shape and is at most `maximum` bytes: what a holder without the key can
    /// check before storing it (whether it opens, and as its id, only a member can tell).
    public static func isWellFormed(_ sealed: [UInt8], maximum: Int) -> Bool {
        let box = sealed.count - headerCount - tagCount
        return sealed.count <= maximum && box >= padding && box % padding == 0 && sealed.starts(with: magic)
    }
}
