import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Synchronization
import Testing

/// Blobs between devices: a blob put on one device is fetched by another when read, over a peer link in either
/// direction, and a fetch cut off by a crash resumes without starting over.
@Suite(.serialized) struct BlobSyncTests {
    /// Two members of one space, the holder A and the reader B, with only `dialer` dialing the other (directly, or
    /// through `proxy` when given one in front of the other's port).
    struct Pair {
        let a: RestartingDaemon, b: RestartingDaemon
        let ca: BlazeConnection, cb: BlazeConnection

        static func make(bDials: Bool, proxy: ((RestartingDaemon) throws -> LinkProxy)? = nil) throws -> (Pair, LinkProxy?) {
            let a = try RestartingDaemon(), b = try RestartingDaemon()
            let ca = try a.connect(), cb = try b.connect()
            _ = try ca.call("db.create", ["db": "notes"])
            _ = try cb.call("db.join", ["token": .string(try ca.invite("notes")), "db": "notes"])
            _ = try cb.call("peer.remove", ["db": "notes", "address": .string(a.address)])
            let (dialer, target) = bDials ? (cb, a) : (ca, b)
            let link = try proxy?(target)
            _ = try dialer.call("peer.add", ["db": "notes", "address": .string(link.map { "127.0.0.1:\($0.port)" } ?? target.address)])
            return (Pair(a: a, b: b, ca: ca, cb: cb), link)
        }

        private init(a: RestartingDaemon, b: RestartingDaemon, ca: BlazeConnection, cb: BlazeConnection) {
            (self.a, self.b, self.ca, self.cb) = (a, b, ca, cb)
        }

        func stop() {
            a.stop(kill9: false)
            b.stop(kill9: false)
        }
    }

