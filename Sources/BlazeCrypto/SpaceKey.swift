import BlazeProtocol
import Crypto
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The keys of one synced database (a "space"): its id, the epoch new entries are sealed with, every epoch key this
/// device holds, and the space's capability.
///
/// Whoever holds an epoch's key can read entries of that epoch; the capability only lets a device prove in the
/// handshake that it belongs to the space (members, and relays, which never read). Sub-keys are derived with HKDF
/// from the epoch secrets, so the entry keys and the capability are independent: the capability is derived from the
/// epoch-1 secret and cannot be turned back into it. A space created before membership (a legacy share token) has one
/// epoch; a space with a membership log has a new epoch per revocation, and concurrent revocations can give two keys
/// the same epoch number, so an epoch maps to every key this device holds for it.
public struct SpaceKey: Sendable, Equatable {
    /// The space's id (safe to show to relays).
    public let id: SpaceID
    /// The epoch new entries are sealed with; 0 when this device holds no key to seal with (a relay, or a joiner
    /// not admitted yet).
    public let epoch: Epoch
    /// The 32-byte secret of each epoch as a legacy token or the keystore carries it (one per epoch).
    public let secrets: [Epoch: [UInt8]]
    /// The derived entry keys of each epoch, computed once (HKDF costs more than an AEAD opening of a small entry).
    private let entryKeys: [Epoch: [[UInt8]]]
    /// The entry key new entries are sealed with.
    private let sealingKey: [UInt8]?
    /// Every secret held per epoch (several after concurrent rotations): what chunks are opened with.
    private let ring: [Epoch: [[UInt8]]]
    /// The secret of the epoch new entries and chunks are sealed with; nil when this device holds none.
    public let sealingSecret: [UInt8]?
    private let authKeyBytes: [UInt8]

    static func derive(_ label: String, id: SpaceID, epoch: Epoch, _ secret: [UInt8]) -> [UInt8] {
        var info = Array(label.utf8)
        info.appendBE(epoch)
        return HKDF<SHA256>.deriveKey(inputKeyMaterial: SymmetricKey(data: secret), salt: id.bytes, info: info, outputByteCount: 32)
            .withUnsafeBytes { Array($0) }
    }

    /// The capability of a space whose epoch-1 secret is `genesis`.
    public static func capability(id: SpaceID, genesis: [UInt8]) -> [UInt8] {
        derive("blazedb peer auth v1", id: id, epoch: 1, genesis)
    }

    /// Creates a space key from parts (a legacy token or the keystore); the current epoch's secret must be present.
    /// The capability comes from the epoch-1 secret when held, else from the current one (as legacy versions did).
    public init(id: SpaceID, epoch: Epoch, secrets: [Epoch: [UInt8]]) throws(KeystoreError) {
        guard let current = secrets[epoch], current.count == 32, secrets.values.allSatisfy({ $0.count == 32 })
        else { throw KeystoreError(description: "malformed space key") }
        self.id = id
        self.epoch = epoch
        self.secrets = secrets
        self.entryKeys = Dictionary(
            uniqueKeysWithValues: secrets.map { ($0.key, [Self.derive("blazedb entry key v1", id: id, epoch: $0.key, $0.value)]) })
        self.sealingKey = entryKeys[epoch]![0]
        self.ring = secrets.mapValues { [$0] }
        self.sealingSecret = current
        self.authKeyBytes = Self.derive("blazedb peer auth v1", id: id, epoch: secrets[1] == nil ? epoch : 1, secrets[1] ?? current)
    }

    /// A key of a space with a membership log: `capability` for the handshake, every epoch key held (`ring`, possibly
    /// several per epoch), and the secret new entries are sealed with at `epoch` (nil: this device cannot seal).
    public init(
        id: SpaceID, capability: [UInt8], epoch: Epoch, current: [UInt8]?, ring: [(epoch: Epoch, secret: [UInt8])]
    ) throws(KeystoreError) {
        guard capability.count == 32, current.map({ $0.count == 32 }) ?? true,
            ring.allSatisfy({ $0.secret.count == 32 })
        else { throw KeystoreError(description: "malformed space key") }
        self.id = id
        self.authKeyBytes = capability
        var keys: [Epoch: [[UInt8]]] = [:]
        var secrets: [Epoch: [UInt8]] = [:]
        var held: [Epoch: [[UInt8]]] = [:]
        for (e, secret) in ring {
            let k = Self.derive("blazedb entry key v1", id: id, epoch: e, secret)
            if !(keys[e]?.contains(k) ?? false) { keys[e, default: []].append(k) }
            if secrets[e] == nil { secrets[e] = secret }
            if !(held[e]?.contains(secret) ?? false) { held[e, default: []].append(secret) }
        }
        if let current {
            let k = Self.derive("blazedb entry key v1", id: id, epoch: epoch, current)
            if !(keys[epoch]?.contains(k) ?? false) { keys[epoch, default: []].insert(k, at: 0) }
            if !(held[epoch]?.contains(current) ?? false) { held[epoch, default: []].insert(current, at: 0) }
            self.sealingKey = k
            self.epoch = epoch
        } else {
            self.sealingKey = nil
            self.epoch = 0
        }
        self.ring = held
        self.sealingSecret = current
        self.secrets = secrets
        self.entryKeys = keys
    }

