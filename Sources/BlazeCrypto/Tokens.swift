import BlazeProtocol
import Crypto
import Foundation

/// Base64url without padding (RFC 4648 §5), the alphabet of every BlazeDB token.
func base64URL(_ bytes: [UInt8]) -> String { Base64URL.encode(bytes) }

/// Decodes base64url with or without padding; nil for any other character.
func base64URLDecoded(_ text: Substring) -> [UInt8]? { Base64URL.decode(text) }

/// A one-time invite into a space with a membership log (SYNC.md §9, "Invites"): where to reach the inviting member,
/// the space's capability (to pass the handshake, never to read), and the invite's id and secret.
///
/// Text form: `blazedb-invite-2.` then base64url of space id (16) · capability (32) · invite id (16) · secret (32) ·
/// the member's sync address (UTF-8, at most 255 bytes). Holding it lets one device join once, before it expires;
/// the inviting member keeps only the public half of a signing key derived from the secret (`verifier`), which
/// checks a joiner's proof and cannot make one. Tokens of version 1 (`blazedb-invite-1.`, from members before
/// this scheme) are still read; their proof is an HMAC keyed with SHA-256 of the secret, what such a member keeps.
public struct InviteToken: Sendable, Equatable {
    /// Token prefix: names the format and says the token is a secret.
    public static let prefix = "blazedb-invite-2."
    /// The prefix of version-1 tokens, still read.
    public static let legacyPrefix = "blazedb-invite-1."

    /// The space.
    public let space: SpaceID
    /// The space's capability.
    public let capability: [UInt8]
    /// The invite's id.
    public let id: [UInt8]
    /// The invite's secret.
    public let secret: [UInt8]
    /// The inviting member's sync address (`host:port`).
    public let address: String
    /// The proof scheme: 2 (a signature, `verifier`) or 1 (the HMAC of version-1 tokens).
    public let version: Int

    /// Creates a token from parts.
    public init(
        space: SpaceID, capability: [UInt8], id: [UInt8], secret: [UInt8], address: String, version: Int = 2
    ) throws(KeystoreError) {
        guard capability.count == 32, id.count == 16, secret.count == 32, !address.isEmpty,
            address.utf8.count <= 255, version == 1 || version == 2
        else { throw KeystoreError(description: "malformed invite") }
        self.space = space
        self.capability = capability
        self.id = id
        self.secret = secret
        self.address = address
        self.version = version
    }

    /// Whether `text` looks like an invite of either version (to tell it from other tokens).
    public static func isInvite(_ text: String) -> Bool { text.hasPrefix(prefix) || text.hasPrefix(legacyPrefix) }

    /// Parses a token; throws with a message naming what is wrong.
    public init(text: String) throws(KeystoreError) {
        guard Self.isInvite(text) else {
            throw KeystoreError(description: "not a BlazeDB invite (it must start with \(Self.prefix))")
        }
        let version = text.hasPrefix(Self.prefix) ? 2 : 1
        guard let bytes = base64URLDecoded(text.dropFirst(Self.prefix.count)), bytes.count > 96, bytes.count <= 96 + 255,
            let address = String(validating: bytes[96...], as: UTF8.self)
        else { throw KeystoreError(description: "invite is damaged (wrong length or characters)") }
        try self.init(
            space: SpaceID(computed: Array(bytes[0..<16])), capability: Array(bytes[16..<48]), id: Array(bytes[48..<64]),
            secret: Array(bytes[64..<96]), address: address, version: version)
    }

    /// The token's text.
    public var text: String {
        (version == 2 ? Self.prefix : Self.legacyPrefix) + base64URL(space.bytes + capability + id + secret + Array(address.utf8))
    }

    /// The signing key a version-2 secret stands for (HKDF-SHA256 of the secret, as an Ed25519 seed).
    static func proofKey(_ secret: [UInt8]) -> Curve25519.Signing.PrivateKey {
        let seed = HKDF<SHA256>.deriveKey(
            inputKeyMaterial: SymmetricKey(data: secret), info: Array("blazedb invite proof key v2".utf8), outputByteCount: 32)
        return try! Curve25519.Signing.PrivateKey(rawRepresentation: seed.withUnsafeBytes { Array($0) })
    }

