import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Fetches through a relay and through a shared folder cut by kill -9 (of the fetching device, or of the relay) go on
/// from where they stopped: what the fetcher stored before the cut stays, and only what it still lacked crosses.
@Suite(.serialized) struct BlobResumeTests {
    /// A blob of `bytes` put on `c` (database `team`) and referenced by document `doc`; its id and chunk count.
    func put(_ bytes: [UInt8], on c: BlazeConnection, dir: String, doc: String) throws -> (id: JSONValue, chunks: Int64) {
        let file = dir + "/\(doc).bin"
        #expect(FileManager.default.createFile(atPath: file, contents: Data(bytes)))
        let put = try c.call("blob.put", ["db": "team", "path": .string(file)])
        _ = try c.call("doc.put", ["db": "team", "collection": "files", "id": .string(doc), "doc": ["file": put["ref"]!]])
        return (try #require(put["blob"]?["id"]), try #require(put["chunks"]?.intValue))
    }

    /// `sync.status` chunk counters of `team`'s links added up.
    func received(_ c: BlazeConnection) throws -> Int64 {
        let peers = try c.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
        return peers.compactMap { $0["chunksReceived"]?.intValue }.reduce(0, +)
    }

    func held(_ c: BlazeConnection, _ id: JSONValue) throws -> Int64 {
        try #require(try c.call("blob.stat", ["db": "team", "blob": id])["heldChunks"]?.intValue)
    }

    /// Reads the blob's first 3 MB on `c` (ranged reads: the chunks they lie in are fetched and kept).
    func readTheStart(_ c: BlazeConnection, _ id: JSONValue) throws {
        for offset in stride(from: 0, to: 3_000_000, by: 1_000_000) {
            _ = try c.call("blob.read", ["db": "team", "blob": id, "offset": .int(Int64(offset)), "length": 1_000_000])
        }
    }

    /// The outcome of a `blob.get` run in a thread, once it ends.
    final class Outcome: Sendable {
        let value = Mutex<Result<JSONValue, any Error>?>(nil)
        var ended: Bool { value.withLock { $0 != nil } }
        func get() throws -> JSONValue? { try value.withLock { $0 }?.get() }
    }

    /// A `blob.get` of `id` into `out` on its own connection to `socket`, in a thread.
    func getInBackground(socket: String, _ id: JSONValue, to out: String) -> Outcome {
        let outcome = Outcome()
        Thread {
            let r = Result { try BlazeConnection(socketPath: socket, timeoutSeconds: 300).call("blob.get", ["db": "team", "blob": id, "path": .string(out)]) }
            outcome.value.withLock { $0 = r }
        }.start()
        return outcome
    }

    /// A creates `team` and B joins it through A; from then on they meet only through `relay` (A dials it, B forgets
    /// A's address and dials nothing yet).
    func meetThroughRelay(_ a: DaemonProcess, _ ca: BlazeConnection, _ b: DaemonProcess, _ cb: BlazeConnection, _ relay: RelayProcess) throws {
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        try relay.addSpace(try ca.relayCapability("team"))
        _ = try cb.call("peer.remove", ["db": "team", "address": .string(try a.syncAddress())])
        _ = try ca.call("peer.add", ["db": "team", "address": .string(relay.address)])
    }

    /// A relay on a port of its own (the same after a restart), A leaves a blob there and stops; B reaches the relay
    /// through a proxy, holds the blob's start, and its get stalls with chunks asked. Then B or the relay dies by
    /// kill -9; once both run again and the path opens, only the chunks B lacked cross, and the bytes are the file's.
    @Test(arguments: ["fetcher", "relay"])
    func aFetchFromARelayCutByAKill9GoesOnWhereItStopped(killed: String) throws {
        let listen = "127.0.0.1:\(StablePorts.next())"
        var relay = try RelayProcess(listen: listen)
        let a = try syncDaemon(), dirB = TempDir()
        var b = try syncDaemon(dir: dirB)
        let proxy = try LinkProxy(targetPort: relay.port)
        defer {
            proxy.shutdown()
            a.stop()
            b.stop()
            relay.stop()
        }
        let ca = try a.connect()
        var cb = try b.connect()
        try meetThroughRelay(a, ca, b, cb, relay)
        let bytes = BlobDaemonTests().content(12_000_000, seed: 23)
        let (id, chunks) = try put(bytes, on: ca, dir: a.dir.path, doc: "film")
        #expect(eventually(timeout: .seconds(60)) { (try? relay.count("relay_chunks")) == Int(chunks) + 1 }, "the upload")
        a.stop()
        _ = try cb.call("peer.add", ["db": "team", "address": .string("ws://127.0.0.1:\(proxy.port)/v1/sync")])
        #expect(eventually(timeout: .seconds(30)) {
            (try? cb.call("doc.get", ["db": "team", "collection": "files", "id": "film"]))?["doc"]?["file"]?["$blob"]?["id"] == id
        })
        try readTheStart(cb, id)
        try proxy.set(.stalled)
        let out = dirB.path + "/film.out"
        let finished = getInBackground(socket: b.socket, id, to: out)
        #expect(eventually(timeout: .seconds(30)) {
            ((try? cb.call("blob.stat", ["db": "team", "blob": id]))?["fetchingChunks"]?.intValue ?? 0) > 0
        }, "the get never asked for a chunk")
        if killed == "fetcher" {
            b.kill9()
            #expect(eventually(timeout: .seconds(30)) { finished.ended })
            b = try syncDaemon(dir: dirB)
            cb = try b.connect()
        } else {
            relay.killHard()
            relay = try RelayProcess(dir: relay.dir, listen: listen)
        }
        let heldAtCut = try held(cb, id)
        #expect(heldAtCut >= 1 && heldAtCut < chunks, "the cut came mid-transfer: \(heldAtCut) of \(chunks)")
        let before = try received(cb)
        try proxy.set(.open)
        if killed == "fetcher" {
            #expect(try cb.call("blob.get", ["db": "team", "blob": id, "path": .string(out + "2")])["bytes"] == 12_000_000)
            #expect(FileManager.default.contents(atPath: out + "2").map(Array.init) == bytes)
        } else {
            // B's get waited for a source; it finishes once B's link to the restarted relay is up.
            #expect(eventually(timeout: .seconds(120)) { finished.ended }, "the get never finished")
            #expect(try finished.get()?["bytes"] == 12_000_000)
            #expect(FileManager.default.contents(atPath: out).map(Array.init) == bytes)
        }
        // Only what was missing crossed (a chunk in flight at the cut may cross twice).
        let crossed = try received(cb) - before
        #expect(crossed <= chunks - heldAtCut + 4, "\(crossed) chunks for \(chunks - heldAtCut) missing")
        #expect(try held(cb, id) == chunks)
    }

    /// A's upload to a relay stops part-way (the space's chunk quota there has room for a few chunks) and A dies by
    /// kill -9. With the quota raised and A started again, A's next connection uploads only the chunks the relay lacks,
    /// and B, which never meets A, reads the blob from the relay.
    @Test func anUploadToARelayCutByAKill9GoesOnWhereItStopped() throws {
        let listen = "127.0.0.1:\(StablePorts.next())", relayDir = TempDir()
        var relay = try RelayProcess(dir: relayDir, arguments: ["--space-chunk-quota-mib", "8"], listen: listen)
        let dirA = TempDir()
        var a = try syncDaemon(dir: dirA)
        let b = try syncDaemon()
        defer {
            a.stop()
            b.stop()
            relay.stop()
        }
        var ca = try a.connect()
        let cb = try b.connect()
        try meetThroughRelay(a, ca, b, cb, relay)
        let bytes = BlobDaemonTests().content(12_000_000, seed: 31)
        let (id, chunks) = try put(bytes, on: ca, dir: dirA.path, doc: "film")
        // The relay takes what its quota has room for, then no more. A is killed once it took some (wherever the
        // upload then is: the quota keeps it from ending); what the relay holds is counted once it stopped.
        #expect(eventually(timeout: .seconds(60)) { ((try? relay.count("relay_chunks")) ?? 0) >= 1 })
        a.kill9()
        relay.stop()
        let heldAtCut = Int64(try relay.count("relay_chunks"))
        #expect(heldAtCut >= 1 && heldAtCut < chunks + 1, "the cut came mid-upload: \(heldAtCut) of \(chunks + 1)")
        relay = try RelayProcess(dir: relayDir, listen: listen)
        a = try syncDaemon(dir: dirA)
        ca = try a.connect()
        #expect(eventually(timeout: .seconds(60)) { (try? relay.count("relay_chunks")) == Int(chunks) + 1 }, "the upload never finished")
        // The restarted relay stored only what it lacked.
        // (Counted just after the store commits: waited for, and checked again at the end.)
        let missing = Int(chunks + 1 - heldAtCut)
        #expect(eventually(timeout: .seconds(30)) { RelayLimitTests.metric(relay, "blaze_relay_chunks_stored_total") == missing })
        a.stop()
        _ = try cb.call("peer.add", ["db": "team", "address": .string(relay.address)])
        #expect(eventually(timeout: .seconds(30)) {
            (try? cb.call("doc.get", ["db": "team", "collection": "files", "id": "film"]))?["doc"]?["file"]?["$blob"]?["id"] == id
        })
        let out = b.dir.path + "/film.out"
        #expect(try cb.call("blob.get", ["db": "team", "blob": id, "path": .string(out)])["bytes"] == 12_000_000)
        #expect(FileManager.default.contents(atPath: out).map(Array.init) == bytes)
        #expect(RelayLimitTests.metric(relay, "blaze_relay_chunks_stored_total") == missing)
    }

    /// Through a shared folder: B holds the blob's start, the folder lacks the rest for a while (its files moved
    /// away, as if A had not written them yet) and B's get is under way when B dies by kill -9. Once B runs again and
    /// the files are back, only the chunks B lacked are read.
    @Test func aFetchFromAFolderCutByAKill9GoesOnWhereItStopped() throws {
        var team = try FolderTeam(count: 2, arguments: ["--folder-poll-interval", "0.1"])
        defer { team.stopAll() }
        let folder = TempDir(), aside = TempDir()
        for c in team.clients { _ = try c.call("folder.add", ["db": "team", "path": .string(folder.path)]) }
        let bytes = BlobDaemonTests().content(12_000_000, seed: 29)
        let (id, chunks) = try put(bytes, on: team.clients[0], dir: team.dirs[0].path, doc: "film")
        let assets = folder.path + "/" + (try spaceOf(team.clients[0])) + "/" + team.nodes[0] + "/assets"
        #expect(eventually(timeout: .seconds(30)) { filesUnder(assets).count == Int(chunks) + 1 }, "A's assets")
        // A stops, so nothing writes its files again while they are away.
        team.daemons[0].stop()
        var cb = team.clients[1]
        #expect(eventually(timeout: .seconds(30)) {
            (try? cb.call("doc.get", ["db": "team", "collection": "files", "id": "film"]))?["doc"]?["file"]?["$blob"]?["id"] == id
        })
        try readTheStart(cb, id)
        let heldAtCut = try held(cb, id)
        #expect(heldAtCut >= 1 && heldAtCut < chunks, "B holds \(heldAtCut) of \(chunks)")
        // The files of the chunks B lacks leave the folder (B's store names the ones it holds).
        let heldByB = Set(filesUnder(team.dirs[1].path + "/data").filter { $0.contains(".blobs/") }.map { String($0.split(separator: "/").last!) })
        let away = filesUnder(assets).filter { !heldByB.contains($0) }
        #expect(away.count >= Int(chunks - heldAtCut), "\(away.count) files for \(chunks - heldAtCut) missing chunks")
        for name in away { #expect(rename(assets + "/" + name, aside.path + "/" + name) == 0) }
        let finished = getInBackground(socket: team.daemons[1].socket, id, to: team.dirs[1].path + "/film.out")
        // The get is under way (asking, or already told nobody holds the rest) when B is killed.
        #expect(eventually(timeout: .seconds(30)) {
            finished.ended || ((try? cb.call("blob.stat", ["db": "team", "blob": id]))?["fetchingChunks"]?.intValue ?? 0) > 0
        })
        team.daemons[1].kill9()
        for name in away { #expect(rename(aside.path + "/" + name, assets + "/" + name) == 0) }
        try team.restart(1)
        cb = team.clients[1]
        #expect(try held(cb, id) == heldAtCut, "what B held before the cut is still held")
        let out = team.dirs[1].path + "/film.out2"
        #expect(try cb.call("blob.get", ["db": "team", "blob": id, "path": .string(out)])["bytes"] == 12_000_000)
        #expect(FileManager.default.contents(atPath: out).map(Array.init) == bytes)
        #expect(try received(cb) == chunks - heldAtCut, "only the missing chunks were read from the folder")
    }

    /// A device writing a blob's chunks to a shared folder is cut part-way (one chunk's name is taken by a directory,
    /// so its write fails while the others land) and dies by kill -9. Started again, with the way clear, it writes only
    /// the missing chunk and one whose file was cut short meanwhile: the files it wrote whole before are the same files
    /// (same inode), and a reader gets the blob.
    @Test func writesToAFolderCutByAKill9GoOnWhereTheyStopped() throws {
        var team = try FolderTeam(count: 2, arguments: ["--folder-poll-interval", "0.1"])
        defer { team.stopAll() }
        let folder = TempDir()
        let bytes = BlobDaemonTests().content(12_000_000, seed: 37)
        let (id, chunks) = try put(bytes, on: team.clients[0], dir: team.dirs[0].path, doc: "film")
        // One of A's chunks (named by its store) cannot be written: a directory holds its name in A's `assets/`.
        let stored = filesUnder(team.dirs[0].path + "/data").filter { $0.contains(".blobs/") && !$0.contains(".tmp") }
        let blocked = try #require(stored.first.flatMap { $0.split(separator: "/").last.map(String.init) })
        let assets = folder.path + "/" + (try spaceOf(team.clients[0])) + "/" + team.nodes[0] + "/assets"
        try FileManager.default.createDirectory(atPath: assets + "/" + blocked, withIntermediateDirectories: true)
        for c in team.clients { _ = try c.call("folder.add", ["db": "team", "path": .string(folder.path)]) }
        // A's chunk files (not one being written, `ID.tmp`).
        func written() -> [String] { filesUnder(assets).filter { !$0.hasSuffix(".tmp") } }
        #expect(eventually(timeout: .seconds(30)) { written().count == Int(chunks) }, "A's other chunks: \(filesUnder(assets)) of \(chunks + 1), blocked \(blocked)")
        team.daemons[0].kill9()
        func inodes() -> [String: UInt64] {
            Dictionary(uniqueKeysWithValues: written().map { name in
                var st = stat()
                return (name, lstat(assets + "/" + name, &st) == 0 ? UInt64(st.st_ino) : 0)
            })
        }
        var before = inodes()
        #expect(rmdir(assets + "/" + blocked) == 0)
        // One file written before the cut is cut short (a failing disk): A writes it again too.
        let damaged = try #require(before.keys.sorted().first)
        var st = stat()
        #expect(lstat(assets + "/" + damaged, &st) == 0 && truncate(assets + "/" + damaged, st.st_size / 2) == 0)
        before[damaged] = nil
        try team.restart(0)
        #expect(eventually(timeout: .seconds(30)) {
            var now = stat()
            return written().count == Int(chunks) + 1 && lstat(assets + "/" + damaged, &now) == 0 && now.st_size == st.st_size
        }, "the missing and the damaged chunk")
        // Counted once the round's writes are done (just after the files appear).
        #expect(eventually(timeout: .seconds(30)) { ((try? folderStatus(team.clients[0], folder.path))?["chunksSent"]?.intValue ?? 0) >= 2 })
        #expect(try folderStatus(team.clients[0], folder.path)["chunksSent"] == 2, "A wrote only what the folder lacked: \((try? folderStatus(team.clients[0], folder.path)) ?? .null)")
        let after = inodes()
        #expect(before.allSatisfy { after[$0.key] == $0.value }, "a file written whole before the cut was written again: \(before) \(after)")
        let out = team.dirs[1].path + "/film.out"
        #expect(try team.clients[1].call("blob.get", ["db": "team", "blob": id, "path": .string(out)])["bytes"] == 12_000_000)
        #expect(FileManager.default.contents(atPath: out).map(Array.init) == bytes)
    }
}
