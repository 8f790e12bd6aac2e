import BlazeProtocol
import Crypto
import Foundation

/// A device's signed statement of what it holds in a space (SYNC.md §11): causal stability is computed from the
/// latest one of every member, and any member may pass on another's, unchanged.
///
/// Binary layout: space (16) · device Ed25519 key (32) · issued (8, Unix ms) · count (4) · count × (origin (16) ·
/// seq (8)), origins in ascending order, each seq from 1 and below 2^62 · signature (64) over
/// `"blazedb ack v1"` · everything before it.
public struct Acknowledgement: Sendable, Equatable {
    /// The space.
    public let space: [UInt8]
    /// The signing device's Ed25519 public key.
    public let deviceKey: [UInt8]
    /// When it was issued, by the device's clock (Unix milliseconds): a later one replaces an earlier one.
    public let issuedMs: UInt64
    /// What the device held per origin (node id) when it signed.
    public let vector: [[UInt8]: UInt64]
    /// The encoded, signed statement.
    public let bytes: [UInt8]

    /// The most origins one acknowledgement may name.
    public static let maxOrigins = 100_000

    /// The signing device's node id.
    public var node: [UInt8] { Array(SHA256.hash(data: deviceKey).prefix(16)) }

    /// Signs what `identity` holds in `space`.
    public init(space: [UInt8], vector: [[UInt8]: UInt64], issuedMs: UInt64, identity: DeviceIdentity) {
        let key = Array(identity.signingKey.publicKey.rawRepresentation)
        let body = Self.body(space: space, deviceKey: key, issuedMs: issuedMs, vector: vector)
        // Signing with a valid key cannot fail.
        let signature = Array(try! identity.signingKey.signature(for: Array("blazedb ack v1".utf8) + body))
        self.space = space
        self.deviceKey = key
        self.issuedMs = issuedMs
        self.vector = vector.filter { $0.value > 0 }
        self.bytes = body + signature
    }

    private static func body(space: [UInt8], deviceKey: [UInt8], issuedMs: UInt64, vector: [[UInt8]: UInt64]) -> [UInt8] {
        var out = space + deviceKey
        out.appendBE(issuedMs)
        let entries = vector.filter { $0.value > 0 }.sorted { $0.key.lexicographicallyPrecedes($1.key) }
        out.appendBE(UInt32(entries.count))
        for (origin, seq) in entries {
            out += origin
            out.appendBE(seq)
        }
        return out
    }

    /// Decodes and verifies one: the layout's bounds, origins strictly ascending, and the signature.
    public init(bytes: [UInt8]) throws(SyncRejection) {
        var r = ByteReader(bytes[...])
        guard let space = r.read(16), let key = r.read(32), let issued = r.readUInt64(), let n = r.readUInt32(),
            Int(n) <= Self.maxOrigins, Int(n) * 24 + 64 == r.remaining
        else { throw .malformed }
        var vector: [[UInt8]: UInt64] = [:]
        var last: [UInt8]?
        for _ in 0..<n {
            guard let o = r.read(16).map(Array.init), let s = r.readUInt64(), SyncBounds.isValidSeq(s),
                last.map({ $0.lexicographicallyPrecedes(o) }) ?? true
            else { throw .malformed }
            vector[o] = s
            last = o
        }
        guard let signature = r.read(64), let publicKey = try? Curve25519.Signing.PublicKey(rawRepresentation: key),
            publicKey.isValidSignature(signature, for: Array("blazedb ack v1".utf8) + bytes[..<(bytes.count - 64)])
        else { throw .badAck }
        self.space = Array(space)
        self.deviceKey = Array(key)
        self.issuedMs = issued
        self.vector = vector
        self.bytes = bytes
    }
}