    /// What the inviting member keeps of a version-2 `secret`: the public half of its proof key (32 bytes). It checks
    /// a proof and cannot make one, so a copy of the member's database (a backup) redeems no invite.
    public static func verifier(_ secret: [UInt8]) -> [UInt8] { Array(proofKey(secret).publicKey.rawRepresentation) }

    /// SHA-256 of the secret: what a member kept of a version-1 invite (its proof's HMAC key).
    public static func secretHash(_ secret: [UInt8]) -> [UInt8] { Array(SHA256.hash(data: secret)) }

    /// What a proof covers: the space, the invite and the joiner's device keys.
    static func proofMessage(_ label: String, space: SpaceID, invite: [UInt8]?, device: DevicePublicKeys) -> [UInt8] {
        Array(label.utf8) + space.bytes + (invite ?? []) + device.signing + device.agreement
    }

    /// What a joining device sends instead of the secret (SYNC.md §9, "Invites"). Version 2: an Ed25519 signature
    /// (64 bytes) by the secret's proof key over the space, the invite id and the joiner's device keys. Version 1:
    /// HMAC-SHA256 keyed with the secret's hash over the space and the keys (32 bytes). Either proves the secret is
    /// held and binds the invite to that device, so whoever carries the message — a relay — can neither learn the
    /// secret nor redeem the invite for another device.
    public func joinProof(device: DevicePublicKeys) -> [UInt8] {
        guard version == 2 else {
            let m = Self.proofMessage("blazedb join v1", space: space, invite: nil, device: device)
            return Array(HMAC<SHA256>.authenticationCode(for: m, using: SymmetricKey(data: Self.secretHash(secret))))
        }
        let m = Self.proofMessage("blazedb join v2", space: space, invite: id, device: device)
        return Array(try! Self.proofKey(secret).signature(for: m))
    }

    /// Whether `proof` is a version-`version` join proof for invite `invite` of `space` and `device`, given what the
    /// inviting member kept (`verifier` for version 2, `secretHash` for version 1).
    public static func checkJoinProof(
        _ proof: [UInt8], kept: [UInt8], version: Int, space: SpaceID, invite: [UInt8], device: DevicePublicKeys
    ) -> Bool {
        switch version {
        case 2:
            guard proof.count == 64, let key = try? Curve25519.Signing.PublicKey(rawRepresentation: kept) else { return false }
            return key.isValidSignature(proof, for: proofMessage("blazedb join v2", space: space, invite: invite, device: device))
        case 1:
            let m = proofMessage("blazedb join v1", space: space, invite: nil, device: device)
            return proof.count == 32 && HMAC<SHA256>.isValidAuthenticationCode(proof, authenticating: m, using: SymmetricKey(data: kept))
        default:
            return false
        }
    }
}

/// A relay capability for one space (SYNC.md §9, "Relay capability"): space id and capability, nothing that opens
/// an entry. Text form: `blazedb-relay-1.` then base64url of space id (16) · capability (32).
public struct RelayCapability: Sendable, Equatable {
    /// Token prefix.
    public static let prefix = "blazedb-relay-1."
    /// The space.
    public let space: SpaceID
    /// The space's capability.
    public let capability: [UInt8]

    /// The capability of `key`'s space.
    public init(key: SpaceKey) {
        space = key.id
        capability = key.capability
    }

    /// Parses a token; throws with a message naming what is wrong.
    public init(text: String) throws(KeystoreError) {
        guard text.hasPrefix(Self.prefix), let bytes = base64URLDecoded(text.dropFirst(Self.prefix.count)), bytes.count == 48
        else { throw KeystoreError(description: "not a BlazeDB relay capability") }
        space = SpaceID(computed: Array(bytes[0..<16]))
        capability = Array(bytes[16...])
    }

    /// The token's text.
    public var text: String { Self.prefix + base64URL(space.bytes + capability) }

    /// A key that proves the capability in the handshake and opens nothing.
    public var key: SpaceKey { try! SpaceKey(id: space, capability: capability) }
}
