import BlazeClient
import BlazeProtocol
import Foundation
import GRDB
import Testing

/// Blobs in backups (README, "Backup and restore"): a backup holds the chunks of the blobs its snapshot refers to,
/// and a restore puts them back before the database appears, checking each like data from another device.
@Suite struct BlobBackupTests {
    /// Puts `bytes` as a blob of `db` and a document `doc` referring to it; returns the blob's id and chunk count.
    func put(_ c: BlazeConnection, db: String, dir: String, doc: String, _ bytes: [UInt8]) throws -> (id: JSONValue, chunks: Int64) {
        let file = dir + "/\(doc).bin"
        #expect(FileManager.default.createFile(atPath: file, contents: Data(bytes)))
        let put = try c.call("blob.put", ["db": .string(db), "path": .string(file), "type": "image/jpeg"])
        _ = try c.call("doc.put", ["db": .string(db), "collection": "photos", "id": .string(doc), "doc": ["file": put["ref"]!]])
        return (try #require(put["blob"]?["id"]), try #require(put["chunks"]?.intValue))
    }

    /// A database with two blobs its documents refer to and one nothing refers to, backed up to `path`.
    func backedUp(_ c: BlazeConnection, dir: String, path: String) throws -> (a: [UInt8], b: [UInt8], ids: [JSONValue], backup: JSONValue) {
        _ = try c.call("db.create", ["db": "photos"])
        let (a, b) = (BlobDaemonTests().content(3_000_000, seed: 41), BlobDaemonTests().content(2_500_000, seed: 42))
        let first = try put(c, db: "photos", dir: dir, doc: "a", a)
        let second = try put(c, db: "photos", dir: dir, doc: "b", b)
        let loose = dir + "/loose.bin"
        #expect(FileManager.default.createFile(atPath: loose, contents: Data(BlobDaemonTests().content(1_500_000, seed: 43))))
        _ = try c.call("blob.put", ["db": "photos", "path": .string(loose)])
        let backup = try c.call("db.backup", ["db": "photos", "path": .string(path)])
        // Each blob's chunks and its manifest; not the blob nothing refers to.
        #expect(backup["chunks"]?.intValue == first.chunks + 1 + second.chunks + 1)
        #expect((backup["chunkBytes"]?.intValue ?? 0) > 5_500_000 && (backup["chunkBytes"]?.intValue ?? 0) < 5_600_000)
        #expect(backup["blobsNotHeld"] == 0)
        return (a, b, [first.id, second.id], backup)
    }

    @Test func aBackupHoldsTheBlobsItRefersToAndARestoreReadsThemWithTheOriginalGone() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        let path = d.dir.path + "/photos.backup"
        let (a, b, ids, backup) = try backedUp(c, dir: d.dir.path, path: path)
        _ = try c.call("db.drop", ["db": "photos"])
        let restored = try c.call("db.restore", ["path": .string(path), "db": "again"])
        #expect(restored["chunks"] == backup["chunks"] && restored["chunkBytes"] == backup["chunkBytes"])
        #expect(restored["stateHash"] == backup["stateHash"])
        #expect(try c.call("db.info", ["db": "again"])["blobs"]?["chunks"] == backup["chunks"])
        // The blobs read back whole from the restored copy's own store.
        let out = d.dir.path + "/a.out"
        _ = try c.call("blob.get", ["db": "again", "blob": ids[0], "path": .string(out)])
        #expect((try? Data(contentsOf: URL(fileURLWithPath: out))) == Data(a))
        let read = try c.call("blob.read", ["db": "again", "blob": ids[1], "offset": 2_000_000, "length": 500_000])
        #expect(read["data"]?.stringValue.flatMap { Data(base64Encoded: $0) } == Data(b[2_000_000...]))
        // The chunks were copied into the backup file, not linked: a database file holds none of them.
        let file = try DatabaseQueue(path: d.dataDir + "/databases/again.db")
        #expect(try file.read { try $0.tableExists("backup_chunks") } == false)
        try file.close()
    }

