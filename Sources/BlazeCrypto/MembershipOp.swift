import BlazeProtocol
import Crypto
import Foundation

/// What a device may do in a space (SYNC.md §9).
public enum MemberRole: UInt8, Sendable, CaseIterable {
    /// Invites, revokes and writes.
    case admin = 1
    /// Writes.
    case writer = 2
    /// Receives and decrypts; its writes are refused.
    case reader = 3

    /// The role's name on the wire and in the CLI.
    public var name: String {
        switch self {
        case .admin: "admin"
        case .writer: "writer"
        case .reader: "reader"
        }
    }

    /// The role named `name`, nil for any other string.
    public init?(name: String) {
        guard let role = Self.allCases.first(where: { $0.name == name }) else { return nil }
        self = role
    }

    /// True for roles whose entries members accept.
    public var writes: Bool { self != .reader }
}

/// Why a membership operation was refused before it could be applied.
public struct MembershipError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong, for humans.
    public var description: String

    init(_ description: String) { self.description = description }
}

/// One epoch key sealed to one member's X25519 key with HPKE (X25519, HKDF-SHA256, ChaCha20-Poly1305).
public struct KeyEnvelope: Sendable, Hashable {
    /// Node id of the member who can open it.
    public let recipient: [UInt8]
    /// The epoch the key seals entries of.
    public let epoch: Epoch
    /// Hash of the operation that created the key; all zeros for the operation carrying the envelope.
    public let keyOp: EntryHash
    /// HPKE encapsulated key (32 bytes).
    public let encapsulated: [UInt8]
    /// The sealed 32-byte key and its tag.
    public let ciphertext: [UInt8]

    /// Bytes of one encoded envelope.
    static let size = 16 + 4 + 32 + 32 + 48
    /// `keyOp` of a key created by the operation that carries it.
    public static let thisOp = EntryHash.zero

    /// What a version-2 `create` or `remove` publishes of the epoch key it makes (SYNC.md §9, "Logs that commit"):
    /// HMAC-SHA256 keyed with the key over a label, the space and the epoch. It shows nothing of the key, and a
    /// member takes from an envelope only the key it commits to, so an admin cannot hand chosen members another key.
    public static func commitment(secret: [UInt8], space: SpaceID, epoch: Epoch) -> [UInt8] {
        var m = Array("blazedb epoch key commitment v1".utf8) + space.bytes
        m.appendBE(epoch)
        return Array(HMAC<SHA256>.authenticationCode(for: m, using: SymmetricKey(data: secret)))
    }

    static func info(space: SpaceID, recipient: [UInt8], epoch: Epoch, keyOp: EntryHash) -> Data {
        var info = Array("blazedb epoch key v1".utf8) + space.bytes + recipient
        info.appendBE(epoch)
        return Data(info + keyOp.bytes)
    }

    /// Seals `secret` (the key of `epoch` created by `keyOp`) to `recipient`.
    public init(
        sealing secret: [UInt8], space: SpaceID, epoch: Epoch, keyOp: EntryHash, to recipient: DevicePublicKeys
    ) throws {
        let key = try Curve25519.KeyAgreement.PublicKey(rawRepresentation: recipient.agreement)
        var sender = try HPKE.Sender(
            recipientKey: key, ciphersuite: .Curve25519_SHA256_ChachaPoly,
            info: Self.info(space: space, recipient: recipient.nodeID, epoch: epoch, keyOp: keyOp))
        self.recipient = recipient.nodeID
        self.epoch = epoch
        self.keyOp = keyOp
        self.encapsulated = Array(sender.encapsulatedKey)
        self.ciphertext = Array(try sender.seal(secret))
    }

    init(recipient: [UInt8], epoch: Epoch, keyOp: EntryHash, encapsulated: [UInt8], ciphertext: [UInt8]) {
        self.recipient = recipient
        self.epoch = epoch
        self.keyOp = keyOp
        self.encapsulated = encapsulated
        self.ciphertext = ciphertext
    }

    /// Opens the envelope with this device's key; nil when it is not for `identity` or does not open.
    public func open(space: SpaceID, identity: DeviceIdentity) -> [UInt8]? {
        guard recipient == identity.nodeID,
            var r = try? HPKE.Recipient(
                privateKey: identity.agreementKey, ciphersuite: .Curve25519_SHA256_ChachaPoly,
                info: Self.info(space: space, recipient: recipient, epoch: epoch, keyOp: keyOp),
                encapsulatedKey: Data(encapsulated)),
            let secret = try? r.open(ciphertext), secret.count == 32
        else { return nil }
        return Array(secret)
    }

    func encode(into out: inout [UInt8]) {
        out += recipient
        out.appendBE(epoch)
        out += keyOp.bytes + encapsulated + ciphertext
    }
}

