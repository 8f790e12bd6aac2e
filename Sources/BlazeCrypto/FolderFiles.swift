import BlazeProtocol
import Crypto
import Foundation

/// The files of a folder container (SYNC.md §10): segment files of checksummed records, the signed head file and the
/// members file a device writes into its own directory `<folder>/<space>/<device>/`.
///
/// Everything read from a folder is hostile: every decoder checks bounds before arithmetic and allocation, and a
/// record's checksum tells a torn or half-copied record (retried later) from one that is complete.
public enum FolderFiles {
    /// First bytes of a segment file.
    public static let segmentMagic: [UInt8] = Array("BZFS".utf8)
    /// First bytes of a head file.
    public static let headMagic: [UInt8] = Array("BZFH".utf8)
    /// First bytes of a members file.
    public static let membersMagic: [UInt8] = Array("BZFM".utf8)
    /// First bytes of an acknowledgements file.
    public static let acksMagic: [UInt8] = Array("BZFA".utf8)
    /// First bytes of a statements file (`.formats`: builds before protocol 6 skip names starting with a dot).
    public static let formatsMagic: [UInt8] = Array("BZFF".utf8)
    /// The name of a writer's statements file.
    public static let formatsName = ".formats"
    /// The format version of all five files.
    public static let version: UInt8 = 1
    /// Bytes of a segment file's header: magic (4) · version (1) · space (16) · writer (16) · segment number (8).
    public static let segmentHeaderSize = 45
    /// Bytes before a record's body: length (4) · checksum (8).
    public static let recordPrefixSize = 12
    /// Largest record body accepted: one `ENTRIES` message.
    public static let maxRecordBody = SessionCipher.maxMessage
    /// Largest head or members file read.
    public static let maxSmallFile = 16 << 20
    /// The most writer directories a reader takes from one space's directory, and the most segment files from one
    /// writer's directory: a folder tool or a hostile writer making more cannot make a reader open, read and watch
    /// without end (it still lists every name once a round; SYNC.md §10, "Limits").
    public static let maxWriterDirectories = 1_000, maxFilesPerDirectory = 10_000

