import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeRelay
import BlazeStore
import BlazeSync
import Foundation

/// CATCHUP (only when named: `make bench-catchup`): a device that was offline while `changes` changes were made
/// elsewhere comes back and catches up through a relay. A (in this process) and B (`blazed` in a child process, so its
/// memory is its own) share `docCount` documents; B then syncs only through the relay (in this process, SQLite) and
/// pauses; A makes `changes` single-document patches, each its own change, and the relay takes them all; B resumes.
/// Timed from the resume until B has applied every change; B's peak memory above its idle, and the bytes B received.
enum CatchupWorkloads {
    static func run(dir: String, docCount: Int, changes: Int, docs: [[String: JSONValue]]) async throws -> [Result] {
        let a = try await Workloads.LocalDaemon(dir: dir + "/cu-a", syncListen: "127.0.0.1:0")
        let (relay, relayAddress) = try await RelayWorkloads.inProcessRelay(dir: dir + "/cu-relay")
        let b = try BlobMemoryWorkloads.DaemonChild(dir: dir + "/cu-b")
        defer {
            b.stop()
            Task {
                await relay.shutdown()
                await a.stop()
            }
        }
        let dbA = try a.daemon.store.create("cu")
        try insertDocuments(dbA, count: docCount, docs: docs)
        _ = try b.c.call("db.join", ["token": .string(try invite(a, dbA)), "db": "cu"])
        try waitFor("CATCHUP: B joins", timeout: .seconds(300)) {
            (try? b.c.call("db.info", ["db": "cu"])["documents"]?.intValue) == Int64(docCount)
        }
        // From now on B syncs through the relay only, and is offline while A writes.
        try await relay.add(RelayCapability(key: try require(try a.daemon.sync.spaceKey(db: dbA))))
        let aAddress = try require(a.daemon.sync.listeningAddress)
        _ = try b.c.call("peer.remove", ["db": "cu", "address": .string(aAddress)])
        _ = try b.c.call("peer.add", ["db": "cu", "address": .string(relayAddress.description)])
        _ = try b.c.call("sync.pause", ["db": "cu"])
        _ = try a.daemon.sync.addPeer(db: dbA, address: relayAddress)
        let stored = relay.counters.entriesStored
        let (_, writeTime) = try onThreads(4, count: changes, setup: { _ in dbA }) { db, i in
            let k = (i &* 7919) % docCount
            _ = try (db as! BlazeDatabase).apply(.patch(collection: "c", id: "d\(k)", set: ["score": .double(Double(i))]))
        }
        let made = changes - changes % 4
        try SyncWorkloads.waitUntil("CATCHUP: A → relay") { relay.counters.entriesStored - stored >= made }
        let (entriesBefore, bytesBefore) = try received(b.c)
        let idle = b.residentMiB()
        b.resetPeak()
        let catchUp = try seconds {
            _ = try b.c.call("sync.resume", ["db": "cu"])
            try SyncWorkloads.waitUntil("CATCHUP: relay → B") { try received(b.c).entries - entriesBefore >= made }
        }
        let peak = b.peakMiB()
        let bytes = try received(b.c).bytes - bytesBefore
        let info = try b.c.call("db.info", ["db": "cu"])
        guard info["stateHash"]?.stringValue == (try dbA.stateHash()) else {
            throw ClientError("CATCHUP: B's state differs from A's after catching up")
        }
        return [
            Result(
                name: "CATCHUP.relay", unit: "s", samples: [catchUp], better: "lower",
                note: String(
                    format: "%d changes (single-document patches over %d documents, made in %.0f s) from the relay to a device "
                        + "back online: %.0f changes/s, state identical", made, docCount, writeTime, Double(made) / catchUp)),
            Result(
                name: "CATCHUP.memory", unit: "MiB", samples: [max(0, peak - idle)], better: "lower",
                note: String(format: "the device's peak resident memory above its idle %.0f MiB while catching up", idle)),
            Result(
                name: "CATCHUP.wire", unit: "bytes/change", samples: [Double(bytes) / Double(made)], better: "lower",
                note: String(format: "%.1f MB received by the device (frames, entries, heads)", Double(bytes) / 1e6)),
        ]
    }

    /// Entries and bytes `c`'s daemon has received over all links of database `cu`.
    static func received(_ c: BlazeConnection) throws -> (entries: Int64, bytes: Int64) {
        let peers = try c.call("sync.status", ["db": "cu"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
        return (
            peers.compactMap { $0["receivedEntries"]?.intValue }.reduce(0, +),
            peers.compactMap { $0["receivedBytes"]?.intValue }.reduce(0, +)
        )
    }
}
