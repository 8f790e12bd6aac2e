import Crypto
import Foundation

/// The peer handshake: both sides prove they hold a space's key without revealing it or the space id, prove which
/// device they are (its Ed25519 key signs the transcript, hidden from onlookers), and agree on fresh session keys for
/// the connection (SYNC.md §8, "Handshake").
///
/// 1. server → client `HELLO`: magic `BLZS` · version · server nonce (32) · server ephemeral X25519 key (32).
/// 2. client → server `AUTH`: client nonce (32) · client ephemeral key (32) · the client's identity, sealed (144) ·
///    HMAC(auth key, "client" · transcript). The server tries the auth key of each space it serves; when none
///    verifies it closes the connection silently.
/// 3. server → client `AUTH_OK`: the server's identity, sealed (144) · HMAC(auth key, "server" · transcript), which
///    the client checks.
///
/// An identity is the device's signing key (32) · agreement key (32) · its signature (64) over
/// `"blazedb identity v1 <role>"` · the transcript so far, so it is bound to this connection's nonces and ephemeral
/// keys and cannot be replayed. It is sealed with ChaCha20-Poly1305 under a key derived from the ephemeral
/// Diffie-Hellman secret and the auth key, so only a holder of the space key on the other end of this connection
/// learns which device is talking. The transcript is everything sent before each proof. Session keys come from the
/// ephemeral secret, salted with the auth key, one per direction, over the whole transcript; a recorded connection
/// stays secret even if the space key or a device key leaks later.
public enum Handshake {
    static let magic = Array("BLZS".utf8)
    /// Protocol version: 3 added device identities to version 2's space proof; 4 carries each entry's format
    /// version in packed runs (padded entries, SYNC.md §6).
    public static let version: UInt8 = 4
    /// Size of the server's hello.
    public static let helloSize = 4 + 1 + 32 + 32
    /// Size of a sealed identity: both public keys, the signature and the AEAD tag.
    public static let sealedIdentitySize = 32 + 32 + 64 + 16
    /// Size of the client's auth message.
    public static let authSize = 32 + 32 + sealedIdentitySize + 32
    /// Size of the server's proof.
    public static let replySize = sealedIdentitySize + 32

    static func randomBytes(_ n: Int) -> [UInt8] {
        var rng = SystemRandomNumberGenerator()
        return (0..<n).map { _ in UInt8.random(in: .min ... .max, using: &rng) }
    }

    static func proof(_ role: String, _ transcript: [UInt8], _ key: SymmetricKey) -> [UInt8] {
        Array(HMAC<SHA256>.authenticationCode(for: Array(role.utf8) + transcript, using: key))
    }

    static func isValidProof(_ proof: ArraySlice<UInt8>, _ role: String, _ transcript: [UInt8], _ key: SymmetricKey) -> Bool {
        HMAC<SHA256>.isValidAuthenticationCode(proof, authenticating: Array(role.utf8) + transcript, using: key)
    }

    static func derive(_ shared: [UInt8], _ key: SpaceKey, _ label: String, _ transcript: [UInt8]) -> SymmetricKey {
        key.authKey.withUnsafeBytes { salt in
            HKDF<SHA256>.deriveKey(
                inputKeyMaterial: SymmetricKey(data: shared), salt: Array(salt), info: Array(label.utf8) + transcript,
                outputByteCount: 32)
        }
    }

    static func session(shared: [UInt8], key: SpaceKey, transcript: [UInt8], isServer: Bool) -> SessionCipher {
        let c2s = derive(shared, key, "client to server", transcript)
        let s2c = derive(shared, key, "server to client", transcript)
        return SessionCipher(send: isServer ? s2c : c2s, receive: isServer ? c2s : s2c)
    }

    /// This device's identity for `role`, signed over `transcript` and sealed for the other end.
    static func sealIdentity(
        _ identity: DeviceIdentity, role: String, transcript: [UInt8], shared: [UInt8], key: SpaceKey
    ) -> [UInt8] {
        let keys = identity.publicKeys
        let signature = try! identity.signingKey.signature(for: Array("blazedb identity v1 \(role)".utf8) + transcript)
        let plain = keys.signing + keys.agreement + Array(signature)
        // The key is new for every connection (fresh ephemeral keys) and seals one message, so a zero nonce is safe.
        let box = try! ChaChaPoly.seal(
            plain, using: derive(shared, key, "\(role) identity", transcript), nonce: try! ChaChaPoly.Nonce(data: [UInt8](repeating: 0, count: 12)))
        return Array(box.ciphertext) + Array(box.tag)
    }

    /// Opens and checks the other end's identity for `role`; throws `badFrame` when it does not open or verify.
    static func openIdentity(
        _ sealed: ArraySlice<UInt8>, role: String, transcript: [UInt8], shared: [UInt8], key: SpaceKey
    ) throws(SyncRejection) -> DevicePublicKeys {
        guard sealed.count == sealedIdentitySize,
            let box = try? ChaChaPoly.SealedBox(
                nonce: ChaChaPoly.Nonce(data: [UInt8](repeating: 0, count: 12)), ciphertext: sealed.dropLast(16),
                tag: sealed.suffix(16)),
            let plain = try? ChaChaPoly.open(box, using: derive(shared, key, "\(role) identity", transcript)).map({ $0 }),
            let keys = DevicePublicKeys(signing: Array(plain[0..<32]), agreement: Array(plain[32..<64])),
            keys.isValidSignature(plain[64..<128], for: Array("blazedb identity v1 \(role)".utf8) + transcript)
        else { throw .badFrame }
        return keys
    }

