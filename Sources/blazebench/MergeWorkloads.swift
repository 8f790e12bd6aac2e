import BlazeCRDT
import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeSync
import BlazeWire
import Foundation

/// W6's receiving side without daemons, network or a second core: the same offline patches, verified and then stored
/// by one thread, each half timed alone. Where W6 measures what a user waits for, these say what one writer and one
/// verifying thread can do, which W6's two busy daemons on two cores hide in their noise.
enum MergeWorkloads {
    static func run(dir: String, docCount: Int, updates: Int, docs: [[String: JSONValue]]) throws -> [Result] {
        let key = SpaceKey.generate()
        let (idA, idB) = (DeviceIdentity(), DeviceIdentity())
        let a = try Store(directory: dir + "/w6s-a", node: NodeID(bytes: idA.nodeID)).create("m")
        let b = try Store(directory: dir + "/w6s-b", node: NodeID(bytes: idB.nodeID)).create("m")
        try insertDocuments(a, count: docCount, docs: docs)
        try a.sealLocal(key: key, identity: idA)
        let initial = try batches(of: a, after: 0)
        for batch in initial { _ = try b.store(try b.verify(batch: batch, key: key)) }
        // Offline, both patch the same documents (W6's pattern), then seal.
        for (db, salt) in [(a, 1), (b, 2)] {
            for i in 0..<updates {
                let id = "d\((i &* 7919 &+ salt &* 104_729) % docCount)"
                _ = try db.apply(.patch(collection: "c", id: id, set: ["score": .double(Double(i * salt)), "name": .string("n\(salt)-\(i)")]))
            }
        }
        try a.sealLocal(key: key, identity: idA)
        try b.sealLocal(key: key, identity: idB)
        let sent = try batches(of: a, after: initial.last!.head.seq)
        var verified: [VerifiedBatch] = []
        let verifyCPU = try cpuSeconds { verified = try sent.map { try b.verify(batch: $0, key: key) } }
        var stored = 0
        let storeCPU = try cpuSeconds {
            PhaseMarks.mark("W6.store start")
            defer { PhaseMarks.mark("W6.store end") }
            // As a session's receiver stores them: up to `VerifiedBatch.maxGroup` in one transaction, the next group
            // starting where one stopped (at its bound of documents).
            var start = 0
            while start < verified.count {
                let group = Array(verified[start..<min(verified.count, start + VerifiedBatch.maxGroup)])
                let outcomes = try require(try b.store(group: group), "a group stored")
                stored += outcomes.reduce(0) { $0 + $1.stored }
                start += outcomes.count
            }
        }
        guard stored == updates else { throw ClientError("W6.store: stored \(stored) of \(updates) changes") }
        return [
            Result(
                name: "W6.store", unit: "changes/s", samples: [Double(updates) / storeCPU], better: "higher",
                note: String(format: "%d patches received by a database that made %d of its own, stored by one thread, %d batches per transaction (%.1f µs each)",
                    updates, updates, VerifiedBatch.maxGroup, 1e6 * storeCPU / Double(updates))),
            Result(
                name: "W6.verify", unit: "changes/s", samples: [Double(updates) / verifyCPU], better: "higher",
                note: String(format: "the same batches verified and decoded by one thread (%.1f µs each)", 1e6 * verifyCPU / Double(updates))),
        ]
    }

    /// Every batch of `db`'s own entries after `after`, as a session reads them.
    static func batches(of db: BlazeDatabase, after: UInt64) throws -> [EntryBatch] {
        var out: [EntryBatch] = []
        var after = after
        while let batch = try db.entryBatch(origin: db.node, after: after, maxEntries: 1000) {
            out.append(batch)
            after = batch.head.seq
        }
        return out
    }

    /// CPU seconds this process spends in `body` (one thread runs it; nothing else of the benchmark runs meanwhile).
    static func cpuSeconds(_ body: () throws -> Void) rethrows -> Double {
        let start = processCPUSeconds()
        try body()
        return processCPUSeconds() - start
    }
}

/// Inserts documents `d0`…`d(count-1)` into collection `c` of `db`, 1,000 per transaction, their fields taken from
/// `docs` in turn.
func insertDocuments(_ db: BlazeDatabase, count: Int, docs: [[String: JSONValue]]) throws {
    for start in stride(from: 0, to: count, by: 1000) {
        _ = try db.commit((start..<min(count, start + 1000)).map { i in
            .insert(collection: "c", doc: docs[i % docs.count].merging(["_id": .string("d\(i)")]) { $1 })
        })
    }
}