    /// A key that only proves membership of space `id` (a relay's, or a joiner's before it is admitted).
    public init(id: SpaceID, capability: [UInt8]) throws(KeystoreError) {
        try self.init(id: id, capability: capability, epoch: 0, current: nil, ring: [])
    }

    /// `count` random bytes from the system's generator.
    public static func randomBytes(_ count: Int) -> [UInt8] {
        var rng = SystemRandomNumberGenerator()
        return (0..<count).map { _ in UInt8.random(in: .min ... .max, using: &rng) }
    }

    /// A fresh 32-byte epoch secret.
    public static func randomSecret() -> [UInt8] { SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) } }

    /// A fresh space: random id and secret, epoch 1.
    public static func generate() -> SpaceKey {
        var rng = SystemRandomNumberGenerator()
        let id = SpaceID(computed: (0..<16).map { _ in UInt8.random(in: .min ... .max, using: &rng) })
        let secret = SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) }
        return try! SpaceKey(id: id, epoch: 1, secrets: [1: secret])
    }

    /// Compares id, epochs, keys and capability.
    public static func == (a: SpaceKey, b: SpaceKey) -> Bool {
        a.id == b.id && a.epoch == b.epoch && a.entryKeys == b.entryKeys && a.authKeyBytes == b.authKeyBytes
            && a.sealingKey == b.sealingKey
    }

    /// True when this device can seal new entries.
    public var canSeal: Bool { sealingKey != nil }

    /// The key new entries are sealed with, nil when this device holds none.
    var sealing: SymmetricKey? { sealingKey.map { SymmetricKey(data: $0) } }

    /// The 32-byte capability: what a device proves in the handshake, and all a relay holds.
    public var capability: [UInt8] { authKeyBytes }

    /// The space id as 32 hex digits.
    public var idHex: String { id.hex }

    /// The AEAD keys held for entries of `epoch` (several after concurrent rotations), empty for an unknown epoch.
    public func entryKeys(epoch: Epoch) -> [SymmetricKey] {
        (entryKeys[epoch] ?? []).map { SymmetricKey(data: $0) }
    }

    /// The epoch and secret chunks are sealed with when they leave this device: the current one, or for a device that
    /// cannot seal entries (a reader) the newest it holds; nil when it holds none.
    public var chunkSealing: (epoch: Epoch, secret: [UInt8])? {
        if let sealingSecret { return (epoch, sealingSecret) }
        return ring.max { $0.key < $1.key }.flatMap { e in e.value.first.map { (e.key, $0) } }
    }

    /// Every secret this device holds for `epoch` (several after concurrent rotations), empty for an unknown epoch.
    public func secrets(epoch: Epoch) -> [[UInt8]] { ring[epoch] ?? [] }

    /// How many entry keys this key ring holds, over all epochs (it grows when keys are delivered).
    public var entryKeyCount: Int { entryKeys.values.reduce(0) { $0 + $1.count } }

    /// The key peers prove they hold during the handshake (the capability).
    public var authKey: SymmetricKey { SymmetricKey(data: authKeyBytes) }

    // MARK: Share tokens

    /// Token prefix: names the format and says the token is a secret.
    public static let tokenPrefix = "blazedb-secret-1."

    /// The share token: prefix, then base64url of id, epoch and the current secret. Anyone holding it joins the space.
    /// Nil for a key that cannot seal (it holds no current secret to hand out).
    public var token: String? {
        guard let secret = secrets[epoch] else { return nil }
        var bytes = id.bytes
        bytes.appendBE(epoch)
        bytes += secret
        return Self.tokenPrefix + base64URL(bytes)
    }

    /// Parses a share token; throws with a message naming what is wrong.
    public init(token: String) throws(KeystoreError) {
        guard token.hasPrefix(Self.tokenPrefix) else {
            throw KeystoreError(description: "not a BlazeDB share token (it must start with \(Self.tokenPrefix))")
        }
        guard let data = base64URLDecoded(token.dropFirst(Self.tokenPrefix.count)), data.count == 16 + 4 + 32 else {
            throw KeystoreError(description: "share token is damaged (wrong length or characters)")
        }
        var r = ByteReader(data[...])
        let id = SpaceID(computed: Array(r.read(16)!))
        let epoch = r.readEpoch()!
        try self.init(id: id, epoch: epoch, secrets: [epoch: Array(r.rest())])
    }

    // MARK: Keystore

    /// Stores the key as `<directory>/<space id>.json` (directory 0700, file 0600, written atomically).
    public func save(directory: String) throws {
        let secrets = self.secrets.keys.sorted().map { "\"\($0.value)\":\"\(Data(self.secrets[$0]!).base64EncodedString())\"" }
        let json = "{\"id\":\"\(idHex)\",\"epoch\":\(epoch.value),\"secrets\":{\(secrets.joined(separator: ","))}}"
        try KeyFile.write(json, to: directory + "/\(idHex).json")
    }

    /// Loads the key of space `idHex` from `directory`; nil when there is none.
    public static func load(directory: String, idHex: String) throws -> SpaceKey? {
        let path = directory + "/\(idHex).json"
        guard let o = try KeyFile.object(path, what: "space key") else { return nil }
        guard case .string(let hex)? = o["id"], let id = SpaceID(hex: hex),
            case .int(let epoch)? = o["epoch"], let epoch32 = UInt32(exactly: epoch).map({ Epoch($0) }), case .object(let s)? = o["secrets"]
        else { throw KeystoreError(description: "\(path) is not a BlazeDB space key") }
        var secrets: [Epoch: [UInt8]] = [:]
        for (k, v) in s {
            guard let e = UInt32(k).map({ Epoch($0) }), case .string(let b64) = v, let bytes = Data(base64Encoded: b64) else {
                throw KeystoreError(description: "\(path) is not a BlazeDB space key")
            }
            secrets[e] = Array(bytes)
        }
        return try SpaceKey(id: id, epoch: epoch32, secrets: secrets)
    }

    /// Removes the key file of space `idHex` (no error when it does not exist).
    public static func remove(directory: String, idHex: String) {
        try? FileManager.default.removeItem(atPath: directory + "/\(idHex).json")
    }
}

