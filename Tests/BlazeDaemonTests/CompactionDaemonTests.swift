import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import GRDB
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Rows of `table` in a daemon's database file, read directly (WAL: the daemon may be writing).
func fileRows(dataDir: String, db: String, _ table: String) throws -> Int {
    var config = GRDB.Configuration()
    config.readonly = true
    let queue = try DatabaseQueue(path: dataDir + "/databases/\(db).db", configuration: config)
    defer { try? queue.close() }
    return try queue.read { try Int.fetchOne($0, sql: "SELECT count(*) FROM \(table)") ?? 0 }
}

/// Sum of `key` over a database's peers in `sync.status`.
func peerCounter(_ c: BlazeConnection, _ db: String, _ key: String) throws -> Int64 {
    let dbs = try c.call("sync.status")["databases"]?.arrayValue ?? []
    let peers = dbs.first { $0["db"]?.stringValue == db }?["peers"]?.arrayValue ?? []
    return peers.reduce(0) { $0 + ($1[key]?.intValue ?? 0) }
}

/// Inserts documents `d0`…`d199` into `c` of `db` in four transactions of 50, then deletes `d<first>`… (`deletes` of
/// them): a history with tombstones to compact.
func writeHistory(_ c: BlazeConnection, _ db: String, deleting deletes: Int, from first: Int) throws {
    for chunk in 0..<4 {
        let ops: [JSONValue] = (0..<50).map { i in
            ["op": "insert", "collection": "c", "doc": ["_id": .string("d\(chunk * 50 + i)"), "n": .int(Int64(i))]]
        }
        _ = try c.call("tx.commit", ["db": .string(db), "ops": .array(ops)])
    }
    for i in 0..<deletes { _ = try c.call("doc.delete", ["db": .string(db), "collection": "c", "id": .string("d\(first + i)")]) }
}

/// B joins A's `team` and writes one document; once both hold the same 181 documents, both compact until all of A's
/// changes are stable on A (each compaction issues the device's acknowledgement). Returns whether that happened.
func joinAndCompactEverything(_ ca: BlazeConnection, _ cb: BlazeConnection) throws -> Bool {
    _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
    _ = try cb.call("doc.put", ["db": "team", "collection": "c", "id": "fromB", "doc": ["b": true]])
    guard try eventually({ try replicaState(ca, "team") == replicaState(cb, "team") && replicaState(ca, "team").docs == 181 })
    else { return false }
    let na = try nodeID(ca, "team")
    let aSeq = try #require(try versionVector(ca)?[na]?.intValue)
    return try eventually {
        _ = try cb.call("db.compact", ["db": "team"])
        let r = try ca.call("db.compact", ["db": "team"])
        return r["stableVector"]?[na]?.intValue == aSeq && r["silentMembers"] == []
    }
}

