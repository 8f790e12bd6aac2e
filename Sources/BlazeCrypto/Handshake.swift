import Crypto
import Foundation

/// The peer handshake: both sides prove they hold a space's key without revealing it or the space id, and agree on
/// fresh session keys for the connection (SYNC.md, "Peer handshake").
///
/// 1. server → client `HELLO`: magic `BLZS` · version · server nonce (32) · server ephemeral X25519 key (32).
/// 2. client → server `AUTH`: client nonce (32) · client ephemeral key (32) · HMAC(auth key, "client" · transcript).
///    The server tries the auth key of each space it serves; when none verifies it closes the connection silently.
/// 3. server → client `AUTH_OK`: HMAC(auth key, "server" · transcript), which the client checks.
///
/// The transcript is everything sent before the proofs. Session keys come from the ephemeral Diffie-Hellman secret,
/// salted with the auth key, one per direction; a recorded connection stays secret even if the space key leaks later.
public enum Handshake {
    static let magic = Array("BLZS".utf8)
    /// Protocol version spoken after the handshake.
    public static let version: UInt8 = 2
    /// Size of the server's hello.
    public static let helloSize = 4 + 1 + 32 + 32
    /// Size of the client's auth message.
    public static let authSize = 32 + 32 + 32
    /// Size of the server's proof.
    public static let replySize = 32

    static func randomBytes(_ n: Int) -> [UInt8] {
        var rng = SystemRandomNumberGenerator()
        return (0..<n).map { _ in UInt8.random(in: .min ... .max, using: &rng) }
    }

    static func proof(_ role: String, _ transcript: [UInt8], _ key: SymmetricKey) -> [UInt8] {
        Array(HMAC<SHA256>.authenticationCode(for: Array(role.utf8) + transcript, using: key))
    }

    static func session(shared: [UInt8], key: SpaceKey, transcript: [UInt8], isServer: Bool) -> SessionCipher {
        let salt = key.authKey.withUnsafeBytes { Array($0) }
        func derive(_ label: String) -> SymmetricKey {
            HKDF<SHA256>.deriveKey(
                inputKeyMaterial: SymmetricKey(data: shared), salt: salt, info: Array(label.utf8) + transcript,
                outputByteCount: 32)
        }
        let c2s = derive("client to server")
        let s2c = derive("server to client")
        return SessionCipher(send: isServer ? s2c : c2s, receive: isServer ? c2s : s2c)
    }

    /// The accepting side.
    public struct Server: Sendable {
        private let nonce = Handshake.randomBytes(32)
        private let ephemeral = Curve25519.KeyAgreement.PrivateKey().rawRepresentation

        /// Creates a server side with fresh randomness.
        public init() {}

        /// The first message.
        public var hello: [UInt8] {
            Handshake.magic + [Handshake.version] + nonce
                + Array(try! Curve25519.KeyAgreement.PrivateKey(rawRepresentation: ephemeral).publicKey.rawRepresentation)
        }

        /// Finds the space whose key produced the client's proof; returns it, the reply and the session cipher.
        public func accept(_ auth: [UInt8], spaces: [SpaceKey]) throws(SyncRejection) -> (
            space: SpaceKey, reply: [UInt8], session: SessionCipher
        ) {
            guard auth.count == Handshake.authSize,
                let theirs = try? Curve25519.KeyAgreement.PublicKey(rawRepresentation: auth[32..<64])
            else { throw .badFrame }
            let transcript = hello + auth[0..<64]
            let proof = auth[64...]
            let signed = Array("client".utf8) + transcript
            guard
                let space = spaces.first(where: {
                    HMAC<SHA256>.isValidAuthenticationCode(proof, authenticating: signed, using: $0.authKey)
                }),
                let mine = try? Curve25519.KeyAgreement.PrivateKey(rawRepresentation: ephemeral),
                let shared = try? mine.sharedSecretFromKeyAgreement(with: theirs)
            else { throw .badFrame }
            return (
                space, Handshake.proof("server", transcript, space.authKey),
                Handshake.session(
                    shared: shared.withUnsafeBytes { Array($0) }, key: space, transcript: transcript, isServer: true)
            )
        }
    }

    /// The connecting side, for one space.
    public struct Client: Sendable {
        private let key: SpaceKey
        private let nonce = Handshake.randomBytes(32)
        private let ephemeral = Curve25519.KeyAgreement.PrivateKey().rawRepresentation
        private var transcript: [UInt8] = []
        private var shared: [UInt8] = []

        /// Creates a client side that will prove it holds `key`.
        public init(key: SpaceKey) { self.key = key }

        /// Answers the server's hello with this side's proof.
        public mutating func respond(to hello: [UInt8]) throws(SyncRejection) -> [UInt8] {
            guard hello.count == Handshake.helloSize, Array(hello[0..<4]) == Handshake.magic, hello[4] == Handshake.version,
                let theirs = try? Curve25519.KeyAgreement.PublicKey(rawRepresentation: hello[37..<69]),
                let mine = try? Curve25519.KeyAgreement.PrivateKey(rawRepresentation: ephemeral)
            else { throw .badFrame }
            let mid = nonce + Array(mine.publicKey.rawRepresentation)
            transcript = hello + mid
            guard let secret = try? mine.sharedSecretFromKeyAgreement(with: theirs) else { throw .badFrame }
            shared = secret.withUnsafeBytes { Array($0) }
            return mid + Handshake.proof("client", transcript, key.authKey)
        }

        /// Checks the server's proof and returns the session cipher.
        public func finish(_ reply: [UInt8]) throws(SyncRejection) -> SessionCipher {
            guard !transcript.isEmpty,
                HMAC<SHA256>.isValidAuthenticationCode(reply, authenticating: Array("server".utf8) + transcript, using: key.authKey)
            else { throw .badFrame }
            return Handshake.session(shared: shared, key: key, transcript: transcript, isServer: false)
        }
    }
}