/// One signed, hash-linked entry of a space's membership log (SYNC.md §9): the space's creation, a device added
/// with a role, a device removed (with the next epoch's key sealed to the remaining members), or keys granted.
///
/// Encoded: `BLZM` · version (1) · space (16) · author signing key (32) · author agreement key (32) · time (8, Unix
/// ms) · parent count (1) · parents (32 each, strictly ascending) · kind (1) · body · [version 2: commitment (32) on a
/// create or remove · the removed device's signed head (`SignedHead.size`) on a remove whose cutoff is above 0] ·
/// envelope count (2) · envelopes · Ed25519 signature (64) by the author over everything before it. Its hash is
/// SHA-256 of the whole encoding. A log whose create is version 2 commits to its keys and its removals' cutoffs
/// (`MembershipState.commitsKeys`).
public struct MembershipOp: Sendable, Hashable {
    /// What an operation does.
    public enum Action: Sendable, Hashable {
        /// Creates the space's log; the author becomes its first admin and epoch 1 is the space's key. The space id is
        /// derived from the author's signing key and `salt` (`spaceID(creator:salt:)`), so no one else can write a
        /// create that resolves for that space.
        case create(salt: [UInt8])
        /// Adds `device` with `role`.
        case add(device: DevicePublicKeys, role: MemberRole)
        /// Removes the device with node id `device`, accepting its entries up to `cutoff`, and starts `epoch`.
        case remove(device: [UInt8], cutoff: UInt64, epoch: Epoch)
        /// Only delivers keys (its envelopes).
        case grant
    }

    /// The space the log belongs to.
    public let space: SpaceID
    /// The admin (or creator) who signed it.
    public let author: DevicePublicKeys
    /// When the author made it (Unix ms, the author's clock; shown, never trusted for order).
    public let timeMs: UInt64
    /// Hashes of the log's latest operations the author had seen, ascending.
    public let parents: [EntryHash]
    /// What it does.
    public let action: Action
    /// Keys it delivers.
    public let envelopes: [KeyEnvelope]
    /// The format version: 1, or 2 for a create or remove that commits to what it makes.
    public let version: UInt8
    /// On a version-2 create or remove: the commitment to the epoch key it makes (`KeyEnvelope.commitment`).
    public let commitment: [UInt8]?
    /// On a version-2 remove whose cutoff is above 0: the removed device's own signed head at the cutoff, so the
    /// cutoff is at most what that device signed (checked against its key when the log is resolved).
    public let cutoffHead: SignedHead?
    /// The whole encoding, signature included.
    public let bytes: [UInt8]
    /// SHA-256 of `bytes`.
    public let hash: EntryHash

    static let magic = Array("BLZM".utf8)
    /// Most parents an operation may name.
    public static let maxParents = 64
    /// Most envelopes an operation may carry (a space of at most this many members).
    public static let maxEnvelopes = 4096

    /// Makes and signs an operation by `author`; with `commitment` (a create or remove), in version 2, with
    /// `cutoffHead` on a remove whose cutoff is above 0.
    public init(
        space: SpaceID, author: DeviceIdentity, timeMs: UInt64, parents: [EntryHash], action: Action,
        envelopes: [KeyEnvelope] = [], commitment: [UInt8]? = nil, cutoffHead: SignedHead? = nil
    ) throws(MembershipError) {
        let sorted = Array(Set(parents)).sorted()
        guard sorted.count <= Self.maxParents,
            envelopes.count <= Self.maxEnvelopes, commitment != nil || cutoffHead == nil
        else { throw MembershipError("malformed membership operation") }
        let version: UInt8 = commitment == nil ? 1 : 2
        var out = Self.magic + [version] + space.bytes + author.publicKeys.signing + author.publicKeys.agreement
        out.appendBE(timeMs)
        out.append(UInt8(sorted.count))
        for p in sorted { out += p.bytes }
        switch action {
        case .create(let salt):
            guard salt.count == 16 else { throw MembershipError("malformed membership operation") }
            out.append(1)
            out += salt
        case .add(let device, let role):
            out.append(2)
            out += device.signing + device.agreement + [role.rawValue]
        case .remove(let device, let cutoff, let epoch):
            guard device.count == 16 else { throw MembershipError("malformed membership operation") }
            out.append(3)
            out += device
            out.appendBE(cutoff)
            out.appendBE(epoch)
        case .grant:
            out.append(4)
        }
        if let commitment {
            guard commitment.count == 32 else { throw MembershipError("malformed membership operation") }
            switch action {
            case .create:
                guard cutoffHead == nil else { throw MembershipError("malformed membership operation") }
            case .remove(_, let cutoff, _):
                guard (cutoff == 0) == (cutoffHead == nil) else { throw MembershipError("malformed membership operation") }
            case .add, .grant:
                throw MembershipError("malformed membership operation")
            }
            out += commitment
            if let cutoffHead { out += cutoffHead.bytes }
        }
        out.appendBE(UInt16(envelopes.count))
        for e in envelopes { e.encode(into: &out) }
        guard let signature = try? author.signingKey.signature(for: Self.signed(out)) else {
            throw MembershipError("cannot sign")
        }
        out += Array(signature)
        try self.init(bytes: out)
    }

