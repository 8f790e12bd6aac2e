import Crypto
import Foundation

/// The peer handshake: both sides prove they hold a space's key without revealing it or the space id, prove which
/// device they are (its Ed25519 key signs the transcript, hidden from onlookers), and agree on fresh session keys for
/// the connection (SYNC.md §8, "Handshake").
///
/// 1. server → client `HELLO`: magic `BLZS` · handshake version · server nonce (32) · server ephemeral X25519 key (32).
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
    /// Version of the handshake's own messages (the byte after `BLZS`): 3 added device identities to version 2's
    /// space proof, 4 came with packed runs carrying each entry's format. Frozen since: later session protocols are
    /// chosen inside it (`protocols`), so that a build speaking protocol 4 only still completes it.
    public static let version: UInt8 = 4
    /// The session protocol versions this build speaks (SYNC.md §8, "Versions"): 4; 5, where a `CHUNK`'s sealed
    /// chunk travels authenticated but not encrypted a second time and each side says its clock first (`CLOCK`); and
    /// 6, which carries members' statements of the entry formats they open (`FORMATS`).
    public static let protocols: ClosedRange<UInt8> = 4...6
    /// What a nonce that announces its side's protocol range starts with; the lowest and highest version follow.
    static let announcement = Array("BLZVER".utf8)
    /// Size of the server's hello.
    public static let helloSize = 4 + 1 + 32 + 32
    /// Size of a sealed identity: both public keys, the signature and the AEAD tag.
    public static let sealedIdentitySize = 32 + 32 + 64 + 16
    /// Size of the client's auth message.
    public static let authSize = 32 + 32 + sealedIdentitySize + 32
    /// Size of the server's proof.
    public static let replySize = sealedIdentitySize + 32

    /// A fresh nonce announcing `range`: the announcement, the lowest and highest version, then 24 random bytes.
    static func nonce(announcing range: ClosedRange<UInt8>) -> [UInt8] {
        // A range below 4 would be read as "4 only" by the other side, which would then frame differently.
        precondition(range.lowerBound >= 4, "protocol versions start at 4")
        return announcement + [range.lowerBound, range.upperBound] + randomBytes(32 - announcement.count - 2)
    }

    /// The protocol range a side's nonce announces. A nonce without the announcement (or with an empty or impossible
    /// range) comes from a build that speaks protocol 4 only, which draws all 32 bytes at random.
    public static func announced(in nonce: ArraySlice<UInt8>) -> ClosedRange<UInt8> {
        let n = announcement.count
        guard nonce.count == 32, nonce.prefix(n).elementsEqual(announcement) else { return 4...4 }
        let (low, high) = (nonce[nonce.startIndex + n], nonce[nonce.startIndex + n + 1])
        guard low >= 4, low <= high else { return 4...4 }
        return low...high
    }

    /// The version two sides speak: the highest both support, or nil when their ranges do not meet.
    public static func agreed(_ a: ClosedRange<UInt8>, _ b: ClosedRange<UInt8>) -> UInt8? {
        a.overlaps(b) ? min(a.upperBound, b.upperBound) : nil
    }

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

    static func session(shared: [UInt8], key: SpaceKey, transcript: [UInt8], isServer: Bool, version: UInt8) -> SessionCipher {
        let c2s = derive(shared, key, "client to server", transcript)
        let s2c = derive(shared, key, "server to client", transcript)
        return SessionCipher(send: isServer ? s2c : c2s, receive: isServer ? c2s : s2c, version: version)
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
        /// The protocol version the session speaks: the highest both sides announced; 0 when they share none (then
        /// `mismatch` says so, and the reply is sent only so that the client learns it from a server it verified).
        public var protocolVersion: UInt8
        /// The two sides' ranges when they share no version (nil otherwise).
        public var mismatch: ProtocolMismatch?
    }

    /// The accepting side.
    public struct Server: Sendable {
        private let identity: DeviceIdentity
        /// The protocol versions this side speaks.
        public let protocols: ClosedRange<UInt8>
        private let nonce: [UInt8]
        private let ephemeral = Curve25519.KeyAgreement.PrivateKey().rawRepresentation

        /// Creates a server side for this device speaking `protocols` (a test may narrow or move the range), with
        /// fresh randomness.
        public init(identity: DeviceIdentity, protocols: ClosedRange<UInt8> = Handshake.protocols) {
            self.identity = identity
            self.protocols = protocols
            self.nonce = Handshake.nonce(announcing: protocols)
        }

        /// The first message.
        public var hello: [UInt8] {
            Handshake.magic + [Handshake.version] + nonce
                + Array(try! Curve25519.KeyAgreement.PrivateKey(rawRepresentation: ephemeral).publicKey.rawRepresentation)
        }

        /// Finds the space whose key produced the client's proof, opens the client's identity and agrees on a protocol
        /// version. The ranges are compared only once the proof holds, so a stranger's claims are never acted on; when
        /// they share none the result's `mismatch` says so (its reply lets the client verify this side before it
        /// believes the mismatch too).
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
            let theirRange = Handshake.announced(in: auth[0..<32])
            let version = Handshake.agreed(protocols, theirRange) ?? 0
            let sealedServer = Handshake.sealIdentity(identity, role: "server", transcript: proven, shared: shared, key: space)
            let full = proven + sealedServer
            return Accepted(
                space: space, device: device, reply: sealedServer + Handshake.proof("server", full, space.authKey),
                session: Handshake.session(shared: shared, key: space, transcript: full, isServer: true, version: max(version, 4)),
                protocolVersion: version, mismatch: version == 0 ? ProtocolMismatch(ours: protocols, theirs: theirRange) : nil)
        }
    }

    /// The connecting side, for one space.
    public struct Client: Sendable {
        private let key: SpaceKey
        private let identity: DeviceIdentity
        /// The protocol versions this side speaks.
        public let protocols: ClosedRange<UInt8>
        private let nonce: [UInt8]
        private let ephemeral = Curve25519.KeyAgreement.PrivateKey().rawRepresentation
        private var transcript: [UInt8] = []
        private var shared: [UInt8] = []
        private var version: UInt8 = 0
        /// The range the server's hello announced (checked by `finish`, with the server's proof over that hello).
        private var serverProtocols: ClosedRange<UInt8> = 4...4

        /// Creates a client side that will prove it holds `key` and is `identity`'s device, speaking `protocols`.
        public init(key: SpaceKey, identity: DeviceIdentity, protocols: ClosedRange<UInt8> = Handshake.protocols) {
            self.init(key: key, identity: identity, protocols: protocols, announcing: protocols)
        }

        /// A client that announces another range than it checks the server's against (a test's liar).
        init(key: SpaceKey, identity: DeviceIdentity, protocols: ClosedRange<UInt8>, announcing: ClosedRange<UInt8>) {
            self.key = key
            self.identity = identity
            self.protocols = protocols
            self.nonce = Handshake.nonce(announcing: announcing)
        }

        /// The handshake version a hello that starts with `BLZS` says it is, when it is not this build's (a hello of any
        /// length): the two sides cannot go on, and nothing in such a hello can be verified.
        public func otherHandshake(_ hello: [UInt8]) -> ProtocolMismatch? {
            guard hello.count > 4, Array(hello[0..<4]) == Handshake.magic, hello[4] != Handshake.version else { return nil }
            return ProtocolMismatch(ours: protocols, handshake: hello[4])
        }

        /// After `finish` threw `incompatibleProtocol`: the two ranges, as the verified server announced its own.
        public var mismatch: ProtocolMismatch? {
            version == 0 && !transcript.isEmpty ? ProtocolMismatch(ours: protocols, theirs: serverProtocols) : nil
        }

        /// Answers the server's hello with this side's identity and proof.
        public mutating func respond(to hello: [UInt8]) throws(SyncRejection) -> [UInt8] {
            guard hello.count == Handshake.helloSize, Array(hello[0..<4]) == Handshake.magic, hello[4] == Handshake.version,
                let theirs = try? Curve25519.KeyAgreement.PublicKey(rawRepresentation: hello[37..<69]),
                let mine = try? Curve25519.KeyAgreement.PrivateKey(rawRepresentation: ephemeral),
                let secret = try? mine.sharedSecretFromKeyAgreement(with: theirs)
            else { throw .badFrame }
            let mid = nonce + Array(mine.publicKey.rawRepresentation)
            // Answered whether or not the ranges meet: a mismatch is believed only once the server's proof over this
            // hello holds (`finish`), so a stranger answering at the peer's address cannot make it up.
            serverProtocols = Handshake.announced(in: hello[5..<37])
            version = Handshake.agreed(protocols, serverProtocols) ?? 0
            shared = secret.withUnsafeBytes { Array($0) }
            let sealed = Handshake.sealIdentity(identity, role: "client", transcript: hello + mid, shared: shared, key: key)
            transcript = hello + mid + sealed
            return mid + sealed + Handshake.proof("client", transcript, key.authKey)
        }

        /// Checks the server's proof and identity; returns the server's device, the session cipher and the protocol
        /// version agreed (the server's announcement is part of the transcript its proof covers). Throws
        /// `incompatibleProtocol` when the verified server shares no version (`mismatch` then says which).
        public func finish(_ reply: [UInt8]) throws(SyncRejection) -> (
            device: DevicePublicKeys, session: SessionCipher, protocolVersion: UInt8
        ) {
            guard !transcript.isEmpty, reply.count == Handshake.replySize else { throw .badFrame }
            let sealedServer = reply[0..<Handshake.sealedIdentitySize]
            let full = transcript + sealedServer
            guard Handshake.isValidProof(reply[Handshake.sealedIdentitySize...], "server", full, key.authKey) else {
                throw .badFrame
            }
            let device = try Handshake.openIdentity(sealedServer, role: "server", transcript: transcript, shared: shared, key: key)
            guard version != 0 else { throw .incompatibleProtocol }
            return (device, Handshake.session(shared: shared, key: key, transcript: full, isServer: false, version: version), version)
        }
    }
}

