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

/// The node id of a daemon's device (as `db.info` reports it for `db`).
func nodeID(_ c: BlazeConnection, _ db: String) throws -> String {
    try #require(try c.call("db.info", ["db": .string(db)])["nodeId"]?.stringValue)
}

/// `db.members` of `db` as (device, role, removed) triples, in order of addition.
func members(_ c: BlazeConnection, _ db: String) throws -> [(device: String, role: String, removed: Bool)] {
    try (c.call("db.members", ["db": .string(db)])["members"]?.arrayValue ?? []).map {
        ($0["device"]?.stringValue ?? "", $0["role"]?.stringValue ?? "", $0["removedBy"] != .null)
    }
}

/// The membership operations a daemon's database holds, read from its file.
func membershipOps(dataDir: String, db: String) throws -> [MembershipOp] {
    let queue = try DatabaseQueue(path: dataDir + "/databases/\(db).db")
    return try queue.read { d in try Data.fetchAll(d, sql: "SELECT bytes FROM sync_membership") }.map {
        try MembershipOp(bytes: Array($0))
    }
}

/// The sealed entries of `origin` (hex) a daemon's database holds, read from its file.
func sealedEntries(dataDir: String, db: String, origin: String) throws -> [SealedEntry] {
    let queue = try DatabaseQueue(path: dataDir + "/databases/\(db).db")
    return try queue.read { d in
        try Row.fetchAll(d, sql: "SELECT bytes, hash FROM sync_entries WHERE origin = ? ORDER BY seq", arguments: [Data(hexBytes(origin)!)])
    }.map { try SealedEntry(stored: Array($0[0] as Data), hash: Array($0[1] as Data)) }
}