    /// Writes `bytes` to a new file in `dir` and puts it on `c` as a blob referenced by document `doc`; returns the
    /// blob id and its chunk count.
    func put(_ bytes: [UInt8], on c: BlazeConnection, dir: String, doc: String) throws -> (id: JSONValue, chunks: Int) {
        let file = dir + "/\(doc).bin"
        #expect(FileManager.default.createFile(atPath: file, contents: Data(bytes)))
        let put = try c.call("blob.put", ["db": "notes", "path": .string(file), "type": "video/mp4"])
        _ = try c.call("doc.put", ["db": "notes", "collection": "files", "id": .string(doc), "doc": ["file": put["ref"]!]])
        return (put["blob"]!["id"]!, try #require(put["chunks"]?.intValue.map { Int($0) }))
    }

    /// Waits until `c` holds document `doc` and returns its blob id.
    func awaitReference(_ c: BlazeConnection, doc: String) throws -> JSONValue {
        var ref: JSONValue?
        #expect(eventually(timeout: .seconds(30)) {
            ref = (try? c.call("doc.get", ["db": "notes", "collection": "files", "id": .string(doc)]))?["doc"]?["file"]?["$blob"]?["id"]
            return ref != nil
        }, "document \(doc) never arrived")
        return try #require(ref)
    }

    /// `sync.status` counters of `db`'s peers added up.
    func chunkCounters(_ c: BlazeConnection) throws -> (sent: Int64, received: Int64, bytes: Int64, rejected: Int) {
        let peers = try c.call("sync.status", ["db": "notes"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
        return peers.reduce((0, 0, 0, 0)) { t, p in
            (t.0 + (p["chunksSent"]?.intValue ?? 0), t.1 + (p["chunksReceived"]?.intValue ?? 0),
             t.2 + (p["chunkBytesReceived"]?.intValue ?? 0), t.3 + (p["rejected"]?.objectValue?.count ?? 0))
        }
    }

    @Test(arguments: [true, false])
    func aBlobPutOnOneDeviceIsFetchedByAnotherWhenRead(readerDials: Bool) throws {
        let (pair, _) = try Pair.make(bDials: readerDials)
        defer { pair.stop() }
        let bytes = BlobDaemonTests().content(6_000_000, seed: 7)
        let (id, chunks) = try put(bytes, on: pair.ca, dir: pair.a.dir.path, doc: "clip")
        #expect(try awaitReference(pair.cb, doc: "clip") == id)
        // The reference synced; the content did not: B fetches the manifest to answer `stat`, and no chunk.
        let stat = try pair.cb.call("blob.stat", ["db": "notes", "blob": id])
        #expect(stat["size"] == 6_000_000 && stat["chunks"] == .int(Int64(chunks)) && stat["heldChunks"] == 0)
        // A ranged read fetches the chunks it covers.
        let middle = try pair.cb.call("blob.read", ["db": "notes", "blob": id, "offset": 2_500_000, "length": 1000])
        #expect(Data(base64Encoded: middle["data"]?.stringValue ?? "").map(Array.init) == Array(bytes[2_500_000..<2_501_000]))
        let partly = try pair.cb.call("blob.stat", ["db": "notes", "blob": id])["heldChunks"]?.intValue ?? 0
        #expect(partly >= 1 && partly < Int64(chunks) || chunks == 1)
        // A get to a path that exists (or its `.partial`), in no directory, or with no room for `.partial` in its name, is
        // refused before anything is fetched.
        let taken = pair.b.dir.path + "/taken"
        #expect(FileManager.default.createFile(atPath: taken, contents: Data()))
        expectRPCError(pair.cb, "blob.get", ["db": "notes", "blob": id, "path": .string(taken)], code: -32011, kind: "file_exists")
        #expect(FileManager.default.createFile(atPath: taken + "2.partial", contents: Data()))
        expectRPCError(pair.cb, "blob.get", ["db": "notes", "blob": id, "path": .string(taken + "2")], code: -32011, kind: "file_exists")
        for bad in ["/none/x", "/dir/", "/" + String(repeating: "n", count: 250)] {
            expectRPCError(pair.cb, "blob.get", ["db": "notes", "blob": id, "path": .string(pair.b.dir.path + bad)], code: -32602, kind: "invalid_path")
        }
        #expect(try pair.cb.call("blob.stat", ["db": "notes", "blob": id])["heldChunks"] == .int(partly))
        // A get fetches the rest.
        let out = pair.b.dir.path + "/clip.out"
        #expect(try pair.cb.call("blob.get", ["db": "notes", "blob": id, "path": .string(out)])["bytes"] == 6_000_000)
        #expect(FileManager.default.contents(atPath: out).map(Array.init) == bytes)
        #expect(try pair.cb.call("blob.stat", ["db": "notes", "blob": id])["heldChunks"] == .int(Int64(chunks)))
        // Each chunk crossed once (the manifest is one more), and nothing was refused.
        let (_, received, contentBytes, rejected) = try chunkCounters(pair.cb)
        #expect(received == Int64(chunks) + 1 && contentBytes > 6_000_000 && rejected == 0)
        #expect(try chunkCounters(pair.ca).sent == Int64(chunks) + 1)
        // A blob no device holds is not found, at once.
        let unknown = String(repeating: "ab", count: 32)
        expectRPCError(pair.cb, "blob.stat", ["db": "notes", "blob": .string(unknown)], code: -32010, kind: "blob_not_found")
        expectRPCError(pair.cb, "blob.read", ["db": "notes", "blob": .string(unknown)], code: -32010, kind: "blob_not_found")
    }

    /// The fetching device (B) or the holding one (A) dies by kill -9 in the middle of a get: once both run again,
    /// the get finishes with only the chunks B still lacked crossing, and the bytes are the file's.
    @Test(arguments: ["fetcher", "holder"])
    func aFetchCutByAKill9ResumesWhereItStopped(killed: String) throws {
        let (pair, proxyOrNil) = try Pair.make(bDials: true) { try LinkProxy(targetPort: $0.port) }
        let proxy = try #require(proxyOrNil)
        defer {
            proxy.shutdown()
            pair.stop()
        }
        let bytes = BlobDaemonTests().content(12_000_000, seed: 11)
        let (id, chunks) = try put(bytes, on: pair.ca, dir: pair.a.dir.path, doc: "film")
        #expect(try awaitReference(pair.cb, doc: "film") == id)
        // B reads the first 3 MB: it holds the chunks they lie in, and lacks the rest.
        for offset in stride(from: 0, to: 3_000_000, by: 1_000_000) {
            _ = try pair.cb.call("blob.read", ["db": "notes", "blob": id, "offset": .int(Int64(offset)), "length": 1_000_000])
        }
        let out = pair.b.dir.path + "/film.out"
        // The path stalls; a get starts on its own connection and asks for the rest, which cannot arrive.
        try proxy.set(.stalled)
        let socket = pair.b.socket
        let finished = Mutex<Result<JSONValue, any Error>?>(nil)
        let thread = Thread {
            let r = Result {
                try BlazeConnection(socketPath: socket, timeoutSeconds: 300).call("blob.get", ["db": "notes", "blob": id, "path": .string(out)])
            }
            finished.withLock { $0 = r }
        }
        thread.start()
        #expect(eventually(timeout: .seconds(30)) {
            ((try? pair.cb.call("blob.stat", ["db": "notes", "blob": id]))?["fetchingChunks"]?.intValue ?? 0) > 0
        }, "the get never asked for a chunk")
        // The file is written unnamed until it is whole: nothing shows at its path or beside it meanwhile.
        #expect(!FileManager.default.fileExists(atPath: out) && !FileManager.default.fileExists(atPath: out + ".partial"))
        if killed == "fetcher" {
            pair.b.stop(kill9: true)
            #expect(eventually(timeout: .seconds(30)) { finished.withLock { $0 != nil } })
            try pair.b.start()
        } else {
            pair.a.stop(kill9: true)
            try pair.a.start()
        }
        let cb = try pair.b.connect()
        let held = try #require(try cb.call("blob.stat", ["db": "notes", "blob": id])["heldChunks"]?.intValue)
        #expect(held >= 1 && held < Int64(chunks), "the cut came mid-transfer: \(held) of \(chunks)")
        let before = try chunkCounters(cb).received
        try proxy.set(.open)
        if killed == "fetcher" {
            // B's get died with it and left nothing behind; asked again for the same path, it fetches only what B
            // still lacks.
            #expect(!FileManager.default.fileExists(atPath: out) && !FileManager.default.fileExists(atPath: out + ".partial"))
            #expect(try cb.call("blob.get", ["db": "notes", "blob": id, "path": .string(out)])["bytes"] == 12_000_000)
            #expect(FileManager.default.contents(atPath: out).map(Array.init) == bytes)
        } else {
            // B's get was waiting for a source; it finishes once the link is back.
            #expect(eventually(timeout: .seconds(120)) { finished.withLock { $0 != nil } }, "the get never finished")
            #expect(try finished.withLock { $0 }?.get()["bytes"] == 12_000_000)
            #expect(FileManager.default.contents(atPath: out).map(Array.init) == bytes)
        }
        let after = try chunkCounters(cb).received
        // Only what was missing crossed (a chunk in flight at the cut may cross twice).
        #expect(after - before <= Int64(chunks) - held + 4, "\(after - before) chunks for \(Int64(chunks) - held) missing")
        #expect(try cb.call("blob.stat", ["db": "notes", "blob": id])["heldChunks"] == .int(Int64(chunks)))
    }

    /// Two devices that meet only in a shared folder: a blob put on A is written there sealed (no plaintext of it in
    /// any file), and B reads it from there; each chunk is written once however many devices hold it.
    @Test func aBlobTravelsThroughASharedFolderSealed() throws {
        let team = try FolderTeam(count: 2, arguments: ["--folder-poll-interval", "0.1"])
        defer { team.stopAll() }
        let folder = TempDir()
        let (a, b) = (team.clients[0], team.clients[1])
        for c in team.clients { _ = try c.call("folder.add", ["db": "team", "path": .string(folder.path)]) }
        // A marker repeated through the file: its plaintext must appear in no file of the folder.
        let marker = Array("PLAINTEXT-MARKER-7f3a".utf8)
        var bytes = BlobDaemonTests().content(3_000_000, seed: 5)
        for i in stride(from: 0, to: bytes.count - marker.count, by: 4096) { bytes.replaceSubrange(i..<(i + marker.count), with: marker) }
        let file = team.dirs[0].path + "/doc.bin"
        #expect(FileManager.default.createFile(atPath: file, contents: Data(bytes)))
        let put = try a.call("blob.put", ["db": "team", "path": .string(file)])
        let id = put["blob"]!["id"]!
        let chunks = try #require(put["chunks"]?.intValue)
        _ = try a.call("doc.put", ["db": "team", "collection": "files", "id": "doc", "doc": ["file": put["ref"]!]])
        #expect(eventually { (try? b.call("doc.get", ["db": "team", "collection": "files", "id": "doc"])) != nil })
        // A writes the manifest and every chunk to its own assets directory.
        let assets = folder.path + "/" + (try spaceOf(a)) + "/" + team.nodes[0] + "/assets"
        #expect(eventually(timeout: .seconds(30)) { filesUnder(assets).count == Int(chunks) + 1 })
        let out = team.dirs[1].path + "/doc.out"
        #expect(try b.call("blob.get", ["db": "team", "blob": id, "path": .string(out)])["bytes"] == 3_000_000)
        #expect(FileManager.default.contents(atPath: out).map(Array.init) == bytes)
        let link = try folderStatus(b, folder.path)
        #expect(link["chunksReceived"] == .int(chunks + 1) && link["rejected"] == [:])
        // B holds them now too, and writes none of them again (over several of its once-a-second looks).
        let bAssets = folder.path + "/" + (try spaceOf(b)) + "/" + team.nodes[1] + "/assets"
        #expect(eventually(quiet: .milliseconds(3_000), limit: .seconds(30)) { (filesUnder(bAssets).count, holds: true) })
        #expect(filesUnder(bAssets).isEmpty)
        #expect(!folderText(folder.path).contains("PLAINTEXT-MARKER-7f3a"))
    }
}