    /// What the accepting side learned from a client's proof.
    public struct Accepted: Sendable {
        /// The space whose key the client proved.
        public var space: SpaceKey
        /// The client's device.
        public var device: DevicePublicKeys
        /// The server's `AUTH_OK`, to send only if the device is welcome.
        public var reply: [UInt8]
        /// The connection's session cipher.
        public var session: SessionCipher
    }

    /// The accepting side.
    public struct Server: Sendable {
        private let identity: DeviceIdentity
        private let nonce = Handshake.randomBytes(32)
        private let ephemeral = Curve25519.KeyAgreement.PrivateKey().rawRepresentation

        /// Creates a server side for this device, with fresh randomness.
        public init(identity: DeviceIdentity) { self.identity = identity }

        /// The first message.
        public var hello: [UInt8] {
            Handshake.magic + [Handshake.version] + nonce
                + Array(try! Curve25519.KeyAgreement.PrivateKey(rawRepresentation: ephemeral).publicKey.rawRepresentation)
        }

        /// Finds the space whose key produced the client's proof and opens the client's identity.
        public func accept(_ auth: [UInt8], spaces: [SpaceKey]) throws(SyncRejection) -> Accepted {
            guard auth.count == Handshake.authSize,
                let theirs = try? Curve25519.KeyAgreement.PublicKey(rawRepresentation: auth[32..<64])
            else { throw .badFrame }
            let transcript = hello + auth[0..<64]
            let sealedClient = auth[64..<(64 + Handshake.sealedIdentitySize)]
            let proof = auth[(64 + Handshake.sealedIdentitySize)...]
            let proven = transcript + sealedClient
            guard let space = spaces.first(where: { Handshake.isValidProof(proof, "client", proven, $0.authKey) }),
                let mine = try? Curve25519.KeyAgreement.PrivateKey(rawRepresentation: ephemeral),
                let secret = try? mine.sharedSecretFromKeyAgreement(with: theirs)
            else { throw .badFrame }
            let shared = secret.withUnsafeBytes { Array($0) }
            let device = try Handshake.openIdentity(sealedClient, role: "client", transcript: transcript, shared: shared, key: space)
            let sealedServer = Handshake.sealIdentity(identity, role: "server", transcript: proven, shared: shared, key: space)
            let full = proven + sealedServer
            return Accepted(
                space: space, device: device, reply: sealedServer + Handshake.proof("server", full, space.authKey),
                session: Handshake.session(shared: shared, key: space, transcript: full, isServer: true))
        }
    }

    /// The connecting side, for one space.
    public struct Client: Sendable {
        private let key: SpaceKey
        private let identity: DeviceIdentity
        private let nonce = Handshake.randomBytes(32)
        private let ephemeral = Curve25519.KeyAgreement.PrivateKey().rawRepresentation
        private var transcript: [UInt8] = []
        private var shared: [UInt8] = []

        /// Creates a client side that will prove it holds `key` and is `identity`'s device.
        public init(key: SpaceKey, identity: DeviceIdentity) {
            self.key = key
            self.identity = identity
        }

        /// Answers the server's hello with this side's identity and proof.
        public mutating func respond(to hello: [UInt8]) throws(SyncRejection) -> [UInt8] {
            guard hello.count == Handshake.helloSize, Array(hello[0..<4]) == Handshake.magic, hello[4] == Handshake.version,
                let theirs = try? Curve25519.KeyAgreement.PublicKey(rawRepresentation: hello[37..<69]),
                let mine = try? Curve25519.KeyAgreement.PrivateKey(rawRepresentation: ephemeral),
                let secret = try? mine.sharedSecretFromKeyAgreement(with: theirs)
            else { throw .badFrame }
            let mid = nonce + Array(mine.publicKey.rawRepresentation)
            shared = secret.withUnsafeBytes { Array($0) }
            let sealed = Handshake.sealIdentity(identity, role: "client", transcript: hello + mid, shared: shared, key: key)
            transcript = hello + mid + sealed
            return mid + sealed + Handshake.proof("client", transcript, key.authKey)
        }

        /// Checks the server's proof and identity; returns the server's device and the session cipher.
        public func finish(_ reply: [UInt8]) throws(SyncRejection) -> (device: DevicePublicKeys, session: SessionCipher) {
            guard !transcript.isEmpty, reply.count == Handshake.replySize else { throw .badFrame }
            let sealedServer = reply[0..<Handshake.sealedIdentitySize]
            let full = transcript + sealedServer
            guard Handshake.isValidProof(reply[Handshake.sealedIdentitySize...], "server", full, key.authKey) else {
                throw .badFrame
            }
            let device = try Handshake.openIdentity(sealedServer, role: "server", transcript: transcript, shared: shared, key: key)
            return (device, Handshake.session(shared: shared, key: key, transcript: full, isServer: false))
        }
    }
}
