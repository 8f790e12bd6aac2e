import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

/// Collecting chunks (`blob.gc`, and after each compaction): a blob's chunks stay while anything a device holds refers
/// to it (a document, history, the feed), while an upload is under way, and for a grace period after they were
/// written or put again; then they go, on every device and from the folder.
@Suite(.serialized) struct BlobGCTests {
    /// The chunk ids (file names) in `db`'s chunk store under `dataDir`.
    static func chunkFiles(_ dataDir: String, _ db: String) -> Set<String> {
        Set(filesUnder(dataDir + "/databases/\(db).blobs").map { String($0.split(separator: "/").last ?? "") }.filter { !$0.hasPrefix(".") })
    }

    /// Puts `count` bytes (seeded) from a new file on `c` as a blob of `db`; returns its `blob.put` result.
    static func put(_ c: BlazeConnection, _ db: String, dir: String, _ name: String, count: Int, seed: UInt64) throws -> JSONValue {
        let file = dir + "/\(name).bin"
        #expect(FileManager.default.createFile(atPath: file, contents: Data(BlobDaemonTests().content(count, seed: seed))))
        return try c.call("blob.put", ["db": .string(db), "path": .string(file)])
    }

    /// The blob's id and the ids of its chunks (its manifest's, then its content's) as `blob.put` returned them.
    static func ids(_ put: JSONValue) -> String { put["blob"]?["id"]?.stringValue ?? "" }

