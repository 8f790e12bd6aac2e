import BlazeCRDT
import BlazeProtocol
import BlazeTestSupport
import Foundation
import GRDB
import Testing

@testable import BlazeStore

/// `BlazeDatabase.withReferencedBlobs`: the references as of a snapshot are read without holding the writer, and the
/// second step, holding it, gets every reference written meanwhile, by any write path.
@Suite struct BlobReferenceTests {
    /// A blob reference to the id whose 32 bytes are all `byte`.
    static func ref(_ byte: UInt8) -> JSONValue {
        ["$blob": ["id": .string(id(byte).hex), "size": 10, "type": "application/octet-stream"]]
    }

    static func id(_ byte: UInt8) -> ChunkID { ChunkID(bytes: [UInt8](repeating: byte, count: 32))! }

    @Test func referencesWrittenDuringTheFirstStepReachTheSecond() throws {
        let replicas = try StoreReplicas(2)
        let (a, b) = (replicas.dbs[0], replicas.dbs[1])
        _ = try b.apply(.insert(collection: "files", doc: ["_id": "held", "file": Self.ref(1)]))
        _ = try b.apply(.insert(collection: "files", doc: ["_id": "patched", "n": 0]))
        _ = try b.apply(.insert(collection: "files", doc: ["_id": "gone", "n": 0]))
        try replicas.send(1, 0)
        _ = try a.apply(.insert(collection: "files", doc: ["_id": "remote", "file": Self.ref(4)]))
        let (planned, added) = try b.withReferencedBlobs(
            plan: { refs -> Set<ChunkID> in
                // The writer is free: local writes (a new document, a patch, a pin) and a peer's change commit now.
                _ = try b.apply(.insert(collection: "files", doc: ["_id": "new", "file": Self.ref(2)]))
                _ = try b.apply(.patch(collection: "files", id: "patched", set: ["file": Self.ref(3)]))
                _ = try b.apply(.delete(collection: "files", id: "gone"))
                #expect(try b.pinBlob(Self.id(5)))
                try replicas.send(0, 1)
                return refs
            },
            finish: { planned, added in (planned, added) })
        #expect(planned == [Self.id(1)])
        #expect(added.isSuperset(of: [Self.id(2), Self.id(3), Self.id(4), Self.id(5)]))
        #expect(!added.contains(Self.id(1)), "a row not written since is not read again")
    }

    @Test func aRewriteOfTheFileDuringTheFirstStepMakesTheSecondReadEverything() throws {
        let replicas = try StoreReplicas(1)
        let db = replicas.dbs[0]
        _ = try db.apply(.insert(collection: "files", doc: ["_id": "held", "file": Self.ref(1)]))
        let added = try db.withReferencedBlobs(
            plan: { _ in
                _ = try db.apply(.insert(collection: "files", doc: ["_id": "new", "file": Self.ref(2)]))
                // A rewrite may give rows new rowids: the rows noted before it name nothing any more.
                try db.connections.writeWithoutTransaction { try db.connections.vacuum($0) }
            },
            finish: { _, added in added })
        #expect(added == [Self.id(1), Self.id(2)])
    }

    @Test func nothingWrittenDuringTheFirstStepLeavesTheSecondNothingToRead() throws {
        let replicas = try StoreReplicas(1)
        let db = replicas.dbs[0]
        _ = try db.apply(.insert(collection: "files", doc: ["_id": "held", "file": Self.ref(1)]))
        let added = try db.withReferencedBlobs(plan: { $0 }, finish: { _, added in added })
        #expect(added.isEmpty)
        // The watch ended with the sweep: rows written after it are not noted anywhere (a second sweep starts clean).
        _ = try db.apply(.insert(collection: "files", doc: ["_id": "later", "file": Self.ref(2)]))
        let again = try db.withReferencedBlobs(plan: { $0 }, finish: { planned, added in (planned, added) })
        #expect(again.0 == [Self.id(1), Self.id(2)] && again.1.isEmpty)
    }

    @Test func aFailingFirstStepStopsTheWatch() throws {
        let replicas = try StoreReplicas(1)
        let db = replicas.dbs[0]
        struct Stop: Error {}
        #expect(throws: Stop.self) {
            try db.withReferencedBlobs(plan: { _ -> Int in throw Stop() }, finish: { _, _ in 0 })
        }
        // A hook left behind would make the next sweep fall back to holding the writer; it finds none.
        let hooked = db.connections.writeWithoutTransaction { db in
            let watch = ReferenceWatch()
            defer { watch.stop(on: db.sqliteConnection!) }
            return watch.start(on: db.sqliteConnection!)
        }
        #expect(hooked)
    }

    @Test func everyWatchedTableHasRowidsAndEveryPlaceIsWatchedOrReadWhole() throws {
        let replicas = try StoreReplicas(1)
        let db = replicas.dbs[0]
        // SQLite reports no row of a table without rowid: a watched table made so by a migration would go quiet.
        try db.connections.writeWithoutTransaction { conn in
            for table in ReferenceWatch.tables {
                let withoutRowid = try Bool.fetchOne(conn, sql: "SELECT wr FROM pragma_table_list WHERE name = ?", arguments: [table])
                #expect(withoutRowid == false, "\(table) must keep its rowids")
            }
        }
        #expect(ReferenceWatch.tables.isSubset(of: Set(BlazeDatabase.blobReferencePlaces.map(\.0))))
    }
}
