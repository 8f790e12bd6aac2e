import BlazeProtocol
import Crypto
import Foundation

/// A device's signed statement of what it holds in a space (SYNC.md §11): causal stability is computed from the
/// latest one of every member, and any member may pass on another's, unchanged.
///
/// Binary layout: space (16) · device Ed25519 key (32) · issued (8, Unix ms) · count (4) · count × (origin (16) ·
/// seq (8)), origins in ascending order, each seq from 1 and below 2^62 · signature (64) over
/// `"blazedb ack v1"` · everything before it. A device that was sealed an epoch key it cannot take (SYNC.md §9,
/// "Keys sealed wrong") appends, before the signature, count (2, 1…64) · count × (epoch (4) · the key's operation
/// (32)), in ascending order, and signs with `"blazedb ack v2"` instead.
public struct Acknowledgement: Sendable, Equatable {
    /// The space.
    public let space: SpaceID
    /// The signing device's Ed25519 public key.
    public let deviceKey: [UInt8]
    /// When it was issued, by the device's clock (Unix milliseconds): a later one replaces an earlier one.
    public let issuedMs: UInt64
    /// What the device held per origin (node id) when it signed.
    public let vector: [[UInt8]: UInt64]
    /// The epoch keys an envelope sealed to the device that it could not take (empty in almost every one): any
    /// current admin holding them seals them to it again.
    public let lacking: [EpochKeyID]
    /// The encoded, signed statement.
    public let bytes: [UInt8]

    /// The most origins one acknowledgement may name.
    public static let maxOrigins = 100_000
    /// The most keys one acknowledgement says it lacks.
    public static let maxLacking = 64

    /// The signing device's node id.
    public var node: [UInt8] { Array(SHA256.hash(data: deviceKey).prefix(16)) }

    /// Signs what `identity` holds in `space`, and the keys sealed to it that it lacks (the newest `maxLacking`).
    public init(space: SpaceID, vector: [[UInt8]: UInt64], issuedMs: UInt64, identity: DeviceIdentity, lacking: [EpochKeyID] = []) {
        let key = Array(identity.signingKey.publicKey.rawRepresentation)
        // The newest keys when there are more than fit: the current epoch's are the ones a member needs most, and an
        // admin sealing dead keys wrong cannot push them out.
        let lacking = Set(lacking).sorted { $0.epoch != $1.epoch ? $0.epoch > $1.epoch : $0.op < $1.op }
            .prefix(Self.maxLacking).sorted(by: Self.precedes)
        var body = Self.body(space: space, deviceKey: key, issuedMs: issuedMs, vector: vector)
        if !lacking.isEmpty {
            body.appendBE(UInt16(lacking.count))
            for k in lacking {
                body.appendBE(k.epoch)
                body += k.op.bytes
            }
        }
        // Signing with a valid key cannot fail.
        let signature = Array(try! identity.signingKey.signature(for: Self.label(lacking.isEmpty) + body))
        self.space = space
        self.deviceKey = key
        self.issuedMs = issuedMs
        self.vector = vector.filter { $0.value > 0 }
        self.lacking = lacking
        self.bytes = body + signature
    }

    private static func label(_ plain: Bool) -> [UInt8] { Array((plain ? "blazedb ack v1" : "blazedb ack v2").utf8) }

    private static func precedes(_ a: EpochKeyID, _ b: EpochKeyID) -> Bool {
        a.epoch != b.epoch ? a.epoch < b.epoch : a.op < b.op
    }

    private static func body(space: SpaceID, deviceKey: [UInt8], issuedMs: UInt64, vector: [[UInt8]: UInt64]) -> [UInt8] {
        var out = space.bytes + deviceKey
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
        guard let space = r.readSpaceID(), let key = r.read(32), let issued = r.readUInt64(), let n = r.readUInt32(),
            Int(n) <= Self.maxOrigins, Int(n) * 24 + 64 <= r.remaining
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
        var lacking: [EpochKeyID] = []
        if r.remaining > 64 {
            guard let m = r.readUInt16(), m >= 1, Int(m) <= Self.maxLacking, Int(m) * 36 + 64 == r.remaining else { throw .malformed }
            for _ in 0..<m {
                guard let epoch = r.readEpoch(), let op = r.readEntryHash() else { throw .malformed }
                let k = EpochKeyID(epoch: epoch, op: op)
                guard lacking.last.map({ Self.precedes($0, k) }) ?? true else { throw .malformed }
                lacking.append(k)
            }
        }
        guard let signature = r.read(64), let publicKey = try? Curve25519.Signing.PublicKey(rawRepresentation: key),
            publicKey.isValidSignature(signature, for: Self.label(lacking.isEmpty) + bytes[..<(bytes.count - 64)])
        else { throw .badAck }
        self.lacking = lacking
        self.space = space
        self.deviceKey = Array(key)
        self.issuedMs = issued
        self.vector = vector
        self.bytes = bytes
    }
}