    @Test func aPinnedBlobStaysWhateverRefersToItUntilUnpinned() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        _ = try c.call("db.create", ["db": "notes"])
        let pinned = try Self.put(c, "notes", dir: d.dataDir, "pinned", count: 2_000_000, seed: 4)
        let chunks = Self.chunkFiles(d.dataDir, "notes")
        _ = try c.call("blob.pin", ["db": "notes", "blob": pinned["blob"]!["id"]!])
        #expect(try c.call("blob.gc", ["db": "notes", "graceSeconds": 0])["removedChunks"] == 0)
        #expect(Self.chunkFiles(d.dataDir, "notes") == chunks)
        _ = try c.call("blob.unpin", ["db": "notes", "blob": pinned["blob"]!["id"]!])
        #expect(try c.call("blob.gc", ["db": "notes", "graceSeconds": 0])["removedChunks"] == .int(Int64(chunks.count)))
        #expect(Self.chunkFiles(d.dataDir, "notes").isEmpty)
    }

    @Test func chunksStayWhileAnythingHeldRefersToThemAndGoAfter() throws {
        // A feed of 3 events: the deleted document's old version falls out of it after a few writes.
        let d = try DaemonProcess(arguments: ["--feed-retention", "3"])
        defer { d.stop() }
        let c = try d.connect()
        _ = try c.call("db.create", ["db": "notes"])
        let kept = try Self.put(c, "notes", dir: d.dataDir, "kept", count: 3_000_000, seed: 1)
        let deleted = try Self.put(c, "notes", dir: d.dataDir, "deleted", count: 3_000_000, seed: 2)
        _ = try c.call("doc.put", ["db": "notes", "collection": "files", "id": "kept", "doc": ["file": kept["ref"]!]])
        // Nested and in a list: a reference anywhere in a document counts.
        _ = try c.call("doc.put", ["db": "notes", "collection": "files", "id": "deleted", "doc": ["a": ["b": [deleted["ref"]!]]]])
        let all = Self.chunkFiles(d.dataDir, "notes")
        let orphan = try Self.put(c, "notes", dir: d.dataDir, "orphan", count: 1_000_000, seed: 3)
        let orphanChunks = Self.chunkFiles(d.dataDir, "notes").subtracting(all)
        #expect(!orphanChunks.isEmpty && orphanChunks.contains(Self.ids(orphan)))

        // Within the grace period (one day by default) nothing goes, not even a blob nothing refers to.
        let early = try c.call("blob.gc", ["db": "notes"])
        #expect(early["removedChunks"] == 0 && early["keptChunks"] == .int(Int64(all.count + orphanChunks.count)))
        // Without one, only the blob nothing refers to goes.
        let swept = try c.call("blob.gc", ["db": "notes", "graceSeconds": 0])
        #expect(swept["removedChunks"] == .int(Int64(orphanChunks.count)))
        #expect(Self.chunkFiles(d.dataDir, "notes") == all)
        #expect(throws: (any Error).self) { try c.call("blob.stat", ["db": "notes", "blob": orphan["blob"]!["id"]!]) }

        // A deleted document's blob stays while its history holds it (the change that wrote it, its tombstone, the
        // feed), and after compaction (a database nobody shares: all of it is stable) while the feed still holds the
        // document's last version (`doc.get` at a time before the delete shows it).
        _ = try c.call("doc.delete", ["db": "notes", "collection": "files", "id": "deleted"])
        #expect(try c.call("blob.gc", ["db": "notes", "graceSeconds": 0])["removedChunks"] == 0)
        _ = try c.call("db.compact", ["db": "notes"])
        #expect(try c.call("blob.gc", ["db": "notes", "graceSeconds": 0])["removedChunks"] == 0)
        // Once the feed moved past it too and compaction ran, it goes; the other stays whole.
        for i in 0..<4 { _ = try c.call("doc.put", ["db": "notes", "collection": "other", "id": .string("o\(i)"), "doc": ["i": .int(Int64(i))]]) }
        _ = try c.call("db.compact", ["db": "notes"])
        let after = try c.call("blob.gc", ["db": "notes", "graceSeconds": 0])
        #expect(after["removedChunks"].flatMap(\.intValue) ?? 0 > 0)
        #expect(throws: (any Error).self) { try c.call("blob.stat", ["db": "notes", "blob": deleted["blob"]!["id"]!]) }
        let stat = try c.call("blob.stat", ["db": "notes", "blob": kept["blob"]!["id"]!])
        #expect(stat["heldChunks"] == stat["chunks"])
        #expect(after["keptChunks"] == .int(Int64(Self.chunkFiles(d.dataDir, "notes").count)))
        #expect(try c.call("db.info", ["db": "notes"])["blobs"] == ["chunks": after["keptChunks"]!, "bytes": after["keptBytes"]!])

        // Putting a held blob's file again renews its chunks: written an hour ago and referred to by nothing, they
        // survive a sweep with a ten-minute grace made right after (a document is about to refer to them); without
        // the put again they go.
        let before = Self.chunkFiles(d.dataDir, "notes")
        let twice = try Self.put(c, "notes", dir: d.dataDir, "twice", count: 2_000_000, seed: 6)
        let twiceChunks = Self.chunkFiles(d.dataDir, "notes").subtracting(before)
        func backdate() throws {
            for name in twiceChunks {
                let path = d.dataDir + "/databases/notes.blobs/\(name.prefix(2))/\(name)"
                try FileManager.default.setAttributes([.modificationDate: Date().addingTimeInterval(-3600)], ofItemAtPath: path)
            }
        }
        try backdate()
        #expect(Self.ids(try Self.put(c, "notes", dir: d.dataDir, "twice", count: 2_000_000, seed: 6)) == Self.ids(twice))
        #expect(try c.call("blob.gc", ["db": "notes", "graceSeconds": 600])["removedChunks"] == 0)
        try backdate()
        #expect(try c.call("blob.gc", ["db": "notes", "graceSeconds": 600])["removedChunks"] == .int(Int64(twiceChunks.count)))
        #expect(Self.chunkFiles(d.dataDir, "notes") == before)
    }

    /// A blob's chunks on two devices: a deleted document's blob stays on both while either may still need it, and
    /// leaves both once the deletion is stable (each holds the other's acknowledgement) and compacted.
    @Test func aDeletedDocumentsBlobLeavesEveryDeviceOnceItsDeletionIsStableAndCompacted() throws {
        let arguments = ["--sync-listen", "127.0.0.1:0", "--feed-retention", "3"]
        let a = try DaemonProcess(arguments: arguments), b = try DaemonProcess(arguments: arguments)
        defer {
            a.stop()
            b.stop()
        }
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        let put = try Self.put(ca, "team", dir: a.dataDir, "clip", count: 3_000_000, seed: 8)
        let id = put["blob"]!["id"]!
        _ = try ca.call("doc.put", ["db": "team", "collection": "files", "id": "clip", "doc": ["file": put["ref"]!]])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        #expect(eventually(timeout: .seconds(30)) { (try? cb.call("doc.get", ["db": "team", "collection": "files", "id": "clip"])) != nil })
        #expect(try cb.call("blob.get", ["db": "team", "blob": id, "path": .string(b.dataDir + "/clip.out")])["bytes"] == 3_000_000)
        let held = Self.chunkFiles(a.dataDir, "team")
        #expect(held.count == (put["chunks"]?.intValue).map { Int($0) + 1 }, "the blob's chunks and its manifest")
        #expect(Self.chunkFiles(b.dataDir, "team") == held)

        _ = try ca.call("doc.delete", ["db": "team", "collection": "files", "id": "clip"])
        for i in 0..<4 { _ = try ca.call("doc.put", ["db": "team", "collection": "other", "id": .string("o\(i)"), "doc": ["i": .int(Int64(i))]]) }
        #expect(try eventually { try replicaState(ca, "team") == replicaState(cb, "team") })
        // Before the deletion is stable, history holds the blob on both.
        for c in [ca, cb] { #expect(try c.call("blob.gc", ["db": "team", "graceSeconds": 0])["removedChunks"] == 0) }
        // Each compaction issues the device's acknowledgement; once each holds the other's, the deletion is stable,
        // compaction drops the history that referred to the blob, and a sweep removes its chunks on both.
        #expect(eventually(timeout: .seconds(60)) {
            for c in [cb, ca] {
                _ = try? c.call("db.compact", ["db": "team"])
                _ = try? c.call("blob.gc", ["db": "team", "graceSeconds": 0])
            }
            return Self.chunkFiles(a.dataDir, "team").isEmpty && Self.chunkFiles(b.dataDir, "team").isEmpty
        }, "a: \(Self.chunkFiles(a.dataDir, "team").count), b: \(Self.chunkFiles(b.dataDir, "team").count) chunks left")
    }

    @Test func anUploadUnderWayKeepsWhatItStored() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        _ = try c.call("db.create", ["db": "notes"])
        let upload = try c.call("blob.upload", ["db": "notes"])["upload"]!
        // 20 MB in 4 MB pieces: the writer stores the chunks it has cut while more comes.
        let bytes = BlobDaemonTests().content(20_000_000, seed: 9)
        for start in stride(from: 0, to: bytes.count, by: 4_000_000) {
            let piece = Data(bytes[start..<min(start + 4_000_000, bytes.count)]).base64EncodedString()
            _ = try c.call("blob.append", ["db": "notes", "upload": upload, "data": .string(piece)])
        }
        // Chunks are named and stored on the writer's lanes, off the append's thread: wait until some are on disk.
        #expect(eventually { !Self.chunkFiles(d.dataDir, "notes").isEmpty }, "no chunk stored while the upload is open")
        let stored = Self.chunkFiles(d.dataDir, "notes")
        #expect(!stored.isEmpty)
        #expect(try c.call("blob.gc", ["db": "notes", "graceSeconds": 0])["removedChunks"] == 0)
        let put = try c.call("blob.finish", ["db": "notes", "upload": upload])
        _ = try c.call("doc.put", ["db": "notes", "collection": "files", "id": "big", "doc": ["file": put["ref"]!]])
        #expect(try c.call("blob.gc", ["db": "notes", "graceSeconds": 0])["removedChunks"] == 0)
        #expect(Self.chunkFiles(d.dataDir, "notes").isSuperset(of: stored))
    }

    @Test func badArgumentsAreRefused() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        for (params, code) in [
            (["db": "nope"], -32010), (["db": "default", "graceSeconds": -1], -32602),
            (["db": "default", "graceSeconds": "soon"], -32602), (["db": "default", "graceSeconds": 40_000_000], -32602),
            ([:], -32602), (["db": "default", "extra": 1], -32602),
        ] as [([String: JSONValue], Int)] {
            expectRPCError(c, "blob.gc", params, code: code)
        }
        // A database that never held a blob: nothing to do, and no chunk store is made for it.
        #expect(try c.call("db.info", ["db": "default"])["blobs"] == ["chunks": 0, "bytes": 0])
        #expect(try c.call("blob.gc", ["db": "default", "graceSeconds": 0]) == [
            "removedChunks": 0, "removedBytes": 0, "keptChunks": 0, "keptBytes": 0,
        ])
        #expect(!FileManager.default.fileExists(atPath: d.dataDir + "/databases/default.blobs"))
    }

    /// Two devices meeting in a folder: a chunk a device's sweep removed leaves its `assets/` in the folder too.
    @Test func sweptChunksLeaveTheFolder() throws {
        let team = try FolderTeam(count: 2, arguments: ["--folder-poll-interval", "0.1"])
        defer { team.stopAll() }
        let folder = TempDir()
        let a = team.clients[0]
        for c in team.clients { _ = try c.call("folder.add", ["db": "team", "path": .string(folder.path)]) }
        let kept = try Self.put(a, "team", dir: team.dirs[0].path, "kept", count: 2_000_000, seed: 4)
        _ = try a.call("doc.put", ["db": "team", "collection": "files", "id": "kept", "doc": ["file": kept["ref"]!]])
        let keptChunks = Self.chunkFiles(team.daemons[0].dataDir, "team")
        let orphan = try Self.put(a, "team", dir: team.dirs[0].path, "orphan", count: 2_000_000, seed: 5)
        let everything = Self.chunkFiles(team.daemons[0].dataDir, "team")
        #expect(everything.count > keptChunks.count)
        let assets = folder.path + "/" + (try spaceOf(a)) + "/" + team.nodes[0] + "/assets"
        #expect(eventually(timeout: .seconds(30)) { Set(filesUnder(assets)) == everything })
        #expect(try a.call("blob.gc", ["db": "team", "graceSeconds": 0])["removedChunks"] == .int(Int64(everything.count - keptChunks.count)))
        #expect(eventually(timeout: .seconds(30)) { Set(filesUnder(assets)) == keptChunks }, "swept chunks stayed in the folder")
        _ = orphan
    }
}
