import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Synchronization
import Testing

@Suite(.serialized) struct SyncFuzzTests {
    /// The seeded sync fuzzer: up to 100,000 messages (`BLAZE_FUZZ_MESSAGES`) within `BLAZE_FUZZ_SECONDS` (240) from
    /// members holding the key, against two live daemons while local clients write. B dials A and A dials nobody (a
    /// one-way link); a third of the way through B is killed (kill -9) and restarted, two thirds of the way A is
    /// restarted (SIGTERM), each on the same port. Afterwards both are up, serve local clients, hold every honest
    /// change and none of the refused ones, and a clean replica that joins converges with them.
    @Test func seededSyncFuzzerLeavesDaemonsUpAndConverged() throws {
        let seed = testSeed("sync fuzzer")
        let environment = ProcessInfo.processInfo.environment
        let total = Int(environment["BLAZE_FUZZ_MESSAGES"] ?? "") ?? 100_000
        let budget = Double(environment["BLAZE_FUZZ_SECONDS"] ?? "") ?? 240
        print("sync fuzzer seed \(seed), \(total) messages within \(Int(budget)) s (replay with BLAZE_SEED=\(seed))")
        let a = try SyncTarget()
        let b = try RestartingDaemon()
        // The target's space is a legacy one: any holder of its key (the fuzzer) is a member.
        _ = try b.connect().call("db.join", ["token": .string(a.key.token!), "db": "team"])
        _ = try b.connect().call("peer.add", ["db": "team", "address": .string(a.node.address)])
        let ports = [a.port, b.port]

        // Local clients write on both daemons throughout.
        let writers = LocalWriters(sockets: [(a.node.socket, "a"), (b.socket, "b")])

        var fuzzer = SyncFuzzer(seed: seed, key: a.key)
        var sent = 0, connections = 0
        var members: [HostileMember?] = [nil, nil]
        var refusedInARow = 0
        let started = Date()
        var generation = 0.0
        var restarts = 0
        // Rejections A counted before its restart (its counters start again from zero).
        var rejectedBefore: [String: Int64] = [:]
        while sent < total && Date().timeIntervalSince(started) < budget {
            let progress = max(Double(sent) / Double(total), Date().timeIntervalSince(started) / budget)
            if restarts == 0 && progress >= 1.0 / 3 {
                try b.restart(kill9: true)
                members[1]?.close()
                members[1] = nil
                restarts = 1
            } else if restarts == 1 && progress >= 2.0 / 3 {
                rejectedBefore = try a.rejected()
                try a.restart(kill9: false)
                members[0]?.close()
                members[0] = nil
                restarts = 2
            }
            let target = sent % 2
            if members[target] == nil {
                let m = HostileMember(key: a.key)
                do {
                    try m.connect(port: ports[target])
                    // Claim to hold what the daemon holds (its first STATE), so that it does not send its whole log
                    // to every fuzzing connection; what it commits later is still pushed and drained.
                    let vector = try m.receive().flatMap(HostileMember.vector(ofState:)) ?? []
                    try m.send(HostileMember.state(vector))
                } catch {
                    // Refused or closed before it began (the per-address handshake rate after many refusals): a
                    // bounded number of times in a row, with a short pause, then the test fails.
                    m.close()
                    refusedInARow += 1
                    try #require(refusedInARow < 200, "the daemon refused 200 connections in a row: \(error)")
                    usleep(20_000)
                    continue
                }
                refusedInARow = 0
                m.startDraining()
                members[target] = m
                connections += 1
            }
            let generating = Date()
            let messages = fuzzer.next(over: members[target]!)
            generation += Date().timeIntervalSince(generating)
            do {
                for message in messages {
                    try members[target]!.send(message)
                    sent += 1
                }
            } catch {
                // The daemon closed the connection (it refused something): reconnect and go on.
                members[target]!.close()
                members[target] = nil
            }
        }
        for m in members { m?.close() }
        let seconds = Date().timeIntervalSince(started)
        print(
            "sync fuzzer: \(sent) messages over \(connections) connections in \(Int(seconds)) s "
                + "(\(Int(generation)) s generating them), \(restarts) restarts; "
                + "\(fuzzer.counts.sorted { $0.key < $1.key })")
        #expect(restarts == 2, "both daemons were restarted")

        // Both daemons are up and serve local clients.
        try a.expectServing()
        #expect(b.isRunning)
        #expect(writers.stop())

        // Every honest chain, delivered whole over a clean connection to each daemon, is stored everywhere. The
        // connections stay open until the end: closing a socket with unread data resets it, and the daemon's
        // kernel would drop what it had not read yet. A daemon may still close a delivery connection (its handshake
        // rate after the fuzzer's many refused connections, a batch it is still applying when its timeout strikes):
        // that is an expected outcome of fuzzing, so the delivery starts over on a new connection, a bounded number
        // of times.
        var deliveries: [HostileMember] = []
        defer { for m in deliveries { m.close() } }
        for port in ports {
            var attempt = 0
            while true {
                attempt += 1
                let m = HostileMember(key: a.key)
                do {
                    try m.connect(port: port)
                    m.startDraining()
                    for batch in fuzzer.honestBatches() { try m.send(batch) }
                    deliveries.append(m)
                    break
                } catch {
                    m.close()
                    try #require(attempt < 50, "the honest chains could not be delivered to port \(port): \(error)")
                    usleep(100_000)
                }
            }
        }
        let honestIDs = fuzzer.honestIDs
        let localIDs = writers.acknowledged.withLock { $0 }
        let unanswered = writers.unanswered.load(ordering: .relaxed)
        let cc = try syncDaemon()
        let clean = try cc.connect()
        _ = try clean.call("db.join", ["token": .string(a.key.token!), "db": "team"])
        _ = try clean.call("peer.add", ["db": "team", "address": .string(a.node.address)])
        let replicas = [a.client, try b.connect(), clean]
        let converged = try eventually(timeout: .seconds(120)) {
            let states = try replicas.map { try replicaState($0, "team") }
            let fuzzCount = try a.client.call("query.count", ["db": "team", "collection": "fuzz"])["count"]?.intValue
            return Set(states.map(\.hash)).count == 1 && fuzzCount == Int64(honestIDs.count)
        }
        let final = try replicas.map { try replicaState($0, "team") }
        let cleanSync = try clean.call("sync.status", ["db": "team"]).jsonText
        #expect(converged, "replicas: \(final); clean replica's sync: \(cleanSync)")
        for c in replicas {
            // Not one refused change was stored: the fuzz collection holds the honest documents and nothing else.
            let count = { (filter: JSONValue) in try c.call("query.count", ["db": "team", "collection": "fuzz", "where": filter]) }
            #expect(try count([:])["count"]?.intValue == Int64(honestIDs.count))
            #expect(try count(["_id": ["$prefix": "ok-"]])["count"]?.intValue == Int64(honestIDs.count))
            for page in stride(from: 0, to: honestIDs.count, by: 5_000) {
                let ids = honestIDs[page..<min(honestIDs.count, page + 5_000)]
                let found = try c.call(
                    "doc.getMany", ["db": "team", "collection": "fuzz", "ids": .array(ids.map(JSONValue.string))])["docs"]?.arrayValue ?? []
                #expect(found.count == ids.count && found.allSatisfy { $0 != .null }, "honest documents missing")
            }
            // Every acknowledged local write is there; a write left unanswered by a restart may or may not be.
            let local = try c.call("query.count", ["db": "team", "collection": "local"])["count"]?.intValue ?? -1
            #expect(local >= Int64(localIDs.count) && local <= Int64(localIDs.count + unanswered), "\(local) local documents")
            let found = try c.call(
                "doc.getMany", ["db": "team", "collection": "local", "ids": .array(localIDs.map(JSONValue.string))])["docs"]?.arrayValue ?? []
            #expect(found.count == localIDs.count && found.allSatisfy { $0 != .null }, "acknowledged local writes missing")
        }
        let rejected = try a.rejected().merging(rejectedBefore, uniquingKeysWith: +)
        print("sync fuzzer: rejections on A \(rejected.sorted { $0.key < $1.key })")
        for reason in ["malformed", "invalid_change", "clock_ahead", "bad_payload", "fork"] {
            #expect(rejected[reason, default: 0] > 0, "no \(reason) rejection: \(rejected)")
        }
        a.daemon.stop()
        b.stop(kill9: false)
        cc.stop()
    }
}
