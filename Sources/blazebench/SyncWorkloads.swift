import BlazeCRDT
import BlazeClient
import BlazeCrypto
import BlazeDaemon
import BlazeProtocol
import BlazeStore
import BlazeSync
import BlazeWire
import Foundation
import GRDB
import Synchronization

/// W4 and W5: initial sync between two daemons over loopback TCP, and write-to-remote-event latency.
enum SyncWorkloads {
    static func run(dir: String, n: Int, docs: [[String: JSONValue]], latencyWrites: Int) async throws -> [Result] {
        let a = try await Workloads.LocalDaemon(dir: dir + "/w4-a", syncListen: "127.0.0.1:0")
        let b = try await Workloads.LocalDaemon(dir: dir + "/w4-b")
        defer {
            Task {
                await b.stop()
                await a.stop()
            }
        }
        let source = try a.daemon.store.create("w4")
        // One change per document, as single writes produce them.
        for i in 0..<n { _ = try source.apply(.insert(collection: "c", doc: docs[i % docs.count].merging(["_id": .string("d\(i)")]) { $1 })) }
        let token = try invite(a, source)
        let key = try require(try a.daemon.sync.spaceKey(db: source), "space key")
        let sealTime = try seconds { try source.sealLocal(key: key, identity: a.daemon.identity) }
        let origin = source.node
        let cpuBefore = processCPUSeconds()
        // Joining through the invite connects to A and starts the sync: the time includes the join.
        var joined: BlazeDatabase?
        let syncTime = try seconds {
            PhaseMarks.mark("W4.sync start")
            defer { PhaseMarks.mark("W4.sync end") }
            let target = try b.daemon.sync.join(token: token, name: "w4")
            joined = target
            let deadline = Date().addingTimeInterval(600)
            while try target.versionVector()[origin] < UInt64(n) {
                guard Date() < deadline else { throw ClientError("W4: initial sync did not finish in 600 s") }
                usleep(2000)
            }
        }
        let syncCPU = processCPUSeconds() - cpuBefore
        let target = joined!
        let crypto = try cryptoReplaySeconds(target, origin: origin, key: key)
        // Bytes on the wire (every frame B received after the handshake, framing, heads and control messages
        // included) against the change bodies they carry, and against the documents' JSON.
        let wire = b.daemon.sync.status(db: target).reduce(0) { $0 + $1.receivedBytes }
        let plain = try target.read { db in
            try Int.fetchOne(db, sql: "SELECT sum(length(CAST(body AS BLOB))) FROM changes WHERE origin = ?", arguments: [origin.hex]) ?? 1
        }
        let docBytes = (0..<n).reduce(0) { $0 + JSONValue.object(docs[$1 % docs.count]).jsonText.utf8.count }
        var out = [
            Result(
                name: "W4.initialSync", unit: "s", samples: [syncTime], better: "lower", target: "≤ 5 s (ambitious 2 s)",
                note: String(format: "%d changes, %.0f changes/s, %.2f CPU-s in both daemons; wire bytes %.3f× the change bytes (%.2f× the documents' JSON)",
                    n, Double(n) / syncTime, syncCPU, Double(wire) / Double(plain), Double(wire) / Double(docBytes))),
            Result(
                name: "W4.wire", unit: "×", samples: [Double(wire) / Double(plain)], better: "lower", target: "≤ 1.25×",
                note: "bytes on the wire per byte of change carried"),
            Result(
                name: "W7.cryptoShare", unit: "%", samples: [100 * crypto / syncCPU], better: "lower", target: "< 10%",
                note: String(format: "crypto of the sync replayed alone: %.2f s of %.2f s CPU (both daemons) during W4", crypto, syncCPU)),
            Result(
                name: "W4.seal", unit: "s", samples: [sealTime], better: "lower",
                note: String(format: "sealing and signing %d local changes once (before the first sync)", n)),
        ]

        // W5: one write at a time on A, timed until B's change feed publishes it.
        let latencies = try propagation(from: source, to: target, writes: latencyWrites, label: "W5")
        out.append(
            Result(
                name: "W5.propagation", unit: "µs", samples: latencies, better: "lower", target: "p99 ≤ 50 ms (ambitious 10 ms)",
                note: "write committed on A → change published on B (loopback TCP, includes both commits)"))
        return out
    }
}

