import BlazeClient
import BlazeProtocol
import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Blobs over the socket: put from a path or in-band, read back by range or to a file, referenced by documents.
@Suite struct BlobDaemonTests {
    /// `count` pseudo-random bytes.
    func content(_ count: Int, seed: UInt64) -> [UInt8] {
        var state = seed
        return (0..<count).map { _ in
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return UInt8(truncatingIfNeeded: state >> 33)
        }
    }

    /// The bytes of `blob` read back in-band, `step` bytes per call.
    func readAll(_ c: BlazeConnection, _ blob: JSONValue, step: Int) throws -> [UInt8] {
        var out: [UInt8] = []
        while true {
            let r = try c.call("blob.read", ["db": "default", "blob": blob, "offset": .int(Int64(out.count)), "length": .int(Int64(step))])
            guard case .string(let data) = r["data"], let bytes = Data(base64Encoded: data) else { throw RPCError(code: 0, kind: "test", message: "no data") }
            if bytes.isEmpty { return out }
            out += bytes
        }
    }

    @Test func aFilePutIsReadBackByRangeAndToAFileAndADocumentRefersToIt() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        let file = d.dir.path + "/photo.jpg"
        let bytes = content(3_000_000, seed: 1)
        #expect(FileManager.default.createFile(atPath: file, contents: Data(bytes)))
        let put = try c.call("blob.put", ["db": "default", "path": .string(file), "type": "image/jpeg"])
        let id = put["blob"]!["id"]!
        #expect(put["blob"]!["size"] == 3_000_000 && put["blob"]!["type"] == "image/jpeg")
        #expect(put["storedBytes"] == 3_000_000 && (put["chunks"]?.intValue ?? 0) >= 1)
        #expect(put["ref"] == ["$blob": put["blob"]!])
        // The same file again stores nothing and has the same id.
        let again = try c.call("blob.put", ["db": "default", "path": .string(file), "type": "image/jpeg"])
        #expect(again["blob"]!["id"] == id && again["storedBytes"] == 0)
        #expect(try readAll(c, id, step: 1_000_000) == bytes)
        let middle = try c.call("blob.read", ["db": "default", "blob": id, "offset": 1_234_567, "length": 1000])
        #expect(middle["offset"] == 1_234_567 && middle["bytes"] == 1000 && middle["size"] == 3_000_000)
        #expect(Data(base64Encoded: middle["data"]!.stringValue!).map(Array.init) == Array(bytes[1_234_567..<1_235_567]))
        let past = try c.call("blob.read", ["db": "default", "blob": id, "offset": 5_000_000])
        #expect(past["bytes"] == 0 && past["data"] == "")
        let out = d.dir.path + "/copy.jpg"
        #expect(try c.call("blob.get", ["db": "default", "blob": id, "path": .string(out)]) == ["path": .string(out), "bytes": 3_000_000])
        #expect(FileManager.default.contents(atPath: out).map(Array.init) == bytes)
        expectRPCError(c, "blob.get", ["db": "default", "blob": id, "path": .string(out)], code: -32011, kind: "file_exists")
        let stat = try c.call("blob.stat", ["db": "default", "blob": id])
        #expect(stat["size"] == 3_000_000 && stat["chunks"] == stat["heldChunks"] && stat["heldBytes"] == 3_000_000)
        // A document holds the reference; queries filter on its fields.
        _ = try c.call("doc.insert", ["db": "default", "collection": "photos", "doc": ["_id": "cat", "photo": put["ref"]!]])
        let found = try c.call("query.find", ["db": "default", "collection": "photos", "where": ["photo.$blob.size": ["$gt": 1_000_000], "photo.$blob.type": "image/jpeg"]])
        #expect(found["docs"]?.arrayValue?.count == 1)
        // Sharing keeps the keys the blob was named with: the same file still has the same id and stores nothing.
        _ = try c.call("db.share", ["db": "default"])
        let shared = try c.call("blob.put", ["db": "default", "path": .string(file), "type": "image/jpeg"])
        #expect(shared["blob"]!["id"] == id && shared["storedBytes"] == 0)
        // After a restart (SIGTERM) the blob reads back, and the keys are the same.
        c.close()
        d.stop()
        let restarted = try DaemonProcess(dir: d.dir)
        defer { restarted.stop() }
        let c2 = try restarted.connect()
        #expect(try readAll(c2, id, step: 4 << 20) == bytes)
        #expect(try c2.call("blob.put", ["db": "default", "path": .string(file)])["storedBytes"] == 0)
        // Dropping the database removes its chunks.
        let chunks = restarted.dataDir + "/databases/default.blobs"
        #expect(FileManager.default.fileExists(atPath: chunks))
        _ = try c2.call("db.drop", ["db": "default"])
        #expect(!FileManager.default.fileExists(atPath: chunks))
    }

    @Test func badInputsAreRefusedClearly() throws {
        let d = try DaemonProcess(arguments: ["--max-blob-bytes", "100000"])
        defer { d.stop() }
        let c = try d.connect()
        let dir = d.dir.path
        #expect(FileManager.default.createFile(atPath: dir + "/small", contents: Data(content(1000, seed: 2))))
        #expect(FileManager.default.createFile(atPath: dir + "/big", contents: Data(content(100_001, seed: 3))))
        #expect(symlink(dir + "/small", dir + "/link") == 0)
        #expect(mkfifo(dir + "/fifo", 0o600) == 0)
        func put(_ path: String, _ extra: [String: JSONValue] = [:]) -> [String: JSONValue] {
            ["db": "default", "path": .string(path)].merging(extra) { $1 }
        }
        expectRPCError(c, "blob.put", put("relative/path"), code: -32602, kind: "invalid_path")
        expectRPCError(c, "blob.put", put(dir + "/missing"), code: -32010, kind: "file_not_found")
        expectRPCError(c, "blob.put", put(dir + "/link"), code: -32602, kind: "invalid_path")
        expectRPCError(c, "blob.put", put(dir + "/fifo"), code: -32602, kind: "invalid_path")
        expectRPCError(c, "blob.put", put(dir), code: -32602, kind: "invalid_path")
        expectRPCError(c, "blob.put", put("/dev/zero"), code: -32602, kind: "invalid_path")
        expectRPCError(c, "blob.put", put(dir + "/big"), code: -32012, kind: "blob_too_large")
        expectRPCError(c, "blob.put", put(dir + "/small", ["type": "image/jpeg; x=1"]), code: -32602, kind: "invalid_type")
        expectRPCError(c, "blob.put", put(dir + "/small", ["type": ""]), code: -32602, kind: "invalid_type")
        expectRPCError(c, "blob.put", put(dir + "/small", ["type": 5]), code: -32602)
        expectRPCError(c, "blob.put", ["db": "nope", "path": .string(dir + "/small")], code: -32010, kind: "database_not_found")
        expectRPCError(c, "blob.put", ["db": "default"], code: -32602, kind: "invalid_params")
        expectRPCError(c, "blob.put", put(dir + "/small", ["extra": 1]), code: -32602)
        let id = try c.call("blob.put", put(dir + "/small"))["blob"]!["id"]!
        #expect(try c.call("blob.stat", ["db": "default", "blob": id])["size"] == 1000)
        let unknown = JSONValue.string(String(repeating: "ab", count: 32))
        for method in ["blob.read", "blob.stat"] {
            expectRPCError(c, method, ["db": "default", "blob": unknown], code: -32010, kind: "blob_not_found")
            expectRPCError(c, method, ["db": "default", "blob": "../../etc/passwd"], code: -32602)
            expectRPCError(c, method, ["db": "default", "blob": .string(String(repeating: "AB", count: 32))], code: -32602)
            expectRPCError(c, method, ["db": "nope", "blob": id], code: -32010, kind: "database_not_found")
            expectRPCError(c, method, ["db": "default"], code: -32602, kind: "invalid_params")
        }
        expectRPCError(c, "blob.read", ["db": "default", "blob": id, "length": 4_194_305], code: -32012, kind: "too_large")
        expectRPCError(c, "blob.read", ["db": "default", "blob": id, "offset": -1], code: -32602)
        expectRPCError(c, "blob.read", ["db": "default", "blob": id, "length": "ten"], code: -32602)
        expectRPCError(c, "blob.get", ["db": "default", "blob": id, "path": "relative"], code: -32602, kind: "invalid_path")
        expectRPCError(c, "blob.get", ["db": "default", "blob": id, "path": .string(dir + "/no/such/dir/file")], code: -32602, kind: "invalid_path")
        expectRPCError(c, "blob.get", ["db": "default", "blob": unknown, "path": .string(dir + "/out")], code: -32010, kind: "blob_not_found")
        #expect(!FileManager.default.fileExists(atPath: dir + "/out") && !FileManager.default.fileExists(atPath: dir + "/out.partial"))
    }

    @Test func anInBandUploadIsTheSameBlobAsAPutAndBelongsToItsConnection() throws {
        let d = try DaemonProcess(arguments: ["--max-blob-bytes", "2000000"])
        defer { d.stop() }
        let c = try d.connect()
        let other = try d.connect()
        let bytes = content(1_500_000, seed: 4)
        let upload = try c.call("blob.upload", ["db": "default", "type": "audio/ogg"])["upload"]!
        var sent = 0
        for size in [1, 700_000, 299_999, 500_000] {
            let r = try c.call("blob.append", ["db": "default", "upload": upload, "data": .string(Data(bytes[sent..<(sent + size)]).base64EncodedString())])
            sent += size
            #expect(r["size"] == .int(Int64(sent)))
        }
        // Another connection cannot touch it; bad data is refused without ending it.
        expectRPCError(other, "blob.append", ["db": "default", "upload": upload, "data": "AAAA"], code: -32010, kind: "upload_not_found")
        expectRPCError(other, "blob.finish", ["db": "default", "upload": upload], code: -32010, kind: "upload_not_found")
        expectRPCError(c, "blob.append", ["db": "default", "upload": upload, "data": "not base64!"], code: -32602, kind: "invalid_data")
        expectRPCError(c, "blob.append", ["db": "default", "upload": upload, "data": .string(String(repeating: "A", count: 5_600_000))], code: -32012, kind: "too_large")
        let finished = try c.call("blob.finish", ["db": "default", "upload": upload])
        #expect(finished["blob"]!["size"] == 1_500_000 && finished["blob"]!["type"] == "audio/ogg")
        #expect(try readAll(c, finished["blob"]!["id"]!, step: 4 << 20) == bytes)
        expectRPCError(c, "blob.finish", ["db": "default", "upload": upload], code: -32010, kind: "upload_not_found")
        // The same bytes put from a file: the same blob, nothing stored again.
        let file = d.dir.path + "/same"
        #expect(FileManager.default.createFile(atPath: file, contents: Data(bytes)))
        let put = try c.call("blob.put", ["db": "default", "path": .string(file)])
        #expect(put["blob"]!["id"] == finished["blob"]!["id"] && put["storedBytes"] == 0)
        // Limits: the blob's size, and uploads open per connection.
        let big = try c.call("blob.upload", ["db": "default"])["upload"]!
        _ = try c.call("blob.append", ["db": "default", "upload": big, "data": .string(Data(bytes).base64EncodedString())])
        expectRPCError(c, "blob.append", ["db": "default", "upload": big, "data": .string(Data(bytes).base64EncodedString())], code: -32012, kind: "blob_too_large")
        // A failed append ends its upload: nothing more is appended to a blob that lost bytes.
        expectRPCError(c, "blob.append", ["db": "default", "upload": big, "data": "AAAA"], code: -32010, kind: "upload_not_found")
        expectRPCError(c, "blob.finish", ["db": "default", "upload": big], code: -32010, kind: "upload_not_found")
        let open = try (0..<4).map { _ in try c.call("blob.upload", ["db": "default"])["upload"]! }
        expectRPCError(c, "blob.upload", ["db": "default"], code: -32012, kind: "too_many_uploads")
        // An aborted upload frees its slot at once; only its own connection may abort it, once.
        expectRPCError(other, "blob.abort", ["db": "default", "upload": open[0]], code: -32010, kind: "upload_not_found")
        #expect(try c.call("blob.abort", ["db": "default", "upload": open[0]]) == ["aborted": true])
        expectRPCError(c, "blob.abort", ["db": "default", "upload": open[0]], code: -32010, kind: "upload_not_found")
        expectRPCError(c, "blob.append", ["db": "default", "upload": open[0], "data": "AAAA"], code: -32010, kind: "upload_not_found")
        expectRPCError(c, "blob.abort", ["db": "default"], code: -32602, kind: "invalid_params")
        expectRPCError(c, "blob.abort", ["db": "nope", "upload": open[1]], code: -32010, kind: "database_not_found")
        _ = try c.call("blob.upload", ["db": "default"])
        expectRPCError(c, "blob.upload", ["db": "default"], code: -32012, kind: "too_many_uploads")
        // The limit is per connection: another connection may open its own.
        _ = try other.call("blob.upload", ["db": "default"])
        expectRPCError(c, "blob.upload", ["db": "default", "type": "bad type"], code: -32602, kind: "invalid_type")
        expectRPCError(c, "blob.upload", ["db": "nope"], code: -32010, kind: "database_not_found")
        expectRPCError(c, "blob.append", ["db": "default", "upload": "u999", "data": "AAAA"], code: -32010, kind: "upload_not_found")
        expectRPCError(c, "blob.append", ["db": "default", "upload": upload], code: -32602, kind: "invalid_params")
        expectRPCError(c, "blob.finish", ["db": "default"], code: -32602, kind: "invalid_params")
    }

    @Test func blazectlPutsStatsAndGetsABlob() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        var env = isolatedEnvironment(config: d.dir.path + "/config")
        env["BLAZEDB_SOCKET"] = d.socket
        let file = d.dir.path + "/notes.pdf"
        let bytes = content(700_000, seed: 9)
        #expect(FileManager.default.createFile(atPath: file, contents: Data(bytes)))
        let ctl = buildDirectory + "/blazectl"
        let put = try run(ctl, ["blob", "put", "default", file, "--type", "application/pdf", "--json"], environment: env)
        #expect(put.status == 0, "\(put.err)")
        let result = try JSONParser().parse(put.out)
        let id = result["blob"]!["id"]!.stringValue!
        #expect(result["blob"]!["type"] == "application/pdf" && result["blob"]!["size"] == 700_000)
        let human = try run(ctl, ["blob", "put", "default", file], environment: env)
        #expect(human.out.hasPrefix("stored \(file) as blob \(id): 683.6 KiB") && human.out.contains("0 B new"), "\(human.out)")
        #expect(human.out.contains("reference: {\"$blob\":"), "\(human.out)")
        let stat = try run(ctl, ["blob", "stat", "default", id], environment: env)
        #expect(stat.out.hasPrefix("blob \(id): 683.6 KiB in ") && stat.out.contains("held here (683.6 KiB)"), "\(stat.out)")
        let out = d.dir.path + "/back.pdf"
        let get = try run(ctl, ["blob", "get", "default", id, out], environment: env)
        #expect(get.status == 0 && get.out == "wrote \(out): 683.6 KiB\n", "\(get.out) \(get.err)")
        #expect(FileManager.default.contents(atPath: out).map(Array.init) == bytes)
        let again = try run(ctl, ["blob", "get", "default", id, out], environment: env)
        #expect(again.status == 1 && again.err.hasPrefix("blazectl: error: ") && again.err.contains("file_exists"), "\(again.err)")
        // Listed (not referred to by a document: pinned), pinned and unpinned; the policy shown and set.
        #expect(try run(ctl, ["blob", "ls", "default"], environment: env).out == "no blobs\n")
        #expect(try run(ctl, ["blob", "pin", "default", id], environment: env).out == "pinned blob \(id)\n")
        let listed = try run(ctl, ["blob", "ls", "default"], environment: env)
        #expect(listed.out.hasPrefix("\(id)  683.6 KiB  -  ") && listed.out.hasSuffix(" chunks here  pinned\n"), "\(listed.out)")
        #expect(try run(ctl, ["blob", "unpin", "default", id], environment: env).out == "unpinned blob \(id)\n")
        let policy = try run(ctl, ["blob", "policy", "default", "--eager", "photos,scans"], environment: env)
        #expect(policy.out == "eager: photos, scans; largest fetched eagerly: any size\n", "\(policy.out) \(policy.err)")
        let bounded = try run(ctl, ["blob", "policy", "default", "--max-bytes", "1048576"], environment: env)
        #expect(bounded.out == "eager: photos, scans; largest fetched eagerly: 1.0 MiB\n", "\(bounded.out) \(bounded.err)")
        #expect(try run(ctl, ["blob", "policy", "default", "--eager", "none"], environment: env).out.hasPrefix("eager: none;"))
        let unknown = try run(ctl, ["blob", "stat", "default", "nothex"], environment: env)
        #expect(unknown.status == 1 && unknown.err.contains("invalid_blob") && unknown.err.split(separator: "\n").count == 1, "\(unknown.err)")
        // Nothing refers to the blob: within the grace period it stays, without one it goes.
        let kept = try run(ctl, ["blob", "gc", "default"], environment: env)
        #expect(kept.status == 0 && kept.out.hasPrefix("removed 0 chunks (0 B); "), "\(kept.out) \(kept.err)")
        let gc = try run(ctl, ["blob", "gc", "default", "--grace", "0", "--json"], environment: env)
        #expect(try JSONParser().parse(gc.out)["keptChunks"] == 0, "\(gc.out) \(gc.err)")
        #expect(try run(ctl, ["blob", "gc", "default", "--grace", "-5"], environment: env).status != 0)
    }

    @Test func writesAndQueriesAreAnsweredWhileTwoLongPutsRun() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        // Two files of 192 MiB of random bytes: each put takes seconds in a debug build (chunking and naming every
        // byte, a synced file per chunk), far longer than a write.
        var files: [String] = []
        for k in 0..<2 {
            let file = d.dir.path + "/big-\(k)"
            let r = try run("/bin/sh", ["-c", "head -c 201326592 /dev/urandom > '\(file)'"])
            #expect(r.status == 0, "\(r.err)")
            files.append(file)
        }
        let done = Mutex<[Bool]>([false, false])
        let failures = Mutex<[String]>([])
        let group = DispatchGroup()
        for (k, file) in files.enumerated() {
            // Used by its thread alone from here on.
            nonisolated(unsafe) let c = try d.connect()
            group.enter()
            Thread {
                defer { group.leave() }
                do {
                    _ = try c.call("blob.put", ["db": "default", "path": .string(file)])
                } catch {
                    failures.withLock { $0.append("\(error)") }
                }
                done.withLock { $0[k] = true }
            }.start()
        }
        // Once both puts are storing chunks (their first chunk files appear), a write and a query are answered
        // before either put ends: the puts hold the transfer pool, not the I/O pool.
        let chunks = d.dataDir + "/databases/default.blobs"
        let deadline = Date().addingTimeInterval(120)
        func chunkFiles() -> Int {
            ((try? FileManager.default.contentsOfDirectory(atPath: chunks)) ?? []).reduce(0) { n, shard in
                n + ((try? FileManager.default.contentsOfDirectory(atPath: chunks + "/" + shard))?.count ?? 0)
            }
        }
        while chunkFiles() < 4 && Date() < deadline && !done.withLock({ $0.contains(true) }) { usleep(2000) }
        let c = try d.connect()
        // tx.commit and db.info run on the I/O pool (a single-document write may commit on the event loop).
        for i in 0..<20 {
            _ = try c.call("tx.commit", ["db": "default", "ops": [["op": "insert", "collection": "c", "doc": ["_id": .string("d\(i)"), "n": .int(Int64(i))]]]])
        }
        #expect(try c.call("db.info", ["db": "default"])["documents"] == 20)
        let answeredDuringPuts = done.withLock { !$0.contains(true) }
        group.wait()
        #expect(failures.withLock { $0 }.isEmpty)
        #expect(answeredDuringPuts, "the writes waited for a put to end")
    }
}
