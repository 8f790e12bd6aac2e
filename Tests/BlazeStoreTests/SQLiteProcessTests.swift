import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDBSQLite
import Testing

@testable import BlazeStore

/// SQLite's process-wide settings (`SQLiteProcess`): made before the first database a store opens.
@Suite struct SQLiteProcessTests {
    /// In a fresh process, a store's first database opens with SQLite's memory statistics off, so that no allocation
    /// SQLite makes takes their mutex: the bytes SQLite counts as in use stay 0 through writes and reads. (The test's
    /// own process may have opened SQLite through other code first, where the setting can no longer take effect.)
    @Test func aStoresFirstDatabaseOpensWithMemoryStatisticsOff() async {
        await #expect(processExitsWith: .success) {
            let dir = NSTemporaryDirectory() + "sqlite-process-\(UUID().uuidString)"
            let failure: Int32? = try {
                let store = try Store(directory: dir, node: randomNode())
                defer { store.closeAll() }
                let db = try store.create("m")
                let pad = JSONValue.string(String(repeating: "x", count: 500))
                for i in 0..<200 { _ = try db.apply(.insert(collection: "c", doc: ["_id": .string("d\(i)"), "pad": pad])) }
                guard try db.get(collection: "c", id: "d7").objectValue?.count == 2 else { return 2 }
                guard sqlite3_memory_used() == 0 else { return 3 }
                guard SQLiteProcess.configure() == SQLITE_OK else { return 4 }
                return nil
            }()
            try? FileManager.default.removeItem(atPath: dir)
            if let failure { exit(failure) }
        }
    }
}