    static func signed(_ body: [UInt8]) -> [UInt8] { Array("blazedb membership v1".utf8) + body }

    /// The id of the space whose log `creator` creates with `salt`: SHA-256 of a label, the creator's signing key and
    /// the salt, first 16 bytes.
    public static func spaceID(creator: DevicePublicKeys, salt: [UInt8]) -> SpaceID {
        SpaceID(computed: Array(SHA256.hash(data: Array("blazedb space v1".utf8) + creator.signing + salt).prefix(16)))
    }

    /// Decodes and checks an operation received from anywhere: structure, bounds and the author's signature.
    public init(bytes: [UInt8]) throws(MembershipError) {
        try self.init(unverified: bytes)
        guard signaturesVerify else { throw MembershipError("membership operation signature does not verify") }
    }

    /// Whether the author's signature, and the removed device's signed head a cutoff carries, verify.
    public var signaturesVerify: Bool {
        guard author.isValidSignature(bytes.suffix(64), for: Self.signed(Array(bytes.dropLast(64)))) else { return false }
        return cutoffHead.map { (try? $0.verify(space: space)) != nil } ?? true
    }

    /// Decodes an operation, checking its structure and bounds but no signature: what a peer sends is decoded so, and
    /// only the operations a log could keep are verified (`MembershipLog.taken`), so a flood of operations nobody
    /// keeps costs a parse each, not a signature check on the event loop.
    public init(unverified bytes: [UInt8]) throws(MembershipError) {
        let bad = MembershipError("malformed membership operation")
        var r = ByteReader(bytes[...])
        guard bytes.count >= 4 + 1 + 16 + 64 + 8 + 1 + 1 + 2 + 64, r.read(4).map(Array.init) == Self.magic,
            let version = r.readUInt8(), version == 1 || version == 2, let space = r.readSpaceID(), let signing = r.read(32), let agreement = r.read(32),
            let author = DevicePublicKeys(signing: Array(signing), agreement: Array(agreement)),
            let time = r.readUInt64(), let parentCount = r.readUInt8(), Int(parentCount) <= Self.maxParents,
            r.remaining >= Int(parentCount) * 32
        else { throw bad }
        var parents: [EntryHash] = []
        for _ in 0..<parentCount { parents.append(r.readEntryHash()!) }
        for i in parents.indices.dropFirst() where !(parents[i - 1] < parents[i]) { throw bad }
        let action: Action
        switch r.readUInt8() {
        case 1:
            guard let salt = r.read(16) else { throw bad }
            action = .create(salt: Array(salt))
        case 2:
            guard let s = r.read(32), let a = r.read(32), let device = DevicePublicKeys(signing: Array(s), agreement: Array(a)),
                let role = r.readUInt8().flatMap(MemberRole.init(rawValue:))
            else { throw bad }
            action = .add(device: device, role: role)
        case 3:
            guard let device = r.read(16), let cutoff = r.readUInt64(), let epoch = r.readEpoch(), epoch >= 2 else { throw bad }
            action = .remove(device: Array(device), cutoff: cutoff, epoch: epoch)
        case 4:
            action = .grant
        default:
            throw bad
        }
        var commitment: [UInt8]?, cutoffHead: SignedHead?
        if version == 2 {
            // The commitment, and the removed device's head at a cutoff above 0 (it must sign that seq of that device
            // in this space; whose key it is, is checked when the log is resolved).
            switch action {
            case .create, .remove:
                guard let c = r.read(32) else { throw bad }
                commitment = Array(c)
            case .add, .grant:
                throw bad
            }
            if case .remove(let device, let cutoff, _) = action, cutoff > 0 {
                guard let h = r.read(SignedHead.size), let head = try? SignedHead(bytes: h), head.origin == device, head.seq == cutoff
                else { throw bad }
                cutoffHead = head
            }
        }
        guard let count = r.readUInt16(), Int(count) <= Self.maxEnvelopes, r.remaining == Int(count) * KeyEnvelope.size + 64
        else { throw bad }
        var envelopes: [KeyEnvelope] = []
        envelopes.reserveCapacity(Int(count))
        for _ in 0..<count {
            let recipient = Array(r.read(16)!), epoch = r.readEpoch()!, keyOp = r.readEntryHash()!
            let encapsulated = Array(r.read(32)!), ciphertext = Array(r.read(48)!)
            guard epoch >= 1 else { throw bad }
            envelopes.append(
                KeyEnvelope(recipient: recipient, epoch: epoch, keyOp: keyOp, encapsulated: encapsulated, ciphertext: ciphertext))
        }
        self.space = space
        self.author = author
        self.timeMs = time
        self.parents = parents
        self.action = action
        self.envelopes = envelopes
        self.version = version
        self.commitment = commitment
        self.cutoffHead = cutoffHead
        self.bytes = bytes
        self.hash = EntryHash(computed: Array(SHA256.hash(data: bytes)))
    }
}