    /// File name of segment `number`: 16 lowercase hex digits and `.seg`.
    public static func segmentName(_ number: UInt64) -> String {
        let hex = String(number, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex + ".seg"
    }

    /// The number of a segment file named exactly as its writer names them; nil for anything else (copies the folder
    /// tool renamed, temporary files).
    public static func segmentNumber(_ name: String) -> UInt64? {
        guard name.utf8.count == 20, name.hasSuffix(".seg") else { return nil }
        let hex = name.prefix(16)
        guard hex.allSatisfy({ $0.isHexDigit && !$0.isUppercase }) else { return nil }
        return UInt64(hex, radix: 16)
    }

    /// A segment file's header.
    public static func segmentHeader(space: SpaceID, writer: [UInt8], number: UInt64) -> [UInt8] {
        var out = segmentMagic + [version] + space.bytes + writer
        out.appendBE(number)
        return out
    }

    /// Checks a segment file's header against the space and the directory it lies in.
    public static func checkSegmentHeader(_ bytes: ArraySlice<UInt8>, space: SpaceID, writer: [UInt8]) -> Bool {
        segmentHeaderProblem(bytes, space: space, writer: writer) == nil
    }

    /// Why a segment file's header is not one of this space's and directory's: `incompatibleProtocol` for a file of
    /// a newer format (written by a newer build), `malformed` for anything else.
    public static func segmentHeaderProblem(_ bytes: ArraySlice<UInt8>, space: SpaceID, writer: [UInt8]) -> SyncRejection? {
        var r = ByteReader(bytes)
        guard let magic = r.read(4), Array(magic) == segmentMagic else { return .malformed }
        do { try readVersion(&r) } catch { return error }
        guard let s = r.read(16), Array(s) == space.bytes, let w = r.read(16), Array(w) == writer, r.readUInt64() != nil
        else { return .malformed }
        return nil
    }

    /// Reads a file's version byte: this build's passes; a higher one is a newer build's format, refused as
    /// `incompatibleProtocol` (never read as if it were this one); anything else is `malformed`.
    static func readVersion(_ r: inout ByteReader) throws(SyncRejection) {
        guard let v = r.readUInt8() else { throw .malformed }
        guard v <= version else { throw .incompatibleProtocol }
        guard v == version else { throw .malformed }
    }

    /// The checksum of a record body: the first 8 bytes of its SHA-256.
    static func checksum(_ body: some DataProtocol) -> [UInt8] { Array(SHA256.hash(data: body).prefix(8)) }

    /// A record: length (4, big-endian) · checksum (8) · body.
    public static func record(_ body: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(recordPrefixSize + body.count)
        out.appendBE(UInt32(body.count))
        out += checksum(body)
        out += body
        return out
    }

    /// What lies at the start of some bytes of a segment after its header.
    public enum RecordScan: Equatable {
        /// A complete record whose checksum holds: its body, and the bytes it takes in all.
        case record(body: Range<Int>, size: Int)
        /// Not all of the record is there yet (a write in progress, a half-copied file): read again later.
        case incomplete
        /// The bytes are not a record: a length out of bounds, or a checksum that does not hold (a torn write the
        /// writer will cut off, or damage). Nothing after it in the file can be trusted.
        case damaged
    }

    /// Reads the record at the start of `bytes`.
    public static func scanRecord(_ bytes: ArraySlice<UInt8>) -> RecordScan {
        guard bytes.count >= recordPrefixSize else { return .incomplete }
        var r = ByteReader(bytes)
        guard let length = r.readUInt32(), length > 0, Int(length) <= maxRecordBody, let sum = r.read(8) else {
            return .damaged
        }
        let start = bytes.startIndex + recordPrefixSize
        guard bytes.count - recordPrefixSize >= Int(length) else { return .incomplete }
        let body = start..<(start + Int(length))
        guard checksum(bytes[body]).elementsEqual(sum) else { return .damaged }
        return .record(body: body, size: recordPrefixSize + Int(length))
    }

    /// The signed head file of a writer's directory: which generation of the directory it describes, the writer's
    /// own latest signed head, and what the writer holds. `generation` only grows: a lower one than seen before is a rolled-back copy.
    public struct Head: Sendable, Equatable {
        /// The space.
        public let space: SpaceID
        /// The writer's Ed25519 public key; its node id names the directory.
        public let writerKey: [UInt8]
        /// Grows by one each time the writer replaces the file.
        public let generation: UInt64
        /// Unix milliseconds at writing, for humans.
        public let timeMs: UInt64
        /// The number of the segment the writer appends to.
        public let segment: UInt64
        /// The writer's own latest signed head, nil before it wrote anything.
        public let ownHead: SignedHead?
        /// What the writer's database holds: the highest seq per origin (16-byte node id). Entries every current
        /// member holds are no longer needed in the folder, and their writers remove them.
        public let held: [[UInt8]: UInt64]
        /// The writer's Ed25519 signature over everything before it.
        public let signature: [UInt8]

        /// The writer's node id.
        public var writer: [UInt8] { Array(SHA256.hash(data: writerKey).prefix(16)) }

        static func signed(
            space: SpaceID, key: [UInt8], generation: UInt64, timeMs: UInt64, segment: UInt64, ownHead: SignedHead?,
            held: [[UInt8]: UInt64]
        ) -> [UInt8] {
            var out = headMagic + [version] + space.bytes + key
            out.appendBE(generation)
            out.appendBE(timeMs)
            out.appendBE(segment)
            if let ownHead { out += [1] + ownHead.bytes } else { out.append(0) }
            out.appendBE(UInt32(held.count))
            for (origin, seq) in held.sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
                out += origin
                out.appendBE(seq)
            }
            return out
        }

        /// Signs a head file with the device's key.
        public static func encode(
            space: SpaceID, identity: DeviceIdentity, generation: UInt64, timeMs: UInt64, segment: UInt64,
            ownHead: SignedHead?, held: [[UInt8]: UInt64] = [:]
        ) -> [UInt8] {
            let key = Array(identity.signingKey.publicKey.rawRepresentation)
            let body = signed(
                space: space, key: key, generation: generation, timeMs: timeMs, segment: segment, ownHead: ownHead, held: held)
            let message = Array("blazedb folder head v1".utf8) + body
            // Signing with a valid key cannot fail.
            return body + Array(try! identity.signingKey.signature(for: message))
        }

        /// Decodes a head file and checks its signature, its space and that its key is the one of `writer` (the
        /// directory it lies in); the own head inside is checked too.
        public init(bytes: [UInt8], space: SpaceID, writer: [UInt8]) throws(SyncRejection) {
            var r = ByteReader(bytes[...])
            guard let magic = r.read(4), Array(magic) == FolderFiles.headMagic else { throw .malformed }
            try FolderFiles.readVersion(&r)
            guard let s = r.read(16), let k = r.read(32), let g = r.readUInt64(), let t = r.readUInt64(), let seg = r.readUInt64(),
                let flag = r.readUInt8(), flag <= 1
            else { throw .malformed }
            guard Array(s) == space.bytes else { throw .wrongSpace }
            var own: SignedHead?
            if flag == 1 {
                guard let h = r.read(SignedHead.size) else { throw .malformed }
                own = try SignedHead(bytes: h)
            }
            guard let n = r.readUInt32(), Int(n) <= r.remaining / 24 else { throw .malformed }
            var vector: [[UInt8]: UInt64] = [:]
            for _ in 0..<n {
                guard let o = r.read(16), let s = r.readUInt64(), SyncBounds.isValidSeq(s),
                    vector.updateValue(s, forKey: Array(o)) == nil
                else { throw .malformed }
            }
            guard let sig = r.read(64), r.remaining == 0 else { throw .malformed }
            let key = Array(k)
            let body = Array(bytes[..<(bytes.count - 64)])
            guard Array(SHA256.hash(data: key).prefix(16)) == writer,
                let publicKey = try? Curve25519.Signing.PublicKey(rawRepresentation: key),
                publicKey.isValidSignature(sig, for: Array("blazedb folder head v1".utf8) + body)
            else { throw .badHead }
            if let own {
                guard own.origin == writer else { throw .badHead }
                try own.verify(space: space)
            }
            self.space = space
            writerKey = key
            generation = g
            timeMs = t
            segment = seg
            ownHead = own
            held = vector
            signature = Array(sig)
        }
    }

