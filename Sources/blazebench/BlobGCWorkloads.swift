import BlazeClient
import BlazeProtocol
import BlazeStore
import Foundation
import Synchronization

/// BLOB.gc (B9): what collecting chunks costs the writes that go on meanwhile. A daemon in this process holds
/// `documents` documents, one in ten referring to a blob, and a blob nothing refers to; `blob.gc` runs while a second
/// client makes durable single inserts, each timed. Before the sweep read its references from a snapshot, every write
/// waited for the whole sweep.
enum BlobGCWorkloads {
    static func run(dir: String, documents: Int) async throws -> [Result] {
        let work = dir + "/blob-gc"
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: work) }
        let daemon = try await Workloads.LocalDaemon(dir: work + "/d")
        let c = try BlazeConnection(socketPath: daemon.socket, timeoutSeconds: 600)
        let db = try daemon.daemon.store.create("b9")
        let file = work + "/blob"
        try BlobWorkloads.writeRandomFile(file, bytes: 4 << 20)
        let kept = try c.call("blob.put", ["db": "b9", "path": .string(file)])
        try BlobWorkloads.writeRandomFile(file, bytes: 4 << 20)
        let orphan = try c.call("blob.put", ["db": "b9", "path": .string(file)])
        guard let ref = kept["ref"], orphan["blob"] != nil else { throw BenchFailure("B9: blob.put answered \(kept)") }
        for start in stride(from: 0, to: documents, by: 1000) {
            _ = try db.commit((start..<min(documents, start + 1000)).map { i in
                var doc: [String: JSONValue] = ["_id": .string("d\(i)"), "title": .string("document \(i) of the library"), "n": .int(Int64(i))]
                if i % 10 == 0 { doc["file"] = ref }
                return .insert(collection: "files", doc: doc)
            })
        }
        // A writer on its own connection, timing each insert until the sweep has ended.
        let log = WriterLog()
        let socket = daemon.socket
        let writer = Thread {
            guard let w = try? BlazeConnection(socketPath: socket, timeoutSeconds: 600) else { return }
            var i = 0
            while !log.done.load(ordering: .acquiring) {
                let t = seconds { _ = try? w.call("doc.insert", ["db": "b9", "collection": "w", "doc": ["n": .int(Int64(i))]]) }
                log.latencies.withLock { $0.append(t) }
                i += 1
            }
        }
        writer.start()
        try SyncWorkloads.waitUntil("B9: the writer's first insert") { log.latencies.withLock { !$0.isEmpty } }
        let before = log.latencies.withLock { $0.count }
        var swept: JSONValue = .null
        let sweep = try seconds { swept = try c.call("blob.gc", ["db": "b9", "graceSeconds": 0]) }
        let during = log.latencies.withLock { $0.count }
        log.done.store(true, ordering: .releasing)
        try SyncWorkloads.waitUntil("B9: the writer ends") { writer.isFinished }
        await daemon.stop()
        guard swept["removedChunks"]?.intValue ?? 0 > 0 else { throw BenchFailure("B9: the sweep removed nothing: \(swept)") }
        // The inserts that ran while the sweep did, and the one under way when it began.
        let overlapping = log.latencies.withLock { Array($0[max(0, before - 1)..<min($0.count, during + 1)]) }
        return [
            Result(
                name: "B9.gcSweep", unit: "ms", samples: [sweep * 1000], better: "lower",
                note: "blob.gc of a database of \(documents) documents (\(documents / 10) referring to a blob) removing one blob nothing refers to"),
            Result(
                name: "B9.gcWriteWait", unit: "ms", samples: [(overlapping.max() ?? .nan) * 1000], better: "lower",
                note: String(
                    format: "the longest of %d durable single inserts made while it ran (median %.2f ms); before, writes waited for the whole sweep",
                    overlapping.count, Result(name: "", unit: "", samples: overlapping, better: "lower").median * 1000)),
        ]
    }

    /// What B9's writer thread shares with the benchmark: when to stop, and each insert's seconds.
    final class WriterLog: Sendable {
        let done = Atomic<Bool>(false)
        let latencies = Mutex<[Double]>([])
    }
}
