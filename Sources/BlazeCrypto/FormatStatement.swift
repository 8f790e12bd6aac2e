import BlazeProtocol
import Crypto
import Foundation

/// A device's signed statement of the entry formats it opens in a space (SYNC.md §6, "Entry formats"): a device
/// seals an entry in a newer format only once every current member has stated that it opens it, so no member is
/// ever sent an entry it cannot read.
///
/// Binary layout: space (16) · device Ed25519 key (32) · issued (8, Unix ms) · lowest (1) · highest (1) · signature
/// (64) over `"blazedb entry formats v1"` · everything before it. Any member may pass on another's, unchanged; a later
/// one replaces an earlier one.
public struct FormatStatement: Sendable, Equatable {
    /// The space.
    public let space: SpaceID
    /// The signing device's Ed25519 public key.
    public let deviceKey: [UInt8]
    /// When it was issued, by the device's clock (Unix milliseconds).
    public let issuedMs: UInt64
    /// The entry formats (`EntryHeader` versions) the device opens.
    public let formats: ClosedRange<UInt8>
    /// The encoded, signed statement.
    public let bytes: [UInt8]

    /// Bytes of an encoded statement.
    public static let size = 16 + 32 + 8 + 2 + 64
    private static let label = Array("blazedb entry formats v1".utf8)

    /// The signing device's node id.
    public var node: [UInt8] { Array(SHA256.hash(data: deviceKey).prefix(16)) }

    /// Signs that `identity` opens `formats` in `space`.
    public init(space: SpaceID, formats: ClosedRange<UInt8>, issuedMs: UInt64, identity: DeviceIdentity) {
        let key = Array(identity.signingKey.publicKey.rawRepresentation)
        var body = space.bytes + key
        body.appendBE(issuedMs)
        body += [formats.lowerBound, formats.upperBound]
        // Signing with a valid key cannot fail.
        let signature = Array(try! identity.signingKey.signature(for: Self.label + body))
        self.space = space
        self.deviceKey = key
        self.issuedMs = issuedMs
        self.formats = formats
        self.bytes = body + signature
    }

    /// Decodes and verifies one: its shape (`init(unverified:)`), then the signature.
    public init(bytes: [UInt8]) throws(SyncRejection) {
        try self.init(unverified: bytes)
        guard isSigned else { throw .badStatement }
    }

    /// Decodes one without checking its signature: its exact size, a range of known shape (1 ≤ lowest ≤ highest) and
    /// a time below 2^62 ms. For bytes from elsewhere, check who signed it (`node`, `deviceKey` against the log) and
    /// then `isSigned`, so a flood of strangers' statements costs no signature checks; for this device's own
    /// database, which keeps only verified ones, the shape is enough.
    public init(unverified bytes: [UInt8]) throws(SyncRejection) {
        guard bytes.count == Self.size else { throw .malformed }
        var r = ByteReader(bytes[...])
        guard let space = r.readSpaceID(), let key = r.read(32), let issued = r.readUInt64(), issued < 1 << 62,
            let lowest = r.readUInt8(), let highest = r.readUInt8(), lowest >= 1, lowest <= highest
        else { throw .malformed }
        self.space = space
        self.deviceKey = Array(key)
        self.issuedMs = issued
        self.formats = lowest...highest
        self.bytes = bytes
    }

    /// True when the signature holds for the device key the statement names.
    public var isSigned: Bool {
        guard let publicKey = try? Curve25519.Signing.PublicKey(rawRepresentation: deviceKey) else { return false }
        return publicKey.isValidSignature(bytes[(bytes.count - 64)...], for: Self.label + bytes[..<(bytes.count - 64)])
    }

    /// The newest entry format every listed device opens (`EntryHeader.version` when all of them state a range
    /// reaching at least that far, never more than this build seals), given the latest statement held of each: a
    /// device without one opens only what every build has opened since entries were padded.
    public static func sealedFormat(members: [[UInt8]], statements: [[UInt8]: FormatStatement]) -> UInt8 {
        var format = EntryHeader.newestVersion
        for node in members {
            guard let stated = statements[node], stated.formats.contains(EntryHeader.version) else { return EntryHeader.version }
            format = min(format, stated.formats.upperBound)
        }
        return max(format, EntryHeader.version)
    }
}
