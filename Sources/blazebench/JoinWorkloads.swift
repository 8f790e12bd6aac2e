import BlazeCRDT
import BlazeClient
import BlazeProtocol
import BlazeStore
import BlazeSync
import Foundation

/// JOIN: a new device joining a shared database, without history and with a long compacted one (SYNC.md §11).
enum JoinWorkloads {
    /// J1.noHistory: `docCount` documents inserted (1,000 per transaction), then a device joins: the time until it
    /// holds the same version vector and state. J1.snapshot: the same documents after `updates` more updates (100
    /// per transaction), compacted by the only member, so the joiner gets a snapshot; its ratio to J1.noHistory is the
    /// target (≤ 2×).
    static func run(dir: String, docCount: Int, updates: Int, docs: [[String: JSONValue]]) async throws -> [Result] {
        let plain = try await join(dir: dir + "/join-plain", docCount: docCount, updates: 0, docs: docs)
        let long = try await join(dir: dir + "/join-history", docCount: docCount, updates: updates, docs: docs)
        return [
            Result(
                name: "J1.noHistory", unit: "s", samples: [plain.seconds], better: "lower",
                note: "a device joins \(docCount) docs inserted 1,000 per transaction (\(plain.changes) changes, replayed)"),
            Result(
                name: "J1.snapshot", unit: "s", samples: [long.seconds], better: "lower", baseline: "J1.noHistory", target: "≤ 2×",
                note: String(
                    format: "the same docs after %d updates in %d changes, compacted (%.1f MB on disk before, %.1f MB after); "
                        + "the joiner installs a snapshot, state identical",
                    updates, long.changes, long.before / 1e6, long.after / 1e6)),
        ]
    }

    static func join(dir: String, docCount: Int, updates: Int, docs: [[String: JSONValue]]) async throws
        -> (seconds: Double, changes: Int, before: Double, after: Double)
    {
        let a = try await Workloads.LocalDaemon(dir: dir + "/a", syncListen: "127.0.0.1:0")
        let b = try await Workloads.LocalDaemon(dir: dir + "/b")
        let dbA = try a.daemon.store.create("j")
        _ = try a.daemon.sync.share(db: dbA)
        try insertDocuments(dbA, count: docCount, docs: docs)
        var k = 0
        for start in stride(from: 0, to: updates, by: 100) {
            _ = try dbA.commit((start..<min(updates, start + 100)).map { i in
                k = (k &+ 7919) % docCount
                return .patch(collection: "c", id: "d\(k)", set: ["score": .double(Double(i))])
            })
        }
        let changes = Int(try dbA.versionVector()[dbA.node])
        var before = 0.0, after = 0.0
        if updates > 0 {
            before = Double(try dbA.checkpointedFileBytes())
            // The only member: everything is stable, and the history goes.
            _ = try a.daemon.sync.compact(db: dbA, defragment: true)
            after = Double(try dbA.checkpointedFileBytes())
        }
        let token = try invite(a, dbA)
        let want = try dbA.versionVector()
        var dbB: BlazeDatabase?
        let t = try seconds {
            let joined = try b.daemon.sync.join(token: token, name: "j")
            dbB = joined
            try SyncWorkloads.waitUntil("J1: join") { try joined.versionVector().includes(want) }
        }
        guard let dbB, try dbB.stateHash() == dbA.stateHash() else { throw ClientError("J1: the joiner's state differs") }
        await b.stop()
        await a.stop()
        return (t, changes, before, after)
    }
}
