import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

/// Issue #49: the sync fuzzer also sends membership operations from every role, to a daemon whose space has a log.
@Suite(.serialized) struct MembershipFuzzTests {
    /// The seeded membership fuzzer (`MembershipFuzzer`): up to `BLAZE_MFUZZ_MESSAGES` (20,000) messages within
    /// `BLAZE_MFUZZ_SECONDS` (40) over connections authenticated in turn as a reader, a writer, a second admin and a
    /// removed writer, each admitted through the real invite path, while the daemon's own admin writes, invites and
    /// revokes (`AdminWork`). Afterwards the daemon is up and serves local clients; the members it shows survive a
    /// restart; it lists exactly the expected members and roles (the fuzzer's admin may only have added devices of its
    /// pool) at the epoch its admin's revocations made; in the log it stored, every operation of its admin takes
    /// effect, none of the reader, the writer or the removed device does, and none of theirs was kept unless an
    /// admin's operation names it; and the admin still revokes, and admits a second daemon that receives the data.
    @Test func membershipFuzzerFromEveryRoleLeavesTheAdminInCharge() throws {
        let seed = testSeed("membership fuzzer")
        let environment = ProcessInfo.processInfo.environment
        let total = Int(environment["BLAZE_MFUZZ_MESSAGES"] ?? "") ?? 20_000
        let budget = Double(environment["BLAZE_MFUZZ_SECONDS"] ?? "") ?? 40
        print("membership fuzzer: \(total) messages within \(Int(budget)) s (replay with BLAZE_SEED=\(seed))")
        let dirA = TempDir()
        var a = try syncDaemon(dir: dirA)
        var ca = try a.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try ca.call("doc.put", ["db": "team", "collection": "notes", "id": "seed", "doc": ["n": 1]])
        let na = try nodeID(ca, "team")

        // The roles, each admitted by the admin with an invite of its own; the removed one is revoked at once.
        var identities: [FuzzRole: DeviceIdentity] = [:]
        var keys: [FuzzRole: SpaceKey] = [:]
        for role in FuzzRole.allCases {
            let (m, _, view) = try HostileMember.admitted(try ca.invite("team", role: role.inviteRole))
            m.close()
            try #require(view.member(m.identity.nodeID)?.role.name == role.inviteRole && view.commitsKeys)
            (identities[role], keys[role]) = (m.identity, m.key)
        }
        let hex = identities.mapValues { hexString($0.nodeID) }
        _ = try ca.call("db.revoke", ["db": "team", "device": .string(hex[.removed]!)])
        var revocations = 1
        let space = keys[.reader]!.id
        let port = try #require(Int(try a.syncAddress().split(separator: ":").last ?? ""))

        var fuzzer = MembershipFuzzer(seed: seed, space: space, key: keys[.reader]!, identities: identities)
        fuzzer.observe(try membershipOps(dataDir: a.dataDir, db: "team"))
        let writers = LocalWriters(sockets: [(a.socket, "a")])
        let work = AdminWork(socket: a.socket, db: "team")
        var open: [FuzzRole: HostileMember] = [:]
        var connections: [FuzzRole: Int] = [:], refused: [FuzzRole: Int] = [:], closed: [FuzzRole: Int] = [:]
        var sentBy: [String: Int] = [:]
        var sent = 0, step = 0, refusedInARow = 0
        var generation = 0.0, connecting = 0.0
        let started = Date()
        while sent < total && Date().timeIntervalSince(started) < budget {
            let role = FuzzRole.allCases[step % FuzzRole.allCases.count]
            step += 1
            if step % 200 == 0 {
                // The fuzzer's view of the log follows the daemon's: its heads are parents of new operations.
                fuzzer.observe(try membershipOps(dataDir: a.dataDir, db: "team"))
                fuzzer.issuedInvites = work.invites.withLock { $0 }
            }
            if open[role] == nil {
                let m = HostileMember(key: keys[role]!, identity: identities[role]!)
                let connectStart = Date()
                defer { connecting += Date().timeIntervalSince(connectStart) }
                do {
                    try m.connect(port: port, timeoutSeconds: 10)
                } catch {
                    // Refused in the handshake (expected of the removed device, if the daemon chose to), or closed
                    // before it: counted; a bounded number of times in a row.
                    m.close()
                    refused[role, default: 0] += 1
                    refusedInARow += 1
                    try #require(refusedInARow < 200, "the daemon refused 200 connections in a row: \(error)")
                    usleep(20_000)  // a pause before trying again, as a device backs off
                    continue
                }
                refusedInARow = 0
                m.startDraining()
                open[role] = m
                connections[role, default: 0] += 1
            }
            let generating = Date()
            let (kind, message) = fuzzer.next(as: role)
            generation += Date().timeIntervalSince(generating)
            do {
                try open[role]!.send(message)
                sent += 1
                sentBy["\(role.rawValue) \(kind)", default: 0] += 1
            } catch {
                // The daemon closed the connection (it refused something, or ended a removed device's session).
                open[role]!.close()
                open[role] = nil
                closed[role, default: 0] += 1
            }
        }
        for m in open.values { m.close() }
        let seconds = Date().timeIntervalSince(started)
        print(
            "membership fuzzer: \(sent) messages in \(Int(seconds)) s (\(Int(generation)) s generating them, "
                + "\(Int(connecting)) s connecting); connections \(show(connections)), refused in the handshake "
                + "\(show(refused)), closed by the daemon \(show(closed)); \(fuzzer.counts.sorted { $0.key < $1.key })")

        // The daemon is up, serves local clients, and its admin's work went on throughout.
        try a.expectServing(db: "team")
        #expect(writers.stop())
        #expect(work.stop(), "the admin's work did not end")
        let failures = work.failures.withLock { $0 }, revoked = work.revoked.withLock { $0 }
        #expect(failures.isEmpty, "the admin's invites and revocations failed: \(failures)")
        #expect(!revoked.isEmpty, "the admin revoked nobody while the fuzzer ran")
        revocations += revoked.count

        // Rejections the fuzzing must have caused on the daemon.
        let rejected = try rejections(ca)
        print("membership fuzzer: rejections \(rejected.sorted { $0.key < $1.key }), messages \(sentBy.sorted { $0.key < $1.key })")
        for reason in ["malformed", "bad_snapshot"] { #expect(rejected[reason, default: 0] > 0, "no \(reason): \(rejected)") }
        if sentBy["removed state", default: 0] > 0 { #expect(rejected["revoked", default: 0] > 0, "\(rejected)") }

        // What the daemon shows survives a restart: every operation it took was stored. (It may still be taking the
        // last operations the fuzzer sent: what it shows must come to match what it stored first.)
        let listed = { (c: BlazeConnection) in try members(c, "team").map { "\($0.device) \($0.role) \($0.removed)" }.sorted() }
        let dataDir = a.dataDir
        let stored = {
            try MembershipState(space: space, ops: membershipOps(dataDir: dataDir, db: "team")).members.values
                .map { "\($0.keys.nodeIDHex) \($0.role.name) \(!$0.isCurrent)" }.sorted()
        }
        #expect(try eventually { try listed(ca) == stored() }, "the members shown are not those stored")
        let shown = try listed(ca)
        a.stop()
        a = try syncDaemon(dir: dirA)
        ca = try a.connect()
        let after = try listed(ca)
        #expect(after == shown, "across a restart, gone: \(Set(shown).subtracting(after)), new: \(Set(after).subtracting(shown))")

        // The members are exactly those expected, at the epoch the admin's revocations made.
        var expected: [String: (role: String, removed: Bool)] = [na: ("admin", false)]
        for role in FuzzRole.allCases { expected[hex[role]!] = (role.inviteRole, role == .removed) }
        for r in revoked { expected[r.device] = (r.role, true) }
        try expectMembers(ca, expected, fuzzer: fuzzer)
        #expect(try ca.call("db.members", ["db": "team"])["epoch"]?.intValue == Int64(1 + revocations))

        // What the log kept: the fuzzer's non-admin roles took no effect, and nothing of theirs stayed unless an
        // admin's operation names it.
        let held = try membershipOps(dataDir: a.dataDir, db: "team")
        let log = MembershipState(space: space, ops: held)
        let byHash = Dictionary(held.map { ($0.hash, $0) }, uniquingKeysWith: { first, _ in first })
        let appliedAuthors = Set(log.applied.compactMap { byHash[$0]?.author.nodeIDHex })
        #expect(appliedAuthors.isSubset(of: [na, hex[.admin]!]), "operations took effect by \(appliedAuthors)")
        let applied = Set(log.applied)
        let idle = held.filter { $0.author.nodeIDHex == na && !applied.contains($0.hash) }
        #expect(idle.count == 0, "\(idle.count) operations of the admin do not take effect in the stored log")
        let admins = Set(log.members.values.filter { $0.role == .admin }.map(\.keys.nodeIDHex))
        var named = Set<EntryHash>()
        var stack = held.filter { admins.contains($0.author.nodeIDHex) }.flatMap(\.parents)
        while let hash = stack.popLast() {
            if named.insert(hash).inserted, let op = byHash[hash] { stack += op.parents }
        }
        let others: Set<String> = [hex[.reader]!, hex[.writer]!, hex[.removed]!]
        let kept = held.filter { others.contains($0.author.nodeIDHex) }
        let stray = kept.filter { !named.contains($0.hash) }
        let roleOf = Dictionary(uniqueKeysWithValues: hex.map { ($0.value, $0.key.rawValue) })
        let strayShown = stray.prefix(5).map { op in
            let namedBy = held.filter { $0.parents.contains(op.hash) }.map { roleOf[$0.author.nodeIDHex] ?? $0.author.nodeIDHex }
            let parentsHeld = op.parents.filter { byHash[$0] != nil }.count
            return "\(roleOf[op.author.nodeIDHex]!) \(op.action) parents \(op.parents.count) held \(parentsHeld) "
                + "void \(log.void[op.hash] ?? "-") waiting \(log.waiting.contains(op.hash)) named by \(namedBy)"
        }
        #expect(stray.count == 0, "kept \(stray.count) operations of non-admins that no admin's operation names: \(strayShown)")
        var notInEffect: [String: Int] = [:]
        for op in held where log.void[op.hash] != nil || log.waiting.contains(op.hash) {
            notInEffect[op.author.nodeIDHex, default: 0] += 1
        }
        #expect(notInEffect.values.allSatisfy { $0 <= MembershipLog.maxOpsPerAuthor }, "\(notInEffect)")
        print(
            "membership fuzzer: the log holds \(held.count) operations (\(log.applied.count) in effect, "
                + "\(notInEffect.values.reduce(0, +)) not), \(kept.count) of non-admins, all named by an admin's")

        // The admin still revokes a member, and admits a second daemon, which receives the data.
        let last = try ca.call("db.revoke", ["db": "team", "device": .string(hex[.writer]!)])
        #expect(last["epoch"]?.intValue == Int64(2 + revocations))
        expected[hex[.writer]!] = ("writer", true)
        let b = try syncDaemon()
        let cb = try b.connect()
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        let converged = eventually(timeout: .seconds(60)) {
            guard let got = try? replicaState(cb, "team"), let held = try? replicaState(ca, "team") else { return false }
            return got == held
        }
        let (stateB, stateA) = (try replicaState(cb, "team"), try replicaState(ca, "team"))
        #expect(converged, "B: \(stateB), A: \(stateA)")
        expected[try nodeID(cb, "team")] = ("writer", false)
        try expectMembers(ca, expected, fuzzer: fuzzer)
        #expect(try eventually { try listed(cb) == listed(ca) }, "B lists other members than A")
        try a.expectServing(db: "team")
        a.stop()
        b.stop()
    }

    /// Checks that `c` lists exactly the `expected` devices with their roles and removals, plus only devices of the
    /// fuzzer's admin's pool, current and with the role it adds them with.
    private func expectMembers(
        _ c: BlazeConnection, _ expected: [String: (role: String, removed: Bool)], fuzzer: MembershipFuzzer,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        var missing = expected
        var wrong: [String] = []
        var pool = 0
        for m in try members(c, "team") {
            if let e = missing.removeValue(forKey: m.device) {
                if e.role != m.role || e.removed != m.removed { wrong.append("\(m.device): \(m.role) \(m.removed), not \(e)") }
            } else if let role = fuzzer.adminPoolRole(of: m.device), role.name == m.role, !m.removed {
                pool += 1
            } else {
                wrong.append("\(m.device): \(m.role) \(m.removed), not expected")
            }
        }
        #expect(missing.isEmpty, "not listed: \(missing)", sourceLocation: sourceLocation)
        #expect(wrong.isEmpty, "\(wrong)", sourceLocation: sourceLocation)
        print("membership fuzzer: \(expected.count - missing.count) expected members listed, \(pool) added by the fuzzer's admin")
    }

    /// Counts by role, in the roles' order.
    private func show(_ counts: [FuzzRole: Int]) -> String {
        FuzzRole.allCases.map { "\($0.rawValue) \(counts[$0] ?? 0)" }.joined(separator: ", ")
    }

    /// Rejections counted for `team`, by reason, over every peer.
    private func rejections(_ c: BlazeConnection) throws -> [String: Int64] {
        let peers = try c.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
        var out: [String: Int64] = [:]
        for p in peers {
            for (reason, n) in p["rejected"]?.objectValue ?? [:] { out[reason, default: 0] += n.intValue ?? 0 }
        }
        return out
    }
}
