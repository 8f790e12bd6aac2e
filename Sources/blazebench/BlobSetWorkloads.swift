import BlazeClient
import BlazeProtocol
import BlazeStore
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// BLOB, what crosses between devices: an edit inside a large file (B6), and a photo library's first sync with its
/// blobs fetched eagerly against the same documents without blobs (B7). Both between two daemons in this process over
/// a loopback peer link.
enum BlobSetWorkloads {
    /// Chunk bytes `db`'s peers sent `daemon` so far (sealed: what crossed the link, less framing).
    static func received(_ daemon: Workloads.LocalDaemon, _ db: BlazeDatabase) -> Int64 {
        daemon.daemon.sync.status(db: db).reduce(0) { $0 + Int64($1.chunkBytesReceived) }
    }

    /// Two daemons sharing a new database `name`, B joined through A and linked to it; returns B's handle.
    static func pair(_ a: Workloads.LocalDaemon, _ b: Workloads.LocalDaemon, name: String) throws -> (BlazeDatabase, BlazeDatabase) {
        let db = try a.daemon.store.create(name)
        let joined = try b.daemon.sync.join(token: try invite(a, db), name: name)
        try SyncWorkloads.waitUntil("BLOB: B's link to A") { b.daemon.sync.status(db: joined).contains { $0.connected } }
        return (db, joined)
    }

    /// B6: a file of `megabytes` MiB put on A and read on B; then 1 MiB in its middle rewritten, put again and read
    /// again: the share of the file B received the second time.
    static func edit(dir: String, megabytes: Int) async throws -> [Result] {
        let work = dir + "/blob-edit"
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: work) }
        let (source, edited) = (work + "/source", work + "/edited")
        try BlobWorkloads.writeRandomFile(source, bytes: megabytes << 20)
        let a = try await Workloads.LocalDaemon(dir: work + "/a", syncListen: "127.0.0.1:0")
        let b = try await Workloads.LocalDaemon(dir: work + "/b")
        let ca = try BlazeConnection(socketPath: a.socket, timeoutSeconds: 600)
        let cb = try BlazeConnection(socketPath: b.socket, timeoutSeconds: 600)
        let (_, joined) = try pair(a, b, name: "b6")
        let first = try ca.call("blob.put", ["db": "b6", "path": .string(source)])
        _ = try cb.call("blob.get", ["db": "b6", "blob": first["blob"]!["id"]!, "path": .string(work + "/out-1")])
        let before = received(b, joined)
        // The same file with 1 MiB in the middle rewritten.
        _ = try BlobWorkloads.shell("cp '\(source)' '\(edited)'")
        var patch = [UInt8](repeating: 0, count: 1 << 20)
        for i in patch.indices { patch[i] = UInt8.random(in: 0...255) }
        guard let handle = FileHandle(forWritingAtPath: edited) else { throw BenchFailure("B6: cannot open the edited file") }
        try handle.seek(toOffset: UInt64(megabytes << 19))
        handle.write(Data(patch))
        try handle.close()
        let second = try ca.call("blob.put", ["db": "b6", "path": .string(edited)])
        _ = try cb.call("blob.get", ["db": "b6", "blob": second["blob"]!["id"]!, "path": .string(work + "/out-2")])
        guard FileManager.default.contentsEqual(atPath: work + "/out-2", andPath: edited) else { throw BenchFailure("B6: the edited blob differs") }
        let crossed = Double(received(b, joined) - before)
        let size = Double(megabytes << 20)
        await b.stop()
        await a.stop()
        return [
            Result(
                name: "B6.editTransfer", unit: "%", samples: [crossed / size * 100], better: "lower", target: "≤ 3 %",
                note: "1 MiB rewritten in the middle of a \(megabytes) MiB file, put again on A and read on B: chunk bytes B received "
                    + "(sealed), as a share of the file; A stored \(second["storedBytes"]?.intValue ?? -1) new bytes"),
        ]
    }

    /// B7: `photos` documents of photo metadata, each with a 3 MB JPEG-sized blob, on A; B joins with every blob
    /// fetched eagerly (`blob.policy`), timed until it holds them all, against the same documents without blobs.
    static func photos(dir: String, photos: Int) async throws -> [Result] {
        let work = dir + "/blob-photos"
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: work) }
        let bytes = 3_000_000
        var timings: [String: Double] = [:]
        for withBlobs in [false, true] {
            let a = try await Workloads.LocalDaemon(dir: work + "/a-\(withBlobs)", syncListen: "127.0.0.1:0")
            let b = try await Workloads.LocalDaemon(dir: work + "/b-\(withBlobs)")
            let ca = try BlazeConnection(socketPath: a.socket, timeoutSeconds: 600)
            let cb = try BlazeConnection(socketPath: b.socket, timeoutSeconds: 600)
            let db = try a.daemon.store.create("b7")
            let file = work + "/photo.jpg"
            var total: Int64 = 0
            for i in 0..<photos {
                var doc: [String: JSONValue] = [
                    "title": .string("IMG_\(10_000 + i)"), "takenAt": .int(1_700_000_000_000 + Int64(i) * 60_000),
                    "camera": "Pixel 9", "width": 4032, "height": 3024, "tags": ["holiday", "beach"],
                ]
                if withBlobs {
                    // A new random file each time: no two photos share a chunk.
                    try BlobWorkloads.writeRandomFile(file, bytes: bytes)
                    let put = try ca.call("blob.put", ["db": "b7", "path": .string(file), "type": "image/jpeg"])
                    guard let size = put["blob"]?["size"]?.intValue, size == Int64(bytes) else { throw BenchFailure("B7: a photo put went wrong") }
                    total += size
                    doc["image"] = put["ref"]
                    unlink(file)
                }
                _ = try ca.call("doc.put", ["db": "b7", "collection": "photos", "id": .string("p\(i)"), "doc": .object(doc)])
            }
            let started = ContinuousClock.now
            let joined = try b.daemon.sync.join(token: try invite(a, db), name: "b7")
            if withBlobs { _ = try cb.call("blob.policy", ["db": "b7", "eager": ["*"]]) }
            // Looked at every 20 ms (db.info lists the chunk store: not every 2 ms as other waits do).
            let deadline = Date().addingTimeInterval(900)
            while true {
                let docs = try cb.call("query.count", ["db": "b7", "collection": "photos", "where": [:]])["count"]?.intValue
                let held = withBlobs ? try cb.call("db.info", ["db": "b7"])["blobs"]?["bytes"]?.intValue ?? 0 : total
                if docs == Int64(photos), held >= total { break }
                guard Date() < deadline else { throw BenchFailure("B7: B did not hold every photo within 15 minutes") }
                usleep(20_000)
            }
            _ = joined
            let d = ContinuousClock.now - started
            timings["\(withBlobs)"] = Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
            await b.stop()
            await a.stop()
        }
        let docsOnly = timings["false"]!, withBlobs = timings["true"]!
        let mib = Double(photos) * Double(bytes) / Double(1 << 20)
        return [
            Result(
                name: "B7.photosDocsOnly", unit: "s", samples: [docsOnly], better: "lower",
                note: "\(photos) photo documents, no blobs: B joins A and holds them all"),
            Result(
                name: "B7.photosWithBlobs", unit: "s", samples: [withBlobs], better: "lower", baseline: "B7.photosDocsOnly",
                note: "the same with a 3 MB blob each (\(String(format: "%.0f", mib)) MiB), B fetching every blob eagerly: "
                    + String(format: "%.0f MiB/s of blobs", mib / withBlobs)),
        ]
    }
}
