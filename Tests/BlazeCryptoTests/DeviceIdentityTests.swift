import Crypto
import Foundation
import Testing

@testable import BlazeCrypto

@Suite struct DeviceIdentityTests {
    func tempDir() -> String { NSTemporaryDirectory() + "blazekeys-\(UUID().uuidString)" }

    @Test func identityIsCreatedOnceWithPrivatePermissionsAndReloaded() throws {
        let dir = tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let a = try DeviceIdentity.loadOrCreate(directory: dir)
        let b = try DeviceIdentity.loadOrCreate(directory: dir)
        #expect(a.nodeID == b.nodeID && a.nodeID.count == 16)
        #expect(a.agreementKey.publicKey.rawRepresentation == b.agreementKey.publicKey.rawRepresentation)
        #expect(a.nodeID == Array(SHA256.hash(data: a.signingKey.publicKey.rawRepresentation).prefix(16)))
        let fileMode = try FileManager.default.attributesOfItem(atPath: dir + "/device.json")[.posixPermissions] as? NSNumber
        let dirMode = try FileManager.default.attributesOfItem(atPath: dir)[.posixPermissions] as? NSNumber
        #expect(fileMode?.intValue == 0o600 && dirMode?.intValue == 0o700)
        #expect(try DeviceIdentity.loadOrCreate(directory: tempDir()).nodeID != a.nodeID)
    }

    @Test func refusesAKeystoreOthersCanRead() throws {
        let dir = tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        _ = try DeviceIdentity.loadOrCreate(directory: dir)
        chmod(dir + "/device.json", 0o644)
        #expect(throws: KeystoreError.self) { try DeviceIdentity.loadOrCreate(directory: dir) }
    }

    /// Keystore files carry their format: files written before it was recorded (no `format`) are read in place, a
    /// newer format is refused naming both versions, and nothing is rewritten by a refused read.
    @Test func keystoreFilesOfANewerFormatAreRefusedAndUnversionedOnesRead() throws {
        let dir = tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let made = try DeviceIdentity.loadOrCreate(directory: dir)
        let path = dir + "/device.json"
        // Format 1 is written without the field (as builds before formats were recorded wrote it, and read it).
        let unversioned = try String(contentsOfFile: path, encoding: .utf8)
        #expect(unversioned.hasPrefix("{\"ed25519\":") && !unversioned.contains("format"))
        func rewrite(_ text: String) throws {
            try text.write(toFile: path, atomically: false, encoding: .utf8)
            chmod(path, 0o600)
        }
        let text = unversioned.replacingOccurrences(of: "{", with: "{\"format\":\(KeyFile.format),")
        try rewrite(text)
        #expect(try DeviceIdentity.loadOrCreate(directory: dir).nodeID == made.nodeID)
        let newer = text.replacingOccurrences(of: "\"format\":\(KeyFile.format),", with: "\"format\":\(KeyFile.format + 1),")
        try rewrite(newer)
        #expect {
            _ = try DeviceIdentity.loadOrCreate(directory: dir)
        } throws: { error in
            "\(error)".contains("format \(KeyFile.format + 1)") && "\(error)".contains("up to \(KeyFile.format)")
        }
        #expect(try String(contentsOfFile: path, encoding: .utf8) == newer)
        for bad in ["\"format\":\"1\",", "\"format\":0,", "\"format\":-3,"] {
            try rewrite(text.replacingOccurrences(of: "\"format\":\(KeyFile.format),", with: bad))
            #expect(throws: KeystoreError.self) { try DeviceIdentity.loadOrCreate(directory: dir) }
        }
        // Space keys and pending spaces are checked the same way.
        let key = SpaceKey.generate()
        try key.save(directory: dir)
        #expect(try SpaceKey.load(directory: dir, idHex: key.idHex)?.id == key.id)
        let keyPath = dir + "/\(key.idHex).json"
        let keyText = try String(contentsOfFile: keyPath, encoding: .utf8)
        #expect(keyText.hasPrefix("{\"id\":"))
        try keyText.replacingOccurrences(of: "{\"id\":", with: "{\"format\":9,\"id\":").write(toFile: keyPath, atomically: false, encoding: .utf8)
        #expect(throws: KeystoreError.self) { try SpaceKey.load(directory: dir, idHex: key.idHex) }
        let pending = PendingSpace.generate()
        try pending.save(directory: dir, db: "notes")
        #expect(try PendingSpace.load(directory: dir, db: "notes") == pending)
        let pendingPath = dir + "/pending-notes.json"
        let pendingText = try String(contentsOfFile: pendingPath, encoding: .utf8)
        try pendingText.replacingOccurrences(of: "{", with: "{\"format\":9,").write(toFile: pendingPath, atomically: false, encoding: .utf8)
        #expect(throws: KeystoreError.self) { try PendingSpace.load(directory: dir, db: "notes") }
    }
}
