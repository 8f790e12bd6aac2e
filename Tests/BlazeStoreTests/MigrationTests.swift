import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDB
import Testing

@testable import BlazeStore

@Suite struct StoreMigration {
    /// Rewrites a current database file into the v4 layout (states in `crdt_docs`, deleted documents included), as
    /// databases written before v5 hold them.
    static func downgradeToV4(_ path: String) throws {
        let queue = try DatabaseQueue(path: path)
        try queue.writeWithoutTransaction { db in
            try db.execute(
                sql: """
                    CREATE TABLE crdt_docs(
                        collection TEXT NOT NULL,
                        id TEXT NOT NULL,
                        state TEXT NOT NULL,
                        conflicted INTEGER NOT NULL DEFAULT 0,
                        PRIMARY KEY(collection, id)
                    ) WITHOUT ROWID;
                    CREATE INDEX crdt_docs_conflicted ON crdt_docs(collection, id) WHERE conflicted = 1;
                    INSERT INTO crdt_docs SELECT collection, id, state, conflicted FROM docs;
                    INSERT INTO crdt_docs SELECT collection, id, state, 0 FROM tombstones;
                    DROP TABLE tombstones;
                    DROP INDEX docs_conflicted;
                    ALTER TABLE docs DROP COLUMN state;
                    ALTER TABLE docs DROP COLUMN conflicted;
                    DELETE FROM grdb_migrations WHERE identifier = 'v5-state-in-docs';
                    """)
        }
        try queue.close()
    }

