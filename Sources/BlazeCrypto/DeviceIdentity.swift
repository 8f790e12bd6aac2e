import BlazeProtocol
import Crypto
import Foundation

/// Why the keystore could not be read or written.
public struct KeystoreError: Error, Sendable, CustomStringConvertible {
    /// What is wrong and where.
    public var description: String
}

/// This device's long-lived keys: Ed25519 for signing, X25519 for key agreement (ARCHITECTURE.md, "Security model").
///
/// Created on the daemon's first start, before any database, so op logs never need re-keying when sync arrives.
/// The node id is the first 16 bytes of SHA-256 of the Ed25519 public key.
public struct DeviceIdentity: Sendable {
    // Raw key bytes: swift-crypto's key types are not Sendable on Linux, their bytes are.
    private let signingBytes: Data
    private let agreementBytes: Data

    /// Signing key.
    public var signingKey: Curve25519.Signing.PrivateKey {
        // The bytes came from a valid key (checked when loaded), so this cannot fail.
        try! Curve25519.Signing.PrivateKey(rawRepresentation: signingBytes)
    }

    /// Key-agreement key.
    public var agreementKey: Curve25519.KeyAgreement.PrivateKey {
        try! Curve25519.KeyAgreement.PrivateKey(rawRepresentation: agreementBytes)
    }

    /// The 16-byte node id.
    public var nodeID: [UInt8] { Array(SHA256.hash(data: signingKey.publicKey.rawRepresentation).prefix(16)) }

    /// The public halves, as a peer sees them in the handshake.
    public var publicKeys: DevicePublicKeys {
        DevicePublicKeys(
            signing: Array(signingKey.publicKey.rawRepresentation), agreement: Array(agreementKey.publicKey.rawRepresentation))!
    }

    /// File name of the keystore inside its directory.
    public static let fileName = "device.json"

    /// Creates fresh keys.
    public init() {
        self.init(signingKey: Curve25519.Signing.PrivateKey(), agreementKey: Curve25519.KeyAgreement.PrivateKey())
    }

    init(signingKey: Curve25519.Signing.PrivateKey, agreementKey: Curve25519.KeyAgreement.PrivateKey) {
        signingBytes = signingKey.rawRepresentation
        agreementBytes = agreementKey.rawRepresentation
    }

    /// Loads the identity from `directory`, creating it (directory 0700, file 0600) on first use.
    ///
    /// Refuses a keystore readable by other users rather than using a leaked key silently.
    public static func loadOrCreate(directory: String) throws -> DeviceIdentity {
        let path = directory + "/" + fileName
        if let object = try KeyFile.object(path, what: "keystore") {
            guard let sign = object["ed25519"]?.stringValue.flatMap({ Data(base64Encoded: $0) }),
                let agree = object["x25519"]?.stringValue.flatMap({ Data(base64Encoded: $0) })
            else { throw KeystoreError(description: "\(path) is not a BlazeDB keystore") }
            return DeviceIdentity(
                signingKey: try Curve25519.Signing.PrivateKey(rawRepresentation: sign),
                agreementKey: try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: agree))
        }
        let identity = DeviceIdentity()
        let json = """
            {"ed25519":"\(identity.signingKey.rawRepresentation.base64EncodedString())",\
            "x25519":"\(identity.agreementKey.rawRepresentation.base64EncodedString())"}
            """
        try KeyFile.write(json, to: path)
        return identity
    }
}

/// A device's public keys: Ed25519 (signatures: heads, membership entries, the handshake) and X25519 (keys sealed to
/// it). Its node id is derived from the signing key, so the pair names one device.
public struct DevicePublicKeys: Sendable, Hashable {
    /// 32-byte Ed25519 public key.
    public let signing: [UInt8]
    /// 32-byte X25519 public key.
    public let agreement: [UInt8]

    /// Both keys from their 32-byte raw forms; nil when either has another length.
    public init?(signing: [UInt8], agreement: [UInt8]) {
        guard signing.count == 32, agreement.count == 32 else { return nil }
        self.signing = signing
        self.agreement = agreement
    }

    /// The device's 16-byte node id: the first 16 bytes of SHA-256 of the signing key.
    public var nodeID: [UInt8] { Array(SHA256.hash(data: signing).prefix(16)) }

    /// The node id as 32 hex digits.
    public var nodeIDHex: String { hexString(nodeID) }

    /// True when `signature` is this device's Ed25519 signature of `message`.
    public func isValidSignature(_ signature: some DataProtocol, for message: some DataProtocol) -> Bool {
        guard let key = try? Curve25519.Signing.PublicKey(rawRepresentation: signing) else { return false }
        return key.isValidSignature(signature, for: message)
    }
}