/// Two sides of a handshake that share no protocol version, told in words naming both (the failure `sync.status`
/// and the logs show).
public struct ProtocolMismatch: Sendable, Equatable, CustomStringConvertible {
    /// The versions this side speaks.
    public let ours: ClosedRange<UInt8>
    /// The versions the other side announced; nil when its handshake itself is of another version.
    public let theirs: ClosedRange<UInt8>?
    /// The other side's handshake version when it differs from this build's.
    public let handshake: UInt8?

    /// A mismatch of protocol ranges.
    public init(ours: ClosedRange<UInt8>, theirs: ClosedRange<UInt8>) {
        (self.ours, self.theirs, self.handshake) = (ours, theirs, nil)
    }

    /// A handshake of another version.
    public init(ours: ClosedRange<UInt8>, handshake: UInt8) {
        (self.ours, self.theirs, self.handshake) = (ours, nil, handshake)
    }

    static func text(_ r: ClosedRange<UInt8>) -> String {
        r.lowerBound == r.upperBound ? "\(r.lowerBound)" : "\(r.lowerBound)–\(r.upperBound)"
    }

    /// Which versions each side speaks and which side to upgrade.
    public var description: String {
        let mine = "this build speaks sync protocol \(Self.text(ours))"
        if let handshake {
            let newer = handshake > Handshake.version
            return "incompatible protocol: the peer's hello says its handshake is version \(handshake), this build's is "
                + "\(Handshake.version) (\(mine)); nothing in such a hello can be verified: if the peer is yours, "
                + (newer ? "upgrade this device" : "the peer must upgrade")
        }
        guard let theirs else { return "incompatible protocol: \(mine)" }
        let newer = theirs.lowerBound > ours.upperBound
        return "incompatible protocol: the peer speaks sync protocol \(Self.text(theirs)), \(mine): "
            + (newer ? "upgrade this device" : "the peer must upgrade")
    }
}
