import BlazeTestSupport
import Foundation
import GRDB
import Logging
import Testing

@testable import BlazeRelay

/// The relay's files carry a format version: a newer one is refused with both versions named, an older one is copied
/// before it is migrated (README, "Upgrades and file formats").
@Suite struct RelayFormatTests {
    @Test func anOlderRelayFileIsKeptBeforeMigratingAndANewerOneIsRefused() throws {
        let directory = NSTemporaryDirectory() + "relay-format-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let migrations = RelayStore.migrator.migrations
        #expect(RelayStore.formatVersion == migrations.count)

        // A file of the format before this one, with a space in it.
        let old = directory + "/old.db"
        let queue = try DatabaseQueue(path: old)
        try RelayStore.migrator.migrate(queue, upTo: migrations[migrations.count - 2])
        try queue.write { db in
            try db.execute(sql: "INSERT INTO relay_spaces(id, capability, added_at) VALUES (?, ?, 0)", arguments: [Data(repeating: 1, count: 16), Data(repeating: 2, count: 32)])
        }
        try queue.close()
        _ = try RelayStore(path: old)
        let kept = try DatabaseQueue(path: old + ".format-\(migrations.count - 1).bak")
        #expect(try kept.read { db in try RelayStore.migrator.appliedIdentifiers(db).count } == migrations.count - 1)
        #expect(try kept.read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM relay_spaces") } == 1)
        try kept.close()

        // A file a build with one migration more wrote.
        let newer = directory + "/newer.db"
        let future = try DatabaseQueue(path: newer)
        try RelayStore.migrator.migrate(future)
        try future.write { db in try db.execute(sql: "INSERT INTO grdb_migrations(identifier) VALUES ('v99')") }
        try future.close()
        let before = try Data(contentsOf: URL(fileURLWithPath: newer))
        #expect {
            _ = try RelayStore(path: newer)
        } throws: { error in
            let text = "\(error)"
            return error is RelayFormatError && text.contains("format \(migrations.count + 1)") && text.contains("up to \(migrations.count)")
        }
        #expect(!FileManager.default.fileExists(atPath: newer + ".format-\(migrations.count + 1).bak"))
        #expect(try Data(contentsOf: URL(fileURLWithPath: newer)) == before, "a refused file is not written to")
        #expect(!FileManager.default.fileExists(atPath: newer + "-wal"))
    }

    @Test func aPostgresSchemaOfANewerFormatIsRefused() async throws {
        let server = try PostgresServer()
        var logger = Logger(label: "relay-test")
        logger.logLevel = .critical
        let store = try await PostgresRelayStore(configuration: try PostgresRelayStore.configuration(url: server.url), logger: logger)
        store.close()
        #expect(try server.psql("SELECT version FROM relay_format").contains("\(PostgresRelayStore.formatVersion)"))
        // Opened again by this build: the same format, accepted.
        let again = try await PostgresRelayStore(configuration: try PostgresRelayStore.configuration(url: server.url), logger: logger)
        again.close()
        _ = try server.psql("UPDATE relay_format SET version = \(PostgresRelayStore.formatVersion + 1)")
        await #expect {
            _ = try await PostgresRelayStore(configuration: try PostgresRelayStore.configuration(url: server.url), logger: logger)
        } throws: { error in
            error is RelayFormatError && "\(error)".contains("format \(PostgresRelayStore.formatVersion + 1)")
        }
    }

    /// The README's table of file formats names this build's relay formats.
    @Test func theReadmeNamesTheCurrentRelayFormats() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
        #expect(readme.contains("migrations (\(RelayStore.formatVersion)), or \(PostgresRelayStore.formatVersion) for PostgreSQL"))
    }
}
