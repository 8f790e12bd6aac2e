import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeRelay
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// BLOB through a relay (B5): a file put on one daemon is left on a relay (in-process, SQLite, WebSocket on loopback)
/// and fetched from there by a second daemon that never meets the first, against the same run's `rsync` row (B4).
enum BlobRelayWorkloads {
    /// Runs it on a file of `megabytes` MiB of random bytes, `repeats` times (each repeat two new daemons and a new
    /// space, so every chunk crosses both ways).
    static func run(dir: String, megabytes: Int, repeats: Int) async throws -> [Result] {
        let work = dir + "/blob-relay"
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: work) }
        let source = work + "/source"
        try BlobWorkloads.writeRandomFile(source, bytes: megabytes << 20)
        let mib = Double(megabytes)
        let (relay, relayAddress) = try await RelayWorkloads.inProcessRelay(dir: work + "/relay")
        var (upload, fetch, rss) = ([Double](), [Double](), [Double]())
        var chunks = 0
        for r in 0..<repeats {
            let a = try await Workloads.LocalDaemon(dir: work + "/a-\(r)", syncListen: "127.0.0.1:0")
            let b = try await Workloads.LocalDaemon(dir: work + "/b-\(r)")
            let ca = try BlazeConnection(socketPath: a.socket, timeoutSeconds: 600)
            let cb = try BlazeConnection(socketPath: b.socket, timeoutSeconds: 600)
            let name = "b5"
            let db = try a.daemon.store.create(name)
            let put = try ca.call("blob.put", ["db": .string(name), "path": .string(source)])
            chunks = Int(put["chunks"]?.intValue ?? 0)
            let joined = try b.daemon.sync.join(token: try invite(a, db), name: name)
            _ = try b.daemon.sync.removePeer(db: joined, address: try require(PeerAddress(try require(a.daemon.sync.listeningAddress))))
            try await relay.add(RelayCapability(key: try require(try a.daemon.sync.spaceKey(db: db))))
            // Up: A offers its chunks to the relay, which stores them (sealed) in its SQLite file.
            let stored = relay.counters.chunksStored
            upload.append(mib / (try seconds {
                _ = try a.daemon.sync.addPeer(db: db, address: relayAddress)
                try SyncWorkloads.waitUntil("B5: A → relay") { relay.counters.chunksStored >= stored + chunks + 1 }
            }))
            await a.stop()
            // Down: B reaches only the relay; `blob.get` fetches every chunk from there.
            _ = try b.daemon.sync.addPeer(db: joined, address: relayAddress)
            try SyncWorkloads.waitUntil("B5: B's link to the relay") { b.daemon.sync.status(db: joined).contains { $0.connected } }
            let before = AbuseWorkloads.memoryMiB(getpid())
            let out = work + "/out-\(r)"
            fetch.append(mib / (try seconds { _ = try cb.call("blob.get", ["db": .string(name), "blob": put["blob"]!["id"]!, "path": .string(out)]) }))
            rss.append(AbuseWorkloads.memoryMiB(getpid()) - before)
            guard FileManager.default.contentsEqual(atPath: out, andPath: source) else { throw BenchFailure("BLOB.relay: the fetched blob differs") }
            unlink(out)
            await b.stop()
        }
        await relay.shutdown()
        return [
            Result(
                name: "B5.relayUpload", unit: "MiB/s", samples: upload, better: "higher",
                note: "\(megabytes) MiB in \(chunks) chunks offered by A to a relay (in-process, SQLite) until it stored them all"),
            Result(
                name: "B5.relayFetch", unit: "MiB/s", samples: fetch, better: "higher", baseline: "B4.rsyncSSH", secondBaseline: "B4.rsync",
                note: "the same file fetched from the relay by B, which never met A (blob.get); the bench process's RSS grew by "
                    + rss.map { String(format: "%.0f", $0) }.joined(separator: "/") + " MiB meanwhile (relay and both daemons in it)"),
        ]
    }
}
