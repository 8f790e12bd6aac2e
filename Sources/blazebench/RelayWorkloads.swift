import BlazeCRDT
import BlazeClient
import BlazeCrypto
import BlazeDaemon
import BlazeProtocol
import BlazeRelay
import BlazeStore
import BlazeSync
import Foundation
import Logging
import NIOPosix
import Synchronization

/// R1: sync through `blaze-relay` (in this process, SQLite, loopback TCP) against the same run's direct peer figures
/// (W4, W5): an initial sync of `n` changes that B only gets from the relay, then single writes from A to B's change
/// feed with the relay as their only path.
enum RelayWorkloads {
    static func run(dir: String, n: Int, docs: [[String: JSONValue]], latencyWrites: Int) async throws -> [Result] {
        let a = try await Workloads.LocalDaemon(dir: dir + "/r1-a", syncListen: "127.0.0.1:0")
        let b = try await Workloads.LocalDaemon(dir: dir + "/r1-b")
        let (relay, relayAddress) = try await inProcessRelay(dir: dir + "/r1-relay")
        defer {
            Task {
                await relay.shutdown()
                await b.stop()
                await a.stop()
            }
        }
        // B joins through A while both are empty, then only ever talks to the relay.
        let source = try a.daemon.store.create("r1")
        let target = try b.daemon.sync.join(token: try invite(a, source), name: "r1")
        let aAddress = try require(PeerAddress(try require(a.daemon.sync.listeningAddress)))
        _ = try b.daemon.sync.removePeer(db: target, address: aAddress)
        try await relay.add(RelayCapability(key: try require(try a.daemon.sync.spaceKey(db: source))))
        for i in 0..<n { _ = try source.apply(.insert(collection: "c", doc: docs[i % docs.count].merging(["_id": .string("d\(i)")]) { $1 })) }
        let origin = source.node
        let up = try seconds {
            _ = try a.daemon.sync.addPeer(db: source, address: relayAddress)
            try SyncWorkloads.waitUntil("R1: A → relay") { relay.counters.entriesStored >= n }
        }
        let down = try seconds {
            _ = try b.daemon.sync.addPeer(db: target, address: relayAddress)
            try SyncWorkloads.waitUntil("R1: relay → B") { try target.versionVector()[origin] >= UInt64(n) }
        }
        var out = [
            Result(
                name: "R1.initialSync", unit: "s", samples: [down], better: "lower", baseline: "W4.initialSync",
                target: "≤ 1.5× direct",
                note: String(format: "%d changes from the relay to B (%.0f changes/s); A → relay took %.2f s", n, Double(n) / down, up))
        ]
        // Single writes on A, timed until B's change feed publishes them; the relay is the only path.
        let latencies = try SyncWorkloads.propagation(from: source, to: target, writes: latencyWrites, label: "R1")
        out.append(
            Result(
                name: "R1.propagation", unit: "µs", samples: latencies, better: "lower", baseline: "W5.propagation",
                target: "p99 ≤ 2× direct", note: "write committed on A → relay → change published on B"))
        return out
    }
}

extension RelayWorkloads {
    /// A relay in this process, on a SQLite store in `dir` (created), listening on loopback; and the address devices
    /// dial.
    static func inProcessRelay(dir: String) async throws -> (RelayServer, PeerAddress) {
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        var logger = Logger(label: "blazebench.relay")
        logger.logLevel = .critical
        let relay = RelayServer(
            store: try RelayStore(path: dir + "/relay.db"), identity: DeviceIdentity(), group: MultiThreadedEventLoopGroup.singleton,
            logger: logger)
        return (relay, try require(PeerAddress("ws://127.0.0.1:\(try await relay.listen(host: "127.0.0.1", port: 0))")))
    }
}

extension BlazeDatabase {
    /// The space id of a shared database, as bytes.
    func spaceKeyID() throws -> [UInt8] { try require(hexBytes(try require(try spaceID(), "space id")), "space id") }
}