/// Compaction and snapshots with real daemons (SYNC.md §11).
@Suite(.serialized) struct CompactionDaemonTests {
    /// Two members hold everything and say so: both compact their sealed entries away. A third device joining then
    /// gets a snapshot (not the history), and everything written afterwards, by anyone, links and converges.
    @Test func membersCompactWhatAllHoldAndANewDeviceJoinsFromASnapshot() throws {
        let a = try syncDaemon(), b = try syncDaemon(), c = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect(), cc = try c.connect()
        _ = try ca.call("db.create", ["db": "team"])
        try writeHistory(ca, "team", deleting: 0, from: 0)
        for i in 0..<40 { _ = try ca.call("doc.patch", ["db": "team", "collection": "c", "id": .string("d\(i)"), "set": ["n": -1]]) }
        for i in 0..<20 { _ = try ca.call("doc.delete", ["db": "team", "collection": "c", "id": .string("d\(i + 100)")]) }
        // Each compaction issues the device's acknowledgement; once each has the other's, everything is stable.
        #expect(try joinAndCompactEverything(ca, cb))
        #expect(try fileRows(dataDir: a.dataDir, db: "team", "sync_entries") == 0)
        #expect(try fileRows(dataDir: a.dataDir, db: "team", "tombstones") == 0)
        let info = try ca.call("db.info", ["db": "team"])
        #expect(info["lastCompaction"]?["entries"]?.intValue ?? 0 > 0)
        #expect(info["bytesByTable"]?["docs"]?.intValue ?? 0 > 0)
        // C joins through A: a snapshot, then whatever follows.
        _ = try cc.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        #expect(try eventually { try replicaState(cc, "team") == replicaState(ca, "team") })
        #expect(try versionVector(cc) == versionVector(ca))
        #expect(try peerCounter(cc, "team", "snapshotsInstalled") >= 1)
        #expect(try peerCounter(ca, "team", "snapshotsSent") >= 1)
        for (conn, tag) in [(ca, "a"), (cb, "b"), (cc, "c")] {
            for i in 0..<5 { _ = try conn.call("doc.put", ["db": "team", "collection": "late", "id": .string("\(tag)\(i)"), "doc": ["i": .int(Int64(i))]]) }
        }
        #expect(try eventually(timeout: .seconds(60)) {
            let states = try [ca, cb, cc].map { try replicaState($0, "team") }
            let vectors = try [ca, cb, cc].map { try versionVector($0) }
            return states[0].docs == 196 && states.allSatisfy { $0 == states[0] } && vectors.allSatisfy { $0 == vectors[0] }
        })
        for daemon in [a, b, c] { daemon.stop() }
    }

    /// An admin that joined from a snapshot removes a member whose entries it holds only through that snapshot: the
    /// manifest carried the head that member signed over the last entry it covers, so the removal's cutoff is that
    /// entry, proven, and every member keeps what the removed one wrote. Before, the admin held no signed head of it
    /// and the cutoff was 0: members not holding those entries yet would have refused them for good.
    @Test func anAdminJoinedFromASnapshotRemovesAMemberWithTheCutoffItHolds() throws {
        let a = try syncDaemon(), b = try syncDaemon(), c = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect(), cc = try c.connect()
        _ = try ca.call("db.create", ["db": "team"])
        try writeHistory(ca, "team", deleting: 0, from: 0)
        for i in 0..<20 { _ = try ca.call("doc.delete", ["db": "team", "collection": "c", "id": .string("d\(i + 100)")]) }
        #expect(try joinAndCompactEverything(ca, cb))
        _ = try cc.call("db.join", ["token": .string(try ca.invite("team", role: "admin")), "db": "team"])
        #expect(try eventually { try replicaState(cc, "team") == replicaState(ca, "team") })
        #expect(try peerCounter(cc, "team", "snapshotsInstalled") >= 1)
        let nb = try nodeID(cb, "team")
        let held = try #require(try versionVector(cc)?[nb]?.intValue)
        #expect(held > 0)
        _ = try cc.call("db.revoke", ["db": "team", "device": .string(nb)])
        let removal = try membershipOps(dataDir: c.dataDir, db: "team").compactMap { op -> (UInt64, SignedHead?)? in
            if case .remove(let device, let cutoff, _) = op.action, hexString(device) == nb { return (cutoff, op.cutoffHead) }
            return nil
        }.first
        #expect(removal?.0 == UInt64(held) && removal?.1?.seq == UInt64(held), "the cutoff is the entry the snapshot ends at")
        #expect(try eventually { try members(ca, "team").contains { $0.device == nb && $0.removed } })
        #expect(try ca.call("doc.get", ["db": "team", "collection": "c", "id": "fromB"])["doc"]?["b"] == true)
        for daemon in [a, b, c] { daemon.stop() }
    }

    /// A member silent past the horizon no longer holds compaction back; when it comes back it gets a snapshot, and
    /// what it wrote while away (never sent) is kept and reaches the others.
    @Test func aMemberSilentPastTheHorizonReJoinsFromASnapshotKeepingItsOwnWrites() throws {
        let dirB = TempDir()
        let horizon = ["--compaction-horizon", "1"]
        let a = try DaemonProcess(arguments: ["--sync-listen", "127.0.0.1:0"] + horizon)
        var b = try DaemonProcess(arguments: ["--sync-listen", "127.0.0.1:0"] + horizon, dir: dirB)
        let ca = try a.connect()
        var cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "d0", "doc": ["hits": 0]])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        #expect(try eventually { try replicaState(cb, "team") == replicaState(ca, "team") })
        let nb = try nodeID(cb, "team")
        // B goes offline with a write nobody has seen.
        _ = try cb.call("sync.pause", ["db": "team"])
        _ = try cb.call("doc.put", ["db": "team", "collection": "c", "id": "offline", "doc": ["by": "b"]])
        _ = try cb.call("doc.patch", ["db": "team", "collection": "c", "id": "d0", "incr": ["hits": 2]])
        b.stop()
        for i in 0..<30 { _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": .string("a\(i)"), "doc": ["i": .int(Int64(i))]]) }
        _ = try ca.call("doc.patch", ["db": "team", "collection": "c", "id": "d0", "incr": ["hits": 1]])
        // Past the horizon, B is left out and A's entries go.
        #expect(try eventually {
            let r = try ca.call("db.compact", ["db": "team"])
            return r["silentMembers"] == [.string(nb)] && (r["entries"]?.intValue ?? 0) > 0
        })
        b = try DaemonProcess(arguments: ["--sync-listen", "127.0.0.1:0"] + horizon, dir: dirB)
        cb = try b.connect()
        #expect(try eventually(timeout: .seconds(60)) {
            try replicaState(cb, "team") == replicaState(ca, "team") && versionVector(cb) == versionVector(ca)
        })
        #expect(try ca.call("doc.get", ["db": "team", "collection": "c", "id": "offline"])["doc"]?["by"] == "b")
        #expect(try ca.call("doc.get", ["db": "team", "collection": "c", "id": "d0"])["doc"]?["hits"] == 3)
        #expect(try peerCounter(cb, "team", "snapshotsInstalled") >= 1)
        a.stop()
        b.stop()
    }

    /// kill -9 while a compaction is under way: the file is intact, nothing is lost, and the next compaction
    /// finishes the work.
    @Test func killDuringCompactionLosesNothingAndCompactionResumes() throws {
        let dir = TempDir()
        var d = try DaemonProcess(arguments: ["--feed-retention", "10"], dir: dir)
        var c = try d.connect()
        _ = try c.call("db.create", ["db": "big"])
        for chunk in 0..<20 {
            let ops: [JSONValue] = (0..<200).map { i in
                ["op": "insert", "collection": "c", "doc": ["_id": .string("d\(chunk * 200 + i)"), "pad": .string(String(repeating: "x", count: 300))]]
            }
            _ = try c.call("tx.commit", ["db": "big", "ops": .array(ops)])
        }
        for i in 0..<1500 { _ = try c.call("doc.patch", ["db": "big", "collection": "c", "id": .string("d\(i)"), "set": ["n": .int(Int64(i))]]) }
        for i in 0..<500 { _ = try c.call("doc.delete", ["db": "big", "collection": "c", "id": .string("d\(3000 + i)")]) }
        let before = try replicaState(c, "big")
        let changes = try fileRows(dataDir: d.dataDir, db: "big", "changes")
        #expect(changes == 2020)
        // Ask for a compaction without waiting for it, and kill the daemon once its first step has committed.
        try c.send(Array(#"{"jsonrpc":"2.0","id":1,"method":"db.compact","params":{"db":"big"}}"#.utf8) + [0x0A])
        #expect(eventually { (try? fileRows(dataDir: d.dataDir, db: "big", "changes")).map { $0 < changes } ?? false })
        d.kill9()
        let queue = try DatabaseQueue(path: d.dataDir + "/databases/big.db")
        #expect(try queue.read { try String.fetchOne($0, sql: "PRAGMA integrity_check") } == "ok")
        try queue.close()
        d = try DaemonProcess(arguments: ["--feed-retention", "10"], dir: dir)
        c = try d.connect()
        #expect(try replicaState(c, "big") == before)
        _ = try c.call("db.compact", ["db": "big"])
        #expect(try fileRows(dataDir: d.dataDir, db: "big", "changes") <= 10)
        #expect(try fileRows(dataDir: d.dataDir, db: "big", "tombstones") == 0)
        #expect(try replicaState(c, "big") == before)
        _ = try c.call("doc.put", ["db": "big", "collection": "c", "id": "after", "doc": ["ok": true]])
        #expect(try replicaState(c, "big").docs == before.docs + 1)
        d.stop()
    }

    @Test func compactRejectsBadInput() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        expectRPCError(c, "db.compact", [:], code: -32602)
        expectRPCError(c, "db.compact", ["db": 7], code: -32602)
        expectRPCError(c, "db.compact", ["db": "nope"], code: -32010)
        expectRPCError(c, "db.compact", ["db": "default", "extra": 1], code: -32602)
        let r = try c.call("db.compact", ["db": "default"])
        #expect(r["db"] == "default" && r["silentMembers"] == [])
        d.stop()
    }
}