/// Membership with real daemons (SYNC.md §9): invites, roles, revocation and rotation, concurrent admins.
@Suite(.serialized) struct MembershipDaemonTests {
    @Test func threeDevicesJoinWithInvitesThatWorkOnceAndExpire() throws {
        let a = try syncDaemon(), b = try syncDaemon(), c = try syncDaemon(), d = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect(), cc = try c.connect(), cd = try d.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try ca.call("doc.put", ["db": "team", "collection": "n", "id": "a0", "doc": ["by": "a"]])
        let tokenB = try ca.invite("team")
        _ = try cb.call("db.join", ["token": .string(tokenB), "db": "team"])
        _ = try cc.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        // The joiner got the history at once, and every member sees the same three devices.
        #expect(try eventually { try replicaState(cb, "team").docs == 1 && replicaState(cc, "team").docs == 1 })
        let (na, nb, nc) = (try nodeID(ca, "team"), try nodeID(cb, "team"), try nodeID(cc, "team"))
        for conn in [ca, cb, cc] {
            #expect(try eventually { try members(conn, "team").map(\.device) == [na, nb, nc] })
        }
        #expect(try members(ca, "team").map(\.role) == ["admin", "writer", "writer"])
        for (conn, tag) in [(ca, "a"), (cb, "b"), (cc, "c")] {
            for i in 1...20 { _ = try conn.call("doc.put", ["db": "team", "collection": "n", "id": .string("\(tag)\(i)"), "doc": ["i": .int(Int64(i))]]) }
        }
        // C syncs with A only; B's writes reach it through A.
        #expect(try eventually(timeout: .seconds(60)) {
            let states = try [ca, cb, cc].map { try replicaState($0, "team") }
            return states[0].docs == 61 && states.allSatisfy { $0 == states[0] }
        })
        // The same invite a second time: refused with a clear error, counted, and nothing left behind.
        expectRPCError(cd, "db.join", ["token": .string(tokenB), "db": "late"], code: -32020, kind: "invite_used")
        #expect(try cd.call("db.list")["databases"]?.arrayValue?.contains { $0["name"] == "late" } == false)
        #expect(try ca.call("sync.status")["invitesRefused"]?["invite_used"] == 1)
        // An expired invite is refused the same way.
        let short = try ca.call("db.invite", ["db": "team", "role": "reader", "expiresIn": 1])
        let expiresAt = try #require(short["expiresAtMs"]?.intValue)
        #expect(eventually { Int64(Date().timeIntervalSince1970 * 1000) > expiresAt })
        expectRPCError(cd, "db.join", ["token": try #require(short["token"])], code: -32020, kind: "invite_expired")
        #expect(try ca.call("sync.status")["invitesRefused"]?["invite_expired"] == 1)
        #expect(try members(ca, "team").count == 3)
        for daemon in [a, b, c] { daemon.stop() }
        d.stop(expectErrors: false)
    }

    @Test func revokingAnOfflineDeviceRotatesTheKeyAndShutsItOut() throws {
        let a = try syncDaemon(), b = try syncDaemon()
        let dirC = TempDir()
        var c = try syncDaemon(dir: dirC)
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        _ = try c.connect().call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        _ = try c.connect().call("doc.put", ["db": "team", "collection": "n", "id": "fromC", "doc": ["v": 1]])
        _ = try ca.call("doc.put", ["db": "team", "collection": "n", "id": "before", "doc": ["v": 1]])
        #expect(try eventually {
            try [ca, cb, c.connect()].map { try replicaState($0, "team") }.allSatisfy { $0.docs == 2 }
        })
        let nc = try nodeID(try c.connect(), "team"), na = try nodeID(ca, "team")
        let cBefore = try replicaState(try c.connect(), "team")
        c.stop()
        // C is offline: A revokes it. The key rotates; A and B keep writing without any step on B.
        let revoked = try ca.call("db.revoke", ["db": "team", "device": .string(nc)])
        #expect(revoked["epoch"] == 2)
        expectRPCError(ca, "db.revoke", ["db": "team", "device": .string(nc)], code: -32020, kind: "already_removed")
        _ = try ca.call("doc.put", ["db": "team", "collection": "n", "id": "afterA", "doc": ["secret": "a"]])
        _ = try cb.call("doc.put", ["db": "team", "collection": "n", "id": "afterB", "doc": ["secret": "b"]])
        #expect(try eventually { try replicaState(ca, "team") == replicaState(cb, "team") && replicaState(cb, "team").docs == 4 })
        #expect(try eventually { try members(cb, "team").map(\.removed) == [false, false, true] })
        #expect(try cb.call("db.members", ["db": "team"])["epoch"] == 2)
        // C comes back while A, its only peer, has paused the space (C would otherwise learn of its removal at once
        // and refuse its own writes), writes, and tries to sync once A resumes: refused at the handshake, it receives
        // nothing new and nothing it writes is accepted anywhere; its old data stays as it was.
        _ = try ca.call("sync.pause", ["db": "team"])
        c = try syncDaemon(dir: dirC)
        let cc = try c.connect()
        _ = try cc.call("doc.put", ["db": "team", "collection": "n", "id": "lateC", "doc": ["v": 2]])
        _ = try ca.call("sync.resume", ["db": "team"])
        _ = try cc.call("sync.now", ["db": "team"])
        #expect(try eventually {
            let peers = try ca.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
            return peers.contains { ($0["rejected"]?["revoked"]?.intValue ?? 0) > 0 }
        })
        #expect(try replicaState(cc, "team").docs == cBefore.docs + 1)
        for conn in [ca, cb] {
            expectRPCError(conn, "doc.get", ["db": "team", "collection": "n", "id": "lateC"], code: RPCErrorCode.notFound)
        }
        expectRPCError(cc, "doc.get", ["db": "team", "collection": "n", "id": "afterA"], code: RPCErrorCode.notFound)
        // With the keys C holds (every envelope sealed to it, the old share secret included), A's entries written
        // after the rotation do not open; those from before do.
        let ops = try membershipOps(dataDir: c.dataDir, db: "team")
        let identityC = try DeviceIdentity.loadOrCreate(directory: c.dataDir + "/keys")
        let view = MembershipState(space: ops[0].space, ops: ops)
        let ring = view.ring(view.keys(for: identityC))
        #expect(!ring.isEmpty && ring.allSatisfy { $0.epoch == 1 })
        let oldKey = try SpaceKey(id: view.space, capability: [UInt8](repeating: 0, count: 32), epoch: 1, current: ring[0].secret, ring: ring)
        let entries = try sealedEntries(dataDir: a.dataDir, db: "team", origin: na)
        let (old, new) = (entries.filter { $0.header.epoch == 1 }, entries.filter { $0.header.epoch == 2 })
        #expect(!old.isEmpty && !new.isEmpty, "A sealed under both epochs: \(entries.map(\.header.epoch))")
        for e in old { #expect((try? e.open(with: oldKey)) != nil) }
        for e in new { #expect(throws: SyncRejection.self) { try e.open(with: oldKey) } }
        a.stop()
        b.stop()
        c.stop(expectErrors: false)
    }

    @Test func aReadersWritesAreRefusedLocallyAndByEveryMemberOnTheWire() throws {
        let a = try syncDaemon(), b = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try ca.call("doc.put", ["db": "team", "collection": "n", "id": "seed", "doc": ["v": 1]])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team", role: "reader")), "db": "team"])
        #expect(try eventually { try replicaState(cb, "team").docs == 1 })
        expectRPCError(cb, "doc.put", ["db": "team", "collection": "n", "id": "x", "doc": ["v": 1]], code: -32020, kind: "read_only")
        expectRPCError(cb, "tx.commit", ["db": "team", "ops": [["op": "insert", "collection": "n", "doc": ["v": 1]]]], code: -32020, kind: "read_only")
        // A harness joins as a reader with its own invite, then signs a write with its key and forces it onto the wire.
        let (reader, _, view) = try HostileMember.admitted(try ca.invite("team", role: "reader"), seconds: 10)
        #expect(view.member(reader.identity.nodeID)?.role == .reader)
        try reader.send(SyncTarget.change(reader, [HostileMember.docOp("n", "forged", set: ["v": .int(1)])]))
        #expect(try eventually {
            let peers = try ca.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
            return peers.contains { ($0["rejected"]?["reader"]?.intValue ?? 0) > 0 }
        })
        expectRPCError(ca, "doc.get", ["db": "team", "collection": "n", "id": "forged"], code: RPCErrorCode.notFound)
        reader.close()
        a.stop()
        b.stop()
    }

    @Test func aCapabilityHolderGetsNothingFromAMemberAndNothingItSignsIsAccepted() throws {
        let a = try syncDaemon(), b = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        for i in 0..<10 {
            _ = try ca.call("doc.put", ["db": "team", "collection": "notes", "id": .string("fromA-\(i)"), "doc": ["secretField": .string("confidential \(i)")]])
            _ = try cb.call("doc.put", ["db": "team", "collection": "notes", "id": .string("fromB-\(i)"), "doc": ["secretField": .string("confidential \(i)")]])
        }
        #expect(try eventually { try replicaState(ca, "team").docs == 20 && replicaState(ca, "team") == replicaState(cb, "team") })
        // What a relay is given, and what every invite carries: the space id and its capability, nothing that opens
        // entries. It passes the handshake with a key of its own, and a member that the log does not list it sends
        // nothing: no STATE, no entries, no log (SYNC.md §9, "Relay capability").
        let invite = try InviteToken(text: try ca.invite("team"))
        let relay = try RelayCapability(text: RelayCapability(key: try SpaceKey(id: invite.space, capability: invite.capability)).text)
        let holder = HostileMember(key: relay.key)
        try holder.connect(port: try #require(Int(invite.address.split(separator: ":").last ?? "")), timeoutSeconds: 3)
        try holder.send(HostileMember.state([]))
        var types: [UInt8] = []
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline, let message = try holder.receive() { types.append(message[0]) }
        #expect(types.isEmpty, "\(types)")
        // An entry it seals (with a key of its own) and signs is accepted by no member.
        let epoch = try #require(try ca.call("db.members", ["db": "team"])["epoch"]?.intValue)
        holder.key = try SpaceKey(
            id: invite.space, capability: invite.capability, epoch: Epoch(UInt32(epoch)), current: SpaceKey.randomSecret(), ring: [])
        try holder.send(SyncTarget.change(holder, [HostileMember.docOp("notes", "forged", set: ["v": .int(1)])]))
        #expect(try eventually {
            let peers = try ca.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
            return peers.contains { ($0["rejected"]?["not_a_member"]?.intValue ?? 0) > 0 }
        })
        for conn in [ca, cb] {
            expectRPCError(conn, "doc.get", ["db": "team", "collection": "notes", "id": "forged"], code: RPCErrorCode.notFound)
        }
        holder.close()
        a.stop()
        b.stop()
    }

    @Test func aPeerAMemberDialsGetsNothingUntilTheLogListsIt() throws {
        let a = try syncDaemon(), b = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        _ = try ca.call("doc.put", ["db": "team", "collection": "notes", "id": "n1", "doc": ["secretField": "confidential"]])
        #expect(try eventually { try replicaState(cb, "team").docs == 1 })
        // A capability holder (anyone who saw an invite) listens with a key of its own, and a member is configured
        // to dial it: the member sends it nothing, as to one that dialed in (SYNC.md §9, "Relay capability").
        let invite = try InviteToken(text: try ca.invite("team"))
        let holder = HostileMember(key: try SpaceKey(id: invite.space, capability: invite.capability))
        let listener = try HostileMember.listen()
        defer { Glibc.close(listener.fd) }
        _ = try ca.call("peer.add", ["db": "team", "address": .string("127.0.0.1:\(listener.port)")])
        try holder.accept(listener: listener.fd, timeoutSeconds: 3)
        try holder.send(HostileMember.state([]))
        var types: [UInt8] = []
        var shown: [MembershipOp] = []
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline, let message = try holder.receive() {
            if message[0] == 5 { shown += try Self.decodeMembers(message) } else if message[0] != HostileMember.pingType { types.append(message[0]) }
        }
        // Only how A was added (its create: it made the space) — no STATE, entries, acknowledgements, or the rest of
        // the log.
        #expect(types.isEmpty, "\(types)")
        #expect(shown.count == 1 && shown.allSatisfy { if case .create = $0.action { true } else { false } }, "\(shown.map(\.action))")
        holder.close()
        // A member it dials is served as ever: B, listed, gets A's next write over a link A dials.
        _ = try ca.call("peer.add", ["db": "team", "address": .string(try b.syncAddress())])
        _ = try ca.call("doc.put", ["db": "team", "collection": "notes", "id": "n2", "doc": ["v": 2]])
        #expect(try eventually { try replicaState(cb, "team") == replicaState(ca, "team") })
        a.stop(expectErrors: false)
        b.stop()
    }

    @Test func twoMembersAddedApartByTwoAdminsFindEachOtherOnTheLinkOneDials() throws {
        let a = try syncDaemon(), b = try syncDaemon(), c = try syncDaemon(), d = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect(), cc = try c.connect(), cd = try d.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team", role: "admin")), "db": "team"])
        #expect(try eventually { try members(cb, "team").count == 2 })
        // The two admins part: each admits a device the other never hears of.
        _ = try cb.call("peer.remove", ["db": "team", "address": .string(try a.syncAddress())])
        _ = try cc.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        _ = try cd.call("db.join", ["token": .string(try cb.invite("team")), "db": "team"])
        let (seenByC, seenByD) = (try members(cc, "team").count, try members(cd, "team").count)
        #expect(seenByC == 3 && seenByD == 3)
        // C dials D, which neither log lists: C shows how it was added, D then serves it, and they sync.
        _ = try cc.call("peer.add", ["db": "team", "address": .string(try d.syncAddress())])
        _ = try cc.call("doc.put", ["db": "team", "collection": "n", "id": "fromC", "doc": ["v": 1]])
        for conn in [cc, cd] { #expect(try eventually { try members(conn, "team").count == 4 }) }
        #expect(eventually { (try? cd.call("doc.get", ["db": "team", "collection": "n", "id": "fromC"])) != nil })
        for daemon in [a, b, c, d] { daemon.stop(expectErrors: false) }
    }

    @Test func twoAdminsRevokingEachOtherWhilePartitionedConvergeOnTheSeniorOne() throws {
        let a = try syncDaemon(), b = try syncDaemon(), c = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect(), cc = try c.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team", role: "admin")), "db": "team"])
        _ = try cc.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        _ = try cc.call("peer.add", ["db": "team", "address": .string(try b.syncAddress())])
        let (na, nb, nc) = (try nodeID(ca, "team"), try nodeID(cb, "team"), try nodeID(cc, "team"))
        for conn in [ca, cb, cc] { #expect(try eventually { try members(conn, "team").count == 3 }) }
        // Partitioned: each admin removes the other.
        for conn in [ca, cb, cc] { _ = try conn.call("sync.pause", ["db": "team"]) }
        _ = try ca.call("db.revoke", ["db": "team", "device": .string(nb)])
        _ = try cb.call("db.revoke", ["db": "team", "device": .string(na)])
        _ = try ca.call("doc.put", ["db": "team", "collection": "n", "id": "byA", "doc": ["v": 1]])
        for conn in [ca, cb, cc] { _ = try conn.call("sync.resume", ["db": "team"]) }
        // SYNC.md §9: the senior admin (the creator) goes first, so B's removal of A is void; every device,
        // B included (it hears of it through C), ends with A and C as members and B removed.
        for conn in [ca, cb, cc] {
            let converged = try eventually(timeout: .seconds(30)) {
                try members(conn, "team").map { "\($0.device) \($0.removed)" } == ["\(na) false", "\(nb) true", "\(nc) false"]
            }
            let seen = try members(conn, "team"), status = try conn.call("sync.status", ["db": "team"]).jsonText
            #expect(converged, "\(seen) \(status)")
        }
        #expect(try eventually { try replicaState(cc, "team") == replicaState(ca, "team") })
        expectRPCError(cb, "doc.put", ["db": "team", "collection": "n", "id": "x", "doc": ["v": 1]], code: -32020, kind: "read_only")
        a.stop()
        b.stop(expectErrors: false)
        c.stop()
    }

    /// An operation's time is the author's clock, shown and never trusted: an admin's add and removal stamped 2^64 − 1
    /// ms are listed (clamped to the largest integer JSON carries exactly) instead of trapping the daemon in
    /// `db.members` (found by the membership fuzzer, issue #49).
    @Test func operationsStampedPastTheLargestIntegerAreListedWithoutCrashing() throws {
        let a = try syncDaemon()
        let ca = try a.connect()
        _ = try ca.call("db.create", ["db": "team"])
        let (admin, ops, view) = try HostileMember.admitted(try ca.invite("team", role: "admin"))
        let space = view.space, extra = DeviceIdentity()
        let add = try MembershipOp(
            space: space, author: admin.identity, timeMs: .max, parents: view.heads, action: .add(device: extra.publicKeys, role: .reader))
        // A valid rotation that removes the device again: its key committed to and sealed to both remaining members.
        let secret = SpaceKey.randomSecret(), epoch = view.currentEpoch.next
        let remove = try MembershipOp(
            space: space, author: admin.identity, timeMs: .max, parents: [add.hash], action: .remove(device: extra.nodeID, cutoff: 0, epoch: epoch),
            envelopes: try MembershipState(space: space, ops: ops).current.map {
                try KeyEnvelope(sealing: secret, space: space, epoch: epoch, keyOp: KeyEnvelope.thisOp, to: $0.keys)
            },
            commitment: KeyEnvelope.commitment(secret: secret, space: space, epoch: epoch))
        try admin.send(HostileMember.members([add, remove]))
        admin.startDraining()
        let listed = { try ca.call("db.members", ["db": "team"])["members"]?.arrayValue?.first { $0["device"]?.stringValue == hexString(extra.nodeID) } }
        #expect(try eventually { try listed()?["removedAtMs"] != nil && listed()?["removedAtMs"] != .null })
        #expect(try listed()?["addedAtMs"]?.intValue == Int64.max && listed()?["removedAtMs"]?.intValue == Int64.max)
        try a.expectServing(db: "team")
        admin.close()
        a.stop()
    }

    /// The operations of a `MEMBERS` message (SYNC.md §8).
    static func decodeMembers(_ message: [UInt8]) throws -> [MembershipOp] {
        var r = ByteReader(message[1...])
        var ops: [MembershipOp] = []
        for _ in 0..<(r.readUInt32() ?? 0) {
            guard let n = r.readUInt32(), let bytes = r.read(Int(n)) else { throw HostileError("bad MEMBERS") }
            ops.append(try MembershipOp(bytes: Array(bytes)))
        }
        return ops
    }
}
