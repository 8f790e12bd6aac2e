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
/// Text form: `blazedb-invite-1.` then base64url of space id (16) · capability (32) · invite id (16) · secret (32) ·
/// the member's sync address (UTF-8, at most 255 bytes). Holding it lets one device join once, before it expires;
/// the inviting member keeps only a hash of the secret.
public struct InviteToken: Sendable, Equatable {
    /// Token prefix: names the format and says the token is a secret.
    public static let prefix = "blazedb-invite-1."

    /// The space.
    public let space: [UInt8]
    /// The space's capability.
    public let capability: [UInt8]
    /// The invite's id.
    public let id: [UInt8]
    /// The invite's secret.
    public let secret: [UInt8]
    /// The inviting member's sync address (`host:port`).
    public let address: String

    /// Creates a token from parts.
    public init(space: [UInt8], capability: [UInt8], id: [UInt8], secret: [UInt8], address: String) throws(KeystoreError) {
        guard space.count == 16, capability.count == 32, id.count == 16, secret.count == 32, !address.isEmpty,
            address.utf8.count <= 255
        else { throw KeystoreError(description: "malformed invite") }
        self.space = space
        self.capability = capability
        self.id = id
        self.secret = secret
        self.address = address
    }

    /// Parses a token; throws with a message naming what is wrong.
    public init(text: String) throws(KeystoreError) {
        guard text.hasPrefix(Self.prefix) else {
            throw KeystoreError(description: "not a BlazeDB invite (it must start with \(Self.prefix))")
        }
        guard let bytes = base64URLDecoded(text.dropFirst(Self.prefix.count)), bytes.count > 96, bytes.count <= 96 + 255,
            let address = String(validating: bytes[96...], as: UTF8.self)
        else { throw KeystoreError(description: "invite is damaged (wrong length or characters)") }
        try self.init(
            space: Array(bytes[0..<16]), capability: Array(bytes[16..<48]), id: Array(bytes[48..<64]),
            secret: Array(bytes[64..<96]), address: address)
    }

    /// The token's text.
    public var text: String { Self.prefix + base64URL(space + capability + id + secret + Array(address.utf8)) }

    /// SHA-256 of the secret: what the inviting member keeps.
    public static func secretHash(_ secret: [UInt8]) -> [UInt8] { Array(SHA256.hash(data: secret)) }

    /// What a joining device sends instead of the secret (SYNC.md §9, "Joining"): HMAC-SHA256 keyed with the secret's
    /// hash (what the inviter stores) over the space and the joiner's device keys. It proves the secret is held and
    /// binds the invite to that device, so whoever carries the message — a relay — can neither learn the secret nor
    /// redeem the invite for another device.
    public static func joinProof(secretHash: [UInt8], space: [UInt8], device: DevicePublicKeys) -> [UInt8] {
        var m = Array("blazedb join v1".utf8) + space
        m += device.signing
        m += device.agreement
        return Array(HMAC<SHA256>.authenticationCode(for: m, using: SymmetricKey(data: secretHash)))
    }

    /// This invite's proof for `device`.
    public func joinProof(device: DevicePublicKeys) -> [UInt8] {
        Self.joinProof(secretHash: Self.secretHash(secret), space: space, device: device)
    }

    /// Whether `proof` is `joinProof` of `secretHash` for `device` (compared in constant time).
    public static func checkJoinProof(_ proof: [UInt8], secretHash: [UInt8], space: [UInt8], device: DevicePublicKeys) -> Bool {
        var m = Array("blazedb join v1".utf8) + space
        m += device.signing
        m += device.agreement
        return HMAC<SHA256>.isValidAuthenticationCode(proof, authenticating: m, using: SymmetricKey(data: secretHash))
    }
}

/// A relay capability for one space (SYNC.md §9, "Relay capability"): space id and capability, nothing that opens
/// an entry. Text form: `blazedb-relay-1.` then base64url of space id (16) · capability (32).
public struct RelayCapability: Sendable, Equatable {
    /// Token prefix.
    public static let prefix = "blazedb-relay-1."
    /// The space.
    public let space: [UInt8]
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
        space = Array(bytes[0..<16])
        capability = Array(bytes[16...])
    }

    /// The token's text.
    public var text: String { Self.prefix + base64URL(space + capability) }

    /// A key that proves the capability in the handshake and opens nothing.
    public var key: SpaceKey { try! SpaceKey(id: space, capability: capability) }
}
