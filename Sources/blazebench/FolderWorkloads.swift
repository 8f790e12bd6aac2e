import BlazeCRDT
import BlazeClient
import BlazeDaemon
import BlazeProtocol
import BlazeStore
import BlazeSync
import Foundation
import GRDB

/// F1: sync through a shared folder (a local directory) against the same run's direct peer figures (W4, W5): an
/// initial sync of `n` changes that B reads only from the folder, single writes from A to B's change feed with
/// inotify and with polling at the default interval, and the folder's bytes per change.
enum FolderWorkloads {
    static func run(dir: String, n: Int, docs: [[String: JSONValue]], latencyWrites: Int, pollWrites: Int) async throws
        -> [Result]
    {
        let folder = dir + "/f1-folder"
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        let a = try await Workloads.LocalDaemon(dir: dir + "/f1-a", syncListen: "127.0.0.1:0")
        let b = try await Workloads.LocalDaemon(dir: dir + "/f1-b")
        let polling = FolderOptions(inotify: false)
        let p = try await Workloads.LocalDaemon(dir: dir + "/f1-p", folderOptions: polling)
        defer {
            Task {
                await p.stop()
                await b.stop()
                await a.stop()
            }
        }
        // B and P join through A while it is empty, then only ever read the folder.
        let source = try a.daemon.store.create("f1")
        let aAddress = try require(PeerAddress(try require(a.daemon.sync.listeningAddress)))
        let target = try b.daemon.sync.join(token: try invite(a, source), name: "f1")
        _ = try b.daemon.sync.removePeer(db: target, address: aAddress)
        let poller = try p.daemon.sync.join(token: try invite(a, source), name: "f1")
        _ = try p.daemon.sync.removePeer(db: poller, address: aAddress)
        for i in 0..<n { _ = try source.apply(.insert(collection: "c", doc: docs[i % docs.count].merging(["_id": .string("d\(i)")]) { $1 })) }
        let origin = source.node
        let up = try seconds {
            _ = try a.daemon.sync.addFolder(db: source, path: folder)
            try SyncWorkloads.waitUntil("F1: A → folder") {
                a.daemon.sync.status(db: source).contains { $0.peer == "folder:" + folder && $0.sentEntries >= n }
            }
        }
        let down = try seconds {
            _ = try b.daemon.sync.addFolder(db: target, path: folder)
            try SyncWorkloads.waitUntil("F1: folder → B") { try target.versionVector()[origin] >= UInt64(n) }
        }
        // The folder's bytes (A's segments, head and members files) against the change bodies they carry.
        let space = try require(try source.spaceID())
        let own = folder + "/" + space + "/" + origin.hex
        let files = try FileManager.default.contentsOfDirectory(atPath: own)
        let folderBytes = try files.reduce(0) {
            $0 + ((try FileManager.default.attributesOfItem(atPath: own + "/" + $1)[.size] as? Int) ?? 0)
        }
        let plain = try target.read { db in
            try Int.fetchOne(db, sql: "SELECT sum(length(CAST(body AS BLOB))) FROM changes WHERE origin = ?", arguments: [origin.hex]) ?? 1
        }
        var out = [
            Result(
                name: "F1.initialSync", unit: "s", samples: [down], better: "lower", baseline: "W4.initialSync",
                target: "≤ 1.5× direct",
                note: String(format: "%d changes from the folder to B (%.0f changes/s); A → folder took %.2f s", n, Double(n) / down, up)),
            Result(
                name: "F1.size", unit: "×", samples: [Double(folderBytes) / Double(plain)], better: "lower",
                note: String(
                    format: "folder bytes per byte of change: %.0f B per change for %.0f B of change body (%d files)",
                    Double(folderBytes) / Double(n), Double(plain) / Double(n), files.count)),
        ]
        // Single writes on A, timed until B's change feed publishes them: inotify wakes B.
        let latencies = try SyncWorkloads.propagation(from: source, to: target, writes: latencyWrites, label: "F1")
        out.append(
            Result(
                name: "F1.propagation", unit: "µs", samples: latencies, better: "lower", baseline: "W5.propagation",
                target: "p99 ≤ 100 ms", note: "write committed on A → A's segment → inotify → change published on B"))
        // The same through a daemon that only polls, at the default interval.
        _ = try p.daemon.sync.addFolder(db: poller, path: folder)
        try SyncWorkloads.waitUntil("F1: folder → P") { try poller.versionVector()[origin] >= (try source.versionVector()[origin]) }
        let polled = try SyncWorkloads.propagation(from: source, to: poller, writes: pollWrites, label: "F1 poll")
        out.append(
            Result(
                name: "F1.propagationPolling", unit: "µs", samples: polled, better: "lower",
                target: "p99 ≤ the poll interval (\(polling.pollIntervalMs) ms) + 100 ms",
                note: "the same with inotify off: the reader finds the write at its next scan"))
        return out
    }
}