    /// Data written before replication (schema v1: documents without state) becomes one local change when the
    /// database is opened, through every later migration.
    @Test func dataFromBeforeReplicationIsAdoptedAsOneChange() throws {
        let t = try TempStore()
        let path = t.dir + "/databases/old.db"
        try FileManager.default.createDirectory(atPath: t.dir + "/databases", withIntermediateDirectories: true)
        let queue = try DatabaseQueue(path: path)
        try Schema.migrator.migrate(queue, upTo: "v1")
        try queue.write { db in
            try db.execute(sql: "INSERT INTO collections(name, created_at) VALUES ('c', 0)")
            for i in 0..<3 {
                try db.execute(
                    sql: "INSERT INTO docs(collection, id, body) VALUES ('c', ?, ?)",
                    arguments: ["d\(i)", #"{"_id":"d\#(i)","n":\#(i)}"#])
            }
        }
        try queue.close()
        let db = try t.store.database("old")
        #expect(try db.get(collection: "c", id: "d2") == ["_id": "d2", "n": 2])
        let changes = try db.changes(since: VersionVector())
        #expect(changes.count == 1 && changes[0].ops.count == 3)
        // The adopted documents are ordinary ones: patched in place, deleted, replicated.
        _ = try db.apply(.patch(collection: "c", id: "d1", set: ["n": 10]))
        _ = try db.apply(.delete(collection: "c", id: "d0"))
        let other = try TempStore()
        let replica = try other.store.create("old")
        _ = try replica.receive(try db.changes(since: VersionVector()))
        #expect(try replica.stateHash() == (try db.stateHash()))
        #expect(try replica.count(collection: "c", filter: .all) == 2)
    }

    @Test func statesMoveIntoDocsAndTombstonesKeepingEverything() async throws {
        let a = try TempStore()
        let b = try TempStore()
        let da = try a.store.create("m")
        let db = try b.store.create("m")
        _ = try da.write { tx in try tx.createIndex(collection: "c", fields: ["n"], name: "by_n") }
        _ = try da.commit((0..<20).map { .insert(collection: "c", doc: ["_id": .string("d\($0)"), "n": .int(Int64($0))]) })
        _ = try da.apply(.delete(collection: "c", id: "d3"))
        _ = try db.receive(try da.changes(since: VersionVector()))
        // Concurrent writes of one field: one of them loses and is a conflict on both replicas.
        _ = try da.apply(.patch(collection: "c", id: "d5", set: ["v": "from a"]))
        _ = try db.apply(.patch(collection: "c", id: "d5", set: ["v": "from b"]))
        _ = try da.receive(try db.changes(since: try da.versionVector()))
        let hash = try da.stateHash()
        let conflicts = try da.conflicts().map { "\($0.id).\($0.field)=\($0.value?.jsonText ?? "-")" }
        #expect(conflicts.count == 1)
        let path = da.path
        a.store.closeAll()
        try Self.downgradeToV4(path)

        let reopened = try Store(directory: a.dir, node: da.node)
        defer { reopened.closeAll() }
        let m = try reopened.database("m")
        #expect(try m.stateHash() == hash)
        #expect(try m.conflicts().map { "\($0.id).\($0.field)=\($0.value?.jsonText ?? "-")" } == conflicts)
        #expect(try m.count(collection: "c", filter: .all) == 19)
        #expect(try m.explain(FindQuery(collection: "c", filter: try Filter.parse(["n": 7]))).indexes == ["by_n"])
        let tombstones = try m.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM tombstones") }
        #expect(tombstones == 1)
        // The deleted document's causal length survived: inserting it again starts incarnation 3.
        let before = try m.versionVector()
        _ = try m.apply(.insert(collection: "c", doc: ["_id": "d3", "n": 33]))
        let change = try #require(try m.changes(since: before).first)
        #expect(change.ops == [.doc(DocOp(key: DocKey(collection: "c", id: "d3"), cl: 3, set: ["n": 33]))])
        // Both replicas still converge after more writes on each side.
        _ = try db.apply(.patch(collection: "c", id: "d7", incr: ["n": 1]))
        _ = try db.receive(try m.changes(since: try db.versionVector()))
        _ = try m.receive(try db.changes(since: try m.versionVector()))
        #expect(try m.stateHash() == (try db.stateHash()))
        #expect(try m.get(collection: "c", id: "d7") == ["_id": "d7", "n": 8])
    }

    /// Rewrites the logs of a current database file into the v5 layout (WITHOUT ROWID tables).
    static func downgradeToV5(_ path: String) throws {
        let queue = try DatabaseQueue(path: path)
        try queue.writeWithoutTransaction { db in
            try db.execute(
                sql: """
                    ALTER TABLE changes RENAME TO changes_v6;
                    CREATE TABLE changes(
                        origin TEXT NOT NULL, seq INTEGER NOT NULL, hlc INTEGER NOT NULL, body TEXT NOT NULL,
                        PRIMARY KEY(origin, seq)
                    ) WITHOUT ROWID;
                    INSERT INTO changes SELECT origin, seq, hlc, body FROM changes_v6;
                    DROP TABLE changes_v6;
                    ALTER TABLE parked RENAME TO parked_v6;
                    CREATE TABLE parked(
                        origin TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL, PRIMARY KEY(origin, seq)
                    ) WITHOUT ROWID;
                    INSERT INTO parked SELECT origin, seq, body FROM parked_v6;
                    DROP TABLE parked_v6;
                    ALTER TABLE sync_entries RENAME TO sync_entries_v6;
                    CREATE TABLE sync_entries(
                        origin BLOB NOT NULL, seq INTEGER NOT NULL, hash BLOB NOT NULL, bytes BLOB NOT NULL,
                        PRIMARY KEY(origin, seq)
                    ) WITHOUT ROWID;
                    INSERT INTO sync_entries SELECT origin, seq, hash, bytes FROM sync_entries_v6;
                    DROP TABLE sync_entries_v6;
                    DELETE FROM grdb_migrations WHERE identifier = 'v6-logs-keep-rowids';
                    """)
        }
        try queue.close()
    }

    @Test func logsBecomeRowidTablesKeepingEveryRow() throws {
        let a = try TempStore()
        let b = try TempStore()
        let da = try a.store.create("m")
        let db = try b.store.create("m")
        let big = JSONValue.string(String(repeating: "x", count: 3000))
        for t in 0..<3 {
            _ = try da.commit((0..<20).map { .insert(collection: "c", doc: ["_id": .string("a\(t)-\($0)"), "b": big]) })
        }
        _ = try db.commit((0..<20).map { .insert(collection: "c", doc: ["_id": .string("b\($0)"), "b": big]) })
        // The third change of `da` alone waits for the first two: it is parked.
        let fromA = try da.changes(since: VersionVector())
        #expect(try db.receive([fromA[2]]).parked == 1)
        try db.connections.write { c in
            try c.execute(
                sql: "INSERT INTO sync_entries(origin, seq, hash, bytes) VALUES (?, 1, ?, ?)",
                arguments: [Data(repeating: 1, count: 16), Data(repeating: 2, count: 32), Data(repeating: 3, count: 9000)])
        }
        func rows(_ d: BlazeDatabase) throws -> [String] {
            try d.read { c in
                try String.fetchAll(c, sql: "SELECT origin || ':' || seq || ':' || hlc || ':' || body FROM changes ORDER BY origin, seq")
                    + String.fetchAll(c, sql: "SELECT origin || ':' || seq || ':' || body FROM parked ORDER BY origin, seq")
                    + String.fetchAll(c, sql: "SELECT hex(origin) || seq || hex(hash) || hex(bytes) FROM sync_entries")
            }
        }
        let before = try rows(db)
        #expect(before.count == 3)
        let path = db.path
        b.store.closeAll()
        try Self.downgradeToV5(path)

        let reopened = try Store(directory: b.dir, node: db.node)
        defer { reopened.closeAll() }
        let m = try reopened.database("m")
        #expect(try rows(m) == before)
        let layouts = try m.read { c in
            try String.fetchAll(
                c, sql: "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name IN ('changes', 'parked', 'sync_entries')")
        }
        #expect(layouts.count == 3 && layouts.allSatisfy { !$0.uppercased().contains("WITHOUT ROWID") }, "\(layouts)")
        // The parked change applies once its dependencies arrive, and both replicas converge.
        #expect(try m.receive(Array(fromA[0..<2])).applied == 3)
        _ = try da.receive(try m.changes(since: try da.versionVector()))
        #expect(try m.stateHash() == (try da.stateHash()))
        #expect(try m.count(collection: "c", filter: .all) == 80)
        #expect(try m.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM parked") } == 0)
    }

    /// A file an older build wrote is copied beside itself before it is migrated, and the copy is the old file as it
    /// was; a file a newer build wrote is refused, naming both versions, and left as it is.
    @Test func anOlderFileIsKeptBeforeMigratingAndANewerOneIsRefused() throws {
        let t = try TempStore()
        try FileManager.default.createDirectory(atPath: t.dir + "/databases", withIntermediateDirectories: true)
        let path = t.dir + "/databases/old.db"
        let previous = Schema.migrator.migrations[Schema.migrator.migrations.count - 2]
        let queue = try DatabaseQueue(path: path)
        try Schema.migrator.migrate(queue, upTo: previous)
        try queue.write { db in
            try db.execute(sql: "INSERT INTO collections(name, created_at) VALUES ('c', 0)")
        }
        try queue.close()
        let db = try t.store.database("old")
        #expect(try db.read { try String.fetchAll($0, sql: "SELECT name FROM collections") } == ["c"])
        let copy = path + ".format-\(DatabaseFormat.current - 1).bak"
        let kept = try DatabaseQueue(path: copy)
        #expect(try kept.read { db in try Schema.migrator.appliedIdentifiers(db).count } == DatabaseFormat.current - 1)
        #expect(try kept.read { db in try String.fetchAll(db, sql: "SELECT name FROM collections") } == ["c"])
        try kept.close()
        #expect(try t.store.list() == ["old"], "the copy is not a database of the store")
        // Dropping the database removes the copies of it too.
        try t.store.drop("old")
        #expect(!FileManager.default.fileExists(atPath: copy), "a dropped database's copies go with it")

        // A build that knows one migration more wrote this one.
        let newer = t.dir + "/databases/newer.db"
        let future = try DatabaseQueue(path: newer)
        try Schema.migrator.migrate(future)
        try future.write { db in try db.execute(sql: "INSERT INTO grdb_migrations(identifier) VALUES ('v99-from-the-future')") }
        try future.close()
        let before = try Data(contentsOf: URL(fileURLWithPath: newer))
        #expect {
            _ = try t.store.database("newer")
        } throws: { error in
            guard let e = error as? StoreError else { return false }
            return e.kind == "database_too_new" && e.message.contains("format \(DatabaseFormat.current + 1)")
                && e.message.contains("up to \(DatabaseFormat.current)")
        }
        #expect(try Data(contentsOf: URL(fileURLWithPath: newer)) == before)
        #expect(!FileManager.default.fileExists(atPath: newer + ".format-\(DatabaseFormat.current + 1).bak"))
        // A current file is opened without a copy.
        _ = try t.store.create("fresh")
        #expect(try FileManager.default.contentsOfDirectory(atPath: t.dir + "/databases").filter { $0.hasPrefix("fresh") && $0.hasSuffix(".bak") }.isEmpty)
    }

    /// The README's table of file formats names this build's database format.
    @Test func theReadmeNamesTheCurrentDatabaseFormat() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let readme = try String(contentsOf: root.appendingPathComponent("README.md"), encoding: .utf8)
        #expect(readme.contains("the number of schema migrations it has had (\(DatabaseFormat.current) in this build)"))
    }
}