    /// A members file: membership operations, each signed by its author (checked when decoded by `MembershipOp`).
    public static func members(space: SpaceID, ops: [[UInt8]]) -> [UInt8] { list(membersMagic, space: space, items: ops) }

    /// The operations of a members file, undecoded; throws for a file that is not one of `space`.
    public static func decodeMembers(_ bytes: [UInt8], space: SpaceID) throws(SyncRejection) -> [[UInt8]] {
        try decodeList(membersMagic, bytes, space: space)
    }

    /// An acknowledgements file (SYNC.md §10, §11): the latest acknowledgement the writer holds of each member, its own
    /// among them, each signed by its member (checked when decoded by `Acknowledgement`).
    public static func acks(space: SpaceID, acks: [[UInt8]]) -> [UInt8] { list(acksMagic, space: space, items: acks) }

    /// The acknowledgements of an acknowledgements file, undecoded; throws for a file that is not one of `space`.
    public static func decodeAcks(_ bytes: [UInt8], space: SpaceID) throws(SyncRejection) -> [[UInt8]] {
        try decodeList(acksMagic, bytes, space: space)
    }

    /// `magic` · version · space (16) · count (4) · count × (length (4) · item).
    /// A statements file (SYNC.md §6, "Entry formats"): the latest statement the writer holds of each member, its own
    /// among them, each signed by its member (checked when decoded by `FormatStatement`).
    public static func formats(space: SpaceID, statements: [[UInt8]]) -> [UInt8] { list(formatsMagic, space: space, items: statements) }

    /// The statements of a statements file, undecoded; throws for a file that is not one of `space`.
    public static func decodeFormats(_ bytes: [UInt8], space: SpaceID) throws(SyncRejection) -> [[UInt8]] {
        try decodeList(formatsMagic, bytes, space: space)
    }

    private static func list(_ magic: [UInt8], space: SpaceID, items: [[UInt8]]) -> [UInt8] {
        var out = magic + [version] + space.bytes
        out.appendBE(UInt32(items.count))
        for item in items {
            out.appendBE(UInt32(item.count))
            out += item
        }
        return out
    }

    /// The items of a `list` file that starts with `magic`; throws for another file or one of another space.
    private static func decodeList(_ magic: [UInt8], _ bytes: [UInt8], space: SpaceID) throws(SyncRejection) -> [[UInt8]] {
        var r = ByteReader(bytes[...])
        guard let m = r.read(4), Array(m) == magic else { throw .malformed }
        try readVersion(&r)
        guard let s = r.read(16), let n = r.readUInt32(), Int(n) <= r.remaining / 4 else { throw .malformed }
        guard Array(s) == space.bytes else { throw .wrongSpace }
        var items: [[UInt8]] = []
        for _ in 0..<n {
            guard let length = r.readUInt32(), let item = r.read(Int(length)) else { throw .malformed }
            items.append(Array(item))
        }
        guard r.remaining == 0 else { throw .malformed }
        return items
    }
}
