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
}
