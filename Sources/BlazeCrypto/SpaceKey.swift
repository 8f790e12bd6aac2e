import BlazeProtocol
import Crypto
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The shared secret of one synced database (a "space"): its id, the current key epoch and the key of each epoch.
///
/// Whoever holds it can read and write the database's entries; relays and folders only ever see the id. Sub-keys are
/// derived with HKDF so that the entry key and the peer-authentication key are independent. Key rotation (new epochs
/// sealed to members) comes with membership; the format already carries the epoch everywhere.
public struct SpaceKey: Sendable, Equatable {
    /// 16 random bytes naming the space (safe to show to relays).
    public let id: [UInt8]
    /// The epoch new entries are sealed with.
    public let epoch: UInt32
    /// The 32-byte secret of each known epoch.
    public let secrets: [UInt32: [UInt8]]
    /// The derived entry key of each epoch and the current auth key, computed once (HKDF costs more than an AEAD
    /// opening of a small entry).
    private let entryKeys: [UInt32: [UInt8]]
    private let authKeyBytes: [UInt8]

    /// Creates a space key from parts (a token or the keystore); the current epoch's secret must be present.
    public init(id: [UInt8], epoch: UInt32, secrets: [UInt32: [UInt8]]) throws(KeystoreError) {
        guard id.count == 16, let current = secrets[epoch], current.count == 32, secrets.values.allSatisfy({ $0.count == 32 })
        else { throw KeystoreError(description: "malformed space key") }
        self.id = id
        self.epoch = epoch
        self.secrets = secrets
        func derive(_ label: String, _ epoch: UInt32, _ secret: [UInt8]) -> [UInt8] {
            var info = Array(label.utf8)
            info.appendBE(epoch)
            return HKDF<SHA256>.deriveKey(inputKeyMaterial: SymmetricKey(data: secret), salt: id, info: info, outputByteCount: 32)
                .withUnsafeBytes { Array($0) }
        }
        self.entryKeys = Dictionary(uniqueKeysWithValues: secrets.map { ($0.key, derive("blazedb entry key v1", $0.key, $0.value)) })
        self.authKeyBytes = derive("blazedb peer auth v1", epoch, current)
    }

    /// A fresh space: random id and secret, epoch 1.
    public static func generate() -> SpaceKey {
        var rng = SystemRandomNumberGenerator()
        let id = (0..<16).map { _ in UInt8.random(in: .min ... .max, using: &rng) }
        let secret = SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) }
        return try! SpaceKey(id: id, epoch: 1, secrets: [1: secret])
    }

    /// The space id as 32 hex digits.
    public var idHex: String { hexString(id) }

    /// The AEAD key for entries of `epoch`, nil for an unknown epoch.
    public func entryKey(epoch: UInt32) -> SymmetricKey? {
        entryKeys[epoch].map { SymmetricKey(data: $0) }
    }

    /// The key peers prove they hold during the handshake (current epoch).
    public var authKey: SymmetricKey { SymmetricKey(data: authKeyBytes) }

    // MARK: Share tokens

    /// Token prefix: names the format and says the token is a secret.
    public static let tokenPrefix = "blazedb-secret-1."

    /// The share token: prefix, then base64url of id, epoch and the current secret. Anyone holding it joins the space.
    public var token: String {
        var bytes = id
        bytes.appendBE(epoch)
        bytes += secrets[epoch]!
        return Self.tokenPrefix
            + Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    /// Parses a share token; throws with a message naming what is wrong.
    public init(token: String) throws(KeystoreError) {
        guard token.hasPrefix(Self.tokenPrefix) else {
            throw KeystoreError(description: "not a BlazeDB share token (it must start with \(Self.tokenPrefix))")
        }
        var b64 = String(token.dropFirst(Self.tokenPrefix.count)).replacingOccurrences(of: "-", with: "+")
            .replacingOccurrences(of: "_", with: "/")
        while b64.count % 4 != 0 { b64 += "=" }
        guard let data = Data(base64Encoded: b64), data.count == 16 + 4 + 32 else {
            throw KeystoreError(description: "share token is damaged (wrong length or characters)")
        }
        var r = ByteReader(Array(data)[...])
        let id = Array(r.read(16)!)
        let epoch = r.readUInt32()!
        try self.init(id: id, epoch: epoch, secrets: [epoch: Array(r.rest())])
    }

    // MARK: Keystore

    /// Stores the key as `<directory>/<space id>.json` (directory 0700, file 0600, written atomically).
    public func save(directory: String) throws {
        let secrets = self.secrets.keys.sorted().map { "\"\($0)\":\"\(Data(self.secrets[$0]!).base64EncodedString())\"" }
        let json = "{\"id\":\"\(idHex)\",\"epoch\":\(epoch),\"secrets\":{\(secrets.joined(separator: ","))}}"
        try KeyFile.write(json, to: directory + "/\(idHex).json")
    }

    /// Loads the key of space `idHex` from `directory`; nil when there is none.
    public static func load(directory: String, idHex: String) throws -> SpaceKey? {
        let path = directory + "/\(idHex).json"
        guard let text = try KeyFile.read(path) else { return nil }
        guard case .object(let o) = try JSONParser().parse(text), case .string(let hex)? = o["id"], let id = hexBytes(hex),
            case .int(let epoch)? = o["epoch"], let epoch32 = UInt32(exactly: epoch), case .object(let s)? = o["secrets"]
        else { throw KeystoreError(description: "\(path) is not a BlazeDB space key") }
        var secrets: [UInt32: [UInt8]] = [:]
        for (k, v) in s {
            guard let e = UInt32(k), case .string(let b64) = v, let bytes = Data(base64Encoded: b64) else {
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
