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
}