    /// A chunk two blobs use is held once: here one blob's content is another's manifest, so the piece of the one is
    /// the manifest of the other (a member could do it on purpose to spoil backups). The backup restores.
    @Test func aChunkTwoBlobsUseIsBackedUpOnce() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        _ = try c.call("db.create", ["db": "photos"])
        let first = try put(c, db: "photos", dir: d.dir.path, doc: "a", BlobDaemonTests().content(700_000, seed: 45))
        let hex = try #require(first.id.stringValue)
        let manifest = try Data(contentsOf: URL(fileURLWithPath: d.dataDir + "/databases/photos.blobs/\(hex.prefix(2))/\(hex)"))
        let second = try put(c, db: "photos", dir: d.dir.path, doc: "b", Array(manifest))
        #expect(second.chunks == 1)
        let path = d.dir.path + "/photos.backup"
        let backup = try c.call("db.backup", ["db": "photos", "path": .string(path)])
        // The first blob's pieces and manifest, and the second's manifest: its one piece is the first's manifest.
        #expect(backup["chunks"]?.intValue == first.chunks + 2)
        let restored = try c.call("db.restore", ["path": .string(path), "db": "again"])
        #expect(restored["chunks"] == backup["chunks"])
        let read = try c.call("blob.read", ["db": "again", "blob": second.id, "offset": 0, "length": 1_000_000])
        #expect(read["data"]?.stringValue.flatMap { Data(base64Encoded: $0) } == manifest)
    }

    /// A restore cut short by a stopped daemon leaves its chunk directory under a name no database can have, which
    /// the next start removes; anything else is left alone.
    @Test func aRestoresUnfinishedChunkDirectoryGoesAtTheNextStart() throws {
        let dir = TempDir()
        let databases = dir.path + "/data/databases"
        let cut = ".restoring-" + UUID().uuidString
        // A database's chunk store whose name looks like a restore's (database names may hold dots) is not one.
        for name in [cut + "/ab", "kept.blobs/ab", "a.blobs.restoring-x.blobs/ab", ".restoring-x/ab"] {
            try FileManager.default.createDirectory(atPath: databases + "/" + name, withIntermediateDirectories: true)
        }
        let d = try DaemonProcess(dir: dir)
        defer { d.stop() }
        #expect(!FileManager.default.fileExists(atPath: databases + "/" + cut))
        for kept in ["kept.blobs/ab", "a.blobs.restoring-x.blobs/ab", ".restoring-x/ab"] {
            #expect(FileManager.default.fileExists(atPath: databases + "/" + kept), "\(kept) was removed")
        }
    }

    /// A blob the documents refer to that this device does not hold (a lazy device reads only what it needs) is
    /// counted, not silently left out; its reference is restored as it was.
    @Test func aBlobNotHeldHereIsCountedAndItsReferenceKept() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        _ = try c.call("db.create", ["db": "photos"])
        let held = try put(c, db: "photos", dir: d.dir.path, doc: "a", BlobDaemonTests().content(1_000_000, seed: 44))
        let ghost: JSONValue = ["$blob": ["id": .string(String(repeating: "ab", count: 32)), "size": 10, "type": "image/jpeg"]]
        _ = try c.call("doc.put", ["db": "photos", "collection": "photos", "id": "ghost", "doc": ["file": ghost]])
        let path = d.dir.path + "/photos.backup"
        let backup = try c.call("db.backup", ["db": "photos", "path": .string(path)])
        #expect(backup["blobsNotHeld"] == 1 && backup["chunks"]?.intValue == held.chunks + 1)
        _ = try c.call("db.restore", ["path": .string(path), "db": "again"])
        #expect(try c.call("doc.get", ["db": "again", "collection": "photos", "id": "ghost"])["doc"]?["file"] == ghost)
        // Without a chunk store, a backup holds none and says so.
        _ = try c.call("doc.put", ["db": "default", "collection": "c", "id": "x", "doc": ["n": 1]])
        let plain = try c.call("db.backup", ["db": "default", "path": .string(d.dir.path + "/plain.backup")])
        #expect(plain["chunks"] == 0 && plain["chunkBytes"] == 0 && plain["blobsNotHeld"] == 0)
        // Without a chunk it has no chunk table: earlier builds, which refuse tables they do not know, restore it.
        let plainFile = try DatabaseQueue(path: d.dir.path + "/plain.backup")
        #expect(try plainFile.read { try $0.tableExists("backup_chunks") } == false)
        try plainFile.close()
        // A device that never held a blob still counts those it lacks.
        _ = try c.call("doc.put", ["db": "default", "collection": "c", "id": "ghost", "doc": ["file": ghost]])
        let lazy = try c.call("db.backup", ["db": "default", "path": .string(d.dir.path + "/lazy.backup")])
        #expect(lazy["chunks"] == 0 && lazy["blobsNotHeld"] == 1)
        #expect(!FileManager.default.fileExists(atPath: d.dataDir + "/databases/default.blobs"), "a chunk store was made")
    }

    /// A backup's chunks are as hostile as a peer's: a damaged or crafted one refuses the restore, and neither the
    /// database nor its chunk store is left behind.
    @Test(arguments: [
        ("content not matching its digest", "UPDATE backup_chunks SET content = zeroblob(length(content)) WHERE rowid = 1", "backup_invalid"),
        ("a chunk over the largest size", "UPDATE backup_chunks SET content = zeroblob(16777216) WHERE rowid = 1", "backup_invalid"),
        ("an empty chunk", "UPDATE backup_chunks SET content = x'' WHERE rowid = 1", "backup_invalid"),
        ("a short id", "UPDATE backup_chunks SET id = x'00ff' WHERE rowid = 1", "backup_invalid"),
        ("a text digest", "UPDATE backup_chunks SET sha256 = 'digest' WHERE rowid = 1", "backup_invalid"),
        ("a chunk twice", "INSERT INTO backup_chunks SELECT * FROM backup_chunks WHERE rowid = 1", "backup_invalid"),
        ("an id twice, with other content", """
            INSERT INTO backup_chunks SELECT (SELECT id FROM backup_chunks WHERE rowid = 1), sha256, content \
            FROM backup_chunks WHERE rowid = 2
            """, "backup_invalid"),
        ("a text content", "UPDATE backup_chunks SET content = 'text' WHERE rowid = 1", "backup_invalid"),
        ("an altered table", "ALTER TABLE backup_chunks ADD COLUMN planted TEXT", "backup_tampered"),
    ])
    func aCraftedChunkRefusesTheRestoreAndLeavesNothing(what: String, sql: String, kind: String) throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        let path = d.dir.path + "/photos.backup"
        _ = try backedUp(c, dir: d.dir.path, path: path)
        let file = try DatabaseQueue(path: path)
        let changed = try file.write { db -> Int in
            try db.execute(sql: sql)
            return db.changesCount
        }
        try file.close()
        #expect(sql.hasPrefix("ALTER") || changed > 0, "the crafted edit (\(what)) changed nothing")
        expectRPCError(c, "db.restore", ["path": .string(path), "db": "crafted"], code: -32602, kind: kind)
        expectRPCError(c, "db.info", ["db": "crafted"], code: -32010, kind: "database_not_found")
        let left = try FileManager.default.contentsOfDirectory(atPath: d.dataDir + "/databases").filter { $0.hasPrefix("crafted.") }
        #expect(left.isEmpty, "\(what): \(left) left behind")
    }
}