extension SyncWorkloads {
    /// Makes `writes` single writes on `source`, one at a time, each timed until `target`'s change feed publishes it;
    /// returns the latencies in µs.
    static func propagation(from source: BlazeDatabase, to target: BlazeDatabase, writes: Int, label: String) throws -> [Double] {
        let origin = source.node
        let arrived = DispatchSemaphore(value: 0)
        // Arrival time per write, by its document id: events of earlier changes still being published (the end of an
        // initial sync) are not taken for a write's.
        let stamps = Mutex<[String: UInt64]>([:])
        var attached: Int?
        while attached == nil {
            switch target.feed.attach(after: target.feed.lastSequence, { signal in
                guard case .entries(let entries) = signal else { return }
                for e in entries where e.origin == origin {
                    for event in e.events where event.collection == "live" {
                        stamps.withLock { $0[event.id] = DispatchTime.now().uptimeNanoseconds }
                        arrived.signal()
                    }
                }
            }) {
            case .attached(let token): attached = token
            case .behind: continue
            case .ended(let e): throw e
            }
        }
        defer { target.feed.detach(attached!) }
        var latencies: [Double] = []
        for i in 0..<writes {
            // Ids differ per label: a put of a document as it already is would be no change at all.
            let id = "l\(i)-" + label.filter { $0.isLetter || $0.isNumber }
            let start = DispatchTime.now().uptimeNanoseconds
            _ = try source.apply(.put(collection: "live", id: .init(id), doc: ["i": .int(Int64(i))]))
            var stamp: UInt64?
            while stamp == nil {
                guard arrived.wait(timeout: .now() + 30) == .success else { throw ClientError("\(label): write \(i) never arrived") }
                stamp = stamps.withLock { $0[id] }
            }
            latencies.append(Double(stamp! - start) / 1000)
        }
        return latencies
    }

    /// W6: two daemons share `docCount` documents, go offline, each makes `updates` single-document updates over all
    /// of them, then sync both ways; times the merge until both hold every change with an identical stateHash.
    static func offlineMerge(dir: String, docCount: Int, updates: Int, docs: [[String: JSONValue]]) async throws -> [Result] {
        let a = try await Workloads.LocalDaemon(dir: dir + "/w6-a", syncListen: "127.0.0.1:0")
        let b = try await Workloads.LocalDaemon(dir: dir + "/w6-b")
        defer {
            Task {
                await b.stop()
                await a.stop()
            }
        }
        let dbA = try a.daemon.store.create("w6")
        try insertDocuments(dbA, count: docCount, docs: docs)
        let dbB = try b.daemon.sync.join(token: try invite(a, dbA), name: "w6")
        try waitUntil("W6: initial copy") { try dbB.versionVector()[dbA.node] == dbA.versionVector()[dbA.node] }
        // Offline: both pause and update the same documents, one change per update.
        a.daemon.sync.pause(db: "w6")
        b.daemon.sync.pause(db: "w6")
        for (db, salt) in [(dbA, 1), (dbB, 2)] {
            for i in 0..<updates {
                let id = "d\((i &* 7919 &+ salt &* 104_729) % docCount)"
                _ = try db.apply(.patch(collection: "c", id: id, set: ["score": .double(Double(i * salt)), "name": .string("n\(salt)-\(i)")]))
            }
        }
        let want = VersionVector(try dbA.versionVector().entries.merging(try dbB.versionVector().entries, uniquingKeysWith: max))
        let cpuBefore = processCPUSeconds()
        let mergeTime = try seconds {
            PhaseMarks.mark("W6.merge start")
            defer { PhaseMarks.mark("W6.merge end") }
            a.daemon.sync.resume(db: "w6")
            b.daemon.sync.resume(db: "w6")
            try waitUntil("W6: merge") { try dbA.versionVector().includes(want) && dbB.versionVector().includes(want) }
        }
        let mergeCPU = processCPUSeconds() - cpuBefore
        let (hashA, hashB) = (try dbA.stateHash(), try dbB.stateHash())
        guard hashA == hashB else { throw ClientError("W6: stateHash differs after the merge: \(hashA) vs \(hashB)") }
        // The database's size once its write-ahead log is checkpointed: pages in use times page size.
        func megabytes(_ db: BlazeDatabase) throws -> Double {
            try db.read { d in
                let pages = try Int.fetchOne(d, sql: "PRAGMA page_count") ?? 0
                let size = try Int.fetchOne(d, sql: "PRAGMA page_size") ?? 0
                return Double(pages * size) / 1e6
            }
        }
        return [
            Result(
                name: "W6.offlineMerge", unit: "s", samples: [mergeTime], better: "lower",
                note: String(format: "2 × %d offline updates over %d docs merged both ways (%.0f changes/s, %.2f CPU-s in both daemons), stateHash identical; on disk %.1f MB and %.1f MB",
                    updates, docCount, Double(2 * updates) / mergeTime, mergeCPU, try megabytes(dbA), try megabytes(dbB)))
        ]
    }