/// The format version of the keystore's files (README, "Upgrades and file formats").
public enum KeystoreFormat {
    /// The format this build writes and reads up to.
    public static let current = 1
}

/// Reading and writing secret files: created 0600 (never briefly readable by others), refused when others can read.
enum KeyFile {
    /// Writes `text` to `path` durably and atomically: a new temporary file created exclusively with mode 0600
    /// (whatever the umask), synced, renamed over `path`, and the directory synced.
    static func write(_ text: String, to path: String) throws {
        let directory = (path as NSString).deletingLastPathComponent
        if !FileManager.default.fileExists(atPath: directory) {
            try FileManager.default.createDirectory(
                atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        }
        func failure(_ what: String) -> KeystoreError {
            KeystoreError(description: "\(what): \(String(cString: strerror(errno)))")
        }
        let temp = path + ".tmp"
        unlink(temp)
        let fd = open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw failure("cannot create \(temp)") }
        var closed = false
        defer { if !closed { close(fd) } }
        guard fchmod(fd, 0o600) == 0 else { throw failure("cannot chmod \(temp)") }
        let bytes = Array(text.utf8)
        var written = 0
        while written < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + written, bytes.count - written) }
            guard n > 0 else { throw failure("cannot write \(temp)") }
            written += n
        }
        guard fsync(fd) == 0 else { throw failure("cannot sync \(temp)") }
        closed = true
        guard close(fd) == 0 else { throw failure("cannot close \(temp)") }
        guard rename(temp, path) == 0 else { throw failure("cannot move \(temp) to \(path)") }
        let dirFD = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dirFD >= 0 else { throw failure("cannot open \(directory)") }
        defer { close(dirFD) }
        guard fsync(dirFD) == 0 else { throw failure("cannot sync \(directory)") }
    }

    /// The format version of the keystore's files, in each as `"format"`; a file without it is of format 1, which
    /// this build writes (without the field, so builds from before formats were recorded read it too: the first
    /// format that changes the layout writes its number).
    static let format = KeystoreFormat.current

    /// The JSON object in the keystore file at `path` (a `what`), nil when the file does not exist; refuses a file of a
    /// newer format (never a guess at what it holds) and one that is not an object.
    static func object(_ path: String, what: String) throws -> [String: JSONValue]? {
        guard let text = try read(path) else { return nil }
        guard case .object(let o) = try? JSONParser().parse(text) else { throw KeystoreError(description: "\(path) is not a BlazeDB \(what)") }
        if let found = o["format"] {
            guard case .int(let version) = found, version >= 1 else { throw KeystoreError(description: "\(path) is not a BlazeDB \(what)") }
            guard version <= format else {
                throw KeystoreError(
                    description: "\(path) is keystore format \(version), written by a newer BlazeDB; this build reads formats up to \(format): upgrade blazed")
            }
        }
        return o
    }

    /// The file's text, nil when it does not exist.
    static func read(_ path: String) throws -> String? {
        let fm = FileManager.default
        guard fm.fileExists(atPath: path) else { return nil }
        let mode = (try fm.attributesOfItem(atPath: path)[.posixPermissions] as? NSNumber)?.intValue ?? 0
        guard mode & 0o077 == 0 else {
            throw KeystoreError(description: "\(path) is accessible by other users (mode \(String(mode, radix: 8))); chmod 600 it")
        }
        return String(decoding: try Data(contentsOf: URL(fileURLWithPath: path)), as: UTF8.self)
    }
}