    /// Polls `condition` every 2 ms for at most 600 s.
    static func waitUntil(_ what: String, _ condition: () throws -> Bool) throws {
        let deadline = Date().addingTimeInterval(600)
        while try !condition() {
            guard Date() < deadline else { throw ClientError("\(what) did not finish in 600 s") }
            usleep(2000)
        }
    }
}

/// CPU seconds (user and system) this process has used.
func processCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    func secs(_ t: timeval) -> Double { Double(t.tv_sec) + Double(t.tv_usec) / 1e6 }
    return secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// W7: every cryptographic operation the initial sync of `origin`'s log performed, replayed alone on the entries the
/// target received: per batch, the head's signature check and the transport sealing and opening of its message; per
/// entry, its SHA-256 and its AEAD opening. Returns the CPU seconds they take (the batches are read beforehand).
func cryptoReplaySeconds(_ db: BlazeDatabase, origin: NodeID, key: SpaceKey) throws -> Double {
    var batches: [EntryBatch] = []
    var after: UInt64 = 0
    while let batch = try db.entryBatch(origin: origin, after: after, maxEntries: 1000) {
        batches.append(batch)
        after = batch.head.seq
    }
    let server = Handshake.Server(identity: DeviceIdentity())
    var client = Handshake.Client(key: key, identity: DeviceIdentity())
    let accepted = try server.accept(try client.respond(to: server.hello), spaces: [key])
    var sender = accepted.session
    var receiver = try client.finish(accepted.reply).session
    let messages = try batches.map { batch -> [UInt8] in
        var m: [UInt8] = []
        try EntryRun.pack(batch.entries, into: &m)
        return m
    }
    let start = processCPUSeconds()
    for (batch, message) in zip(batches, messages) {
        try batch.head.verify(space: key.id)
        _ = try receiver.openFrame(sender.seal(message)[...])
        for entry in batch.entries {
            _ = try SealedEntry(bytes: entry.bytes)  // hashes it
            _ = try entry.open(with: key)
        }
    }
    return processCPUSeconds() - start
}

/// Unwraps or throws (blazebench has no test framework).
func require<T>(_ value: T?, _ what: String = "value") throws -> T {
    guard let value else { throw ClientError("blazebench: missing \(what)") }
    return value
}

/// Shares `db` on `a` (its device becomes the space's admin) and returns a one-time writer invite naming `a`'s sync
/// address.
func invite(_ a: Workloads.LocalDaemon, _ db: BlazeDatabase) throws -> String {
    _ = try a.daemon.sync.share(db: db)
    return try a.daemon.sync.invite(db: db, role: .writer, expiresInMs: 3_600_000, address: nil).token
}
