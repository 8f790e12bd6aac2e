import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import GRDB
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Sync through `blaze-relay` (Protocol/RELAY.md), with real processes.
@Suite(.serialized) struct RelayTests {
    @Test func twoDaemonsNeverOnlineTogetherConvergeThroughTheRelay() throws {
        let relay = try RelayProcess()
        let dirA = TempDir(), dirB = TempDir()
        var a = try syncDaemon(dir: dirA), b = try syncDaemon(dir: dirB)
        // Set-up, both running: A shares, B joins, the relay serves the space, both add it as a peer.
        var ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        let capability = try ca.relayCapability("team")
        #expect(try cb.call("db.relayCapability", ["db": "team"])["capability"]?.stringValue == capability)
        try relay.addSpace(capability)
        for c in [ca, cb] { _ = try c.call("peer.add", ["db": "team", "address": .string(relay.address)]) }
        let (na, nb) = (try nodeID(ca, "team"), try nodeID(cb, "team"))
        b.stop()
        // A writes alone, hands its entries to the relay, and stops.
        for i in 0..<50 {
            _ = try ca.call("doc.put", ["db": "team", "collection": "notes", "id": .string("a\(i)"), "doc": ["text": .string("written by A \(i)")]])
        }
        let seqA = try ownSeq(ca, "team")
        #expect(try eventually { try relay.held()[na] == seqA }, "the relay holds A's \(seqA) entries")
        a.stop()
        // B starts alone, receives A's documents from the relay, writes, and stops.
        b = try syncDaemon(dir: dirB)
        cb = try b.connect()
        #expect(try eventually { try replicaState(cb, "team").docs == 50 })
        for i in 0..<30 {
            _ = try cb.call("doc.put", ["db": "team", "collection": "notes", "id": .string("b\(i)"), "doc": ["text": .string("written by B \(i)")]])
        }
        _ = try cb.call("doc.patch", ["db": "team", "collection": "notes", "id": "a0", "set": ["text": "edited by B"]])
        let seqB = try ownSeq(cb, "team")
        #expect(try eventually { try relay.held()[nb] == seqB }, "the relay holds B's \(seqB) entries")
        let final = try replicaState(cb, "team")
        b.stop()
        // A starts alone and ends where B did.
        a = try syncDaemon(dir: dirA)
        ca = try a.connect()
        #expect(try eventually { try replicaState(ca, "team") == final })
        #expect(seqA >= 50 && seqB >= 31)
        #expect(try ca.call("doc.get", ["db": "team", "collection": "notes", "id": "a0"])["doc"]?["text"] == "edited by B")
        // The relay's file holds no content, id, collection or field name.
        let bytes = try Data(contentsOf: URL(fileURLWithPath: relay.dataDir + "/relay.db"))
        let text = String(decoding: bytes, as: UTF8.self)
        for needle in ["written by", "edited by", "notes", "text", "\"a0\""] { #expect(!text.contains(needle), "\(needle) in the relay's file") }
        a.stop()
        relay.stop()
    }

    @Test func liveWritesReachTheOtherDeviceWithTheRelayAsTheOnlyPath() throws {
        let relay = try RelayProcess()
        let a = try syncDaemon(), b = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        try relay.addSpace(try ca.relayCapability("team"))
        // B drops its direct link to A; from now on both only reach the relay.
        _ = try cb.call("peer.remove", ["db": "team", "address": .string(try a.syncAddress())])
        for c in [ca, cb] { _ = try c.call("peer.add", ["db": "team", "address": .string(relay.address)]) }
        for c in [ca, cb] {
            let peers = try c.call("peer.list", ["db": "team"])["peers"]?.arrayValue?.compactMap { $0["address"]?.stringValue }
            #expect(peers == [relay.address])
        }
        for i in 0..<20 {
            let (writer, reader) = i % 2 == 0 ? (ca, cb) : (cb, ca)
            _ = try writer.call("doc.put", ["db": "team", "collection": "live", "id": .string("w\(i)"), "doc": ["i": .int(Int64(i))]])
            // Each write arrives before the next one is made: the relay forwards them as they come.
            #expect(eventually { (try? reader.call("doc.get", ["db": "team", "collection": "live", "id": .string("w\(i)")])) != nil })
        }
        #expect(try eventually { try replicaState(ca, "team") == replicaState(cb, "team") })
        a.stop()
        b.stop()
        relay.stop()
    }

    @Test func hostileDevicesAreRefusedAndTheRelayKeepsServing() throws {
        let relay = try RelayProcess()
        let (a, ca, capability) = try sharedTeam(servedBy: relay)
        let cap = try RelayCapability(text: capability)
        // A device proving another space's capability is closed during the handshake.
        #expect(throws: (any Error).self) { try HostileMember(key: SpaceKey.generate()).connect(port: relay.port, webSocket: "/v1/sync") }
        // Bytes that are not a sealed frame close the connection.
        let garbage = HostileMember(key: cap.key)
        try garbage.connect(port: relay.port, webSocket: "/v1/sync")
        try garbage.writeAll([UInt8](repeating: 0xAB, count: 64))
        #expect(garbage.awaitClose().closed)
        // A device outside the log signs and seals entries (with a key of its own): refused, nothing stored.
        let outsider = HostileMember(key: cap.key)
        outsider.key = try SpaceKey(id: cap.space, capability: cap.capability, epoch: 1, current: SpaceKey.randomSecret(), ring: [])
        try outsider.connect(port: relay.port, webSocket: "/v1/sync")
        try outsider.send(SyncTarget.change(outsider, [HostileMember.docOp("notes", "forged", set: ["v": .int(1)])]))
        #expect(outsider.awaitClose().error == "not_a_member")
        // Membership operations it signs (a create of its own, an add of itself) never take part in the log: the
        // relay keeps none of them.
        let forger = HostileMember(key: cap.key)
        try forger.connect(port: relay.port, webSocket: "/v1/sync")
        let create = try MembershipOp(
            space: cap.space, author: forger.identity, timeMs: 1, parents: [], action: .create(salt: SpaceKey.randomBytes(16)),
            envelopes: [])
        let add = try MembershipOp(
            space: cap.space, author: forger.identity, timeMs: 2, parents: [create.hash],
            action: .add(device: DeviceIdentity().publicKeys, role: .admin), envelopes: [])
        var members: [UInt8] = [5]
        members.appendBE(UInt32(2))
        for op in [create, add] {
            members.appendBE(UInt32(op.bytes.count))
            members += op.bytes
        }
        try forger.send(members)
        // Stored in order: once its entries are refused, its operations were dealt with.
        forger.key = try SpaceKey(id: cap.space, capability: cap.capability, epoch: 1, current: SpaceKey.randomSecret(), ring: [])
        try forger.send(SyncTarget.change(forger, [HostileMember.docOp("notes", "forged", set: ["v": .int(1)])]))
        #expect(forger.awaitClose().error == "not_a_member")
        #expect(try relay.count("relay_ops") == 0)
        // A JOIN of the wrong shape (a bare secret, as before proofs) does not decode: the connection closes. (A
        // well-formed one is held for the members, who alone admit: aDeviceJoinsThroughTheRelayWithAnInviteNamingIt.)
        let joiner = HostileMember(key: cap.key)
        try joiner.connect(port: relay.port, webSocket: "/v1/sync")
        try joiner.send([6] + SpaceKey.randomBytes(48))
        #expect(joiner.awaitClose().closed)
        // A message that does not decode.
        let malformed = HostileMember(key: cap.key)
        try malformed.connect(port: relay.port, webSocket: "/v1/sync")
        try malformed.send([1, 0xFF, 0xFF, 0xFF, 0xFF])
        #expect(malformed.awaitClose().closed)
        #expect(try relay.held()[outsider.originHex] == nil)
        // The relay still serves the member.
        _ = try ca.call("peer.add", ["db": "team", "address": .string(relay.address)])
        _ = try ca.call("doc.put", ["db": "team", "collection": "notes", "id": "real", "doc": ["v": 1]])
        let na = try nodeID(ca, "team")
        #expect(try eventually { try relay.held()[na] == ownSeq(ca, "team") })
        a.stop()
        relay.stop()
    }

    @Test func devicesSyncThroughARelayServingTLS() throws {
        let dir = TempDir()
        let cert = dir.path + "/cert.pem", key = dir.path + "/key.pem"
        let made = try run(
            "/usr/bin/openssl",
            [
                "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key,
                "-out", cert, "-days", "2", "-subj", "/CN=blaze-relay test", "-addext", "subjectAltName=IP:127.0.0.1",
            ])
        try #require(made.status == 0, "openssl: \(made.err)")
        let relay = try RelayProcess(arguments: ["--tls-cert", cert, "--tls-key", key])
        #expect(relay.address.hasPrefix("wss://127.0.0.1:"))
        let a = try DaemonProcess(arguments: ["--sync-listen", "127.0.0.1:0", "--sync-tls-ca-file", cert])
        let b = try DaemonProcess(arguments: ["--sync-listen", "127.0.0.1:0", "--sync-tls-ca-file", cert])
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        try relay.addSpace(try ca.relayCapability("team"))
        _ = try cb.call("peer.remove", ["db": "team", "address": .string(try a.syncAddress())])
        for c in [ca, cb] { _ = try c.call("peer.add", ["db": "team", "address": .string(relay.address)]) }
        for i in 0..<10 {
            _ = try ca.call("doc.put", ["db": "team", "collection": "tls", "id": .string("t\(i)"), "doc": ["i": .int(Int64(i))]])
        }
        #expect(try eventually { try replicaState(ca, "team") == replicaState(cb, "team") && replicaState(cb, "team").docs == 10 })
        // Plain HTTP on the TLS port gets nothing, and a device that does not trust the certificate does not connect.
        #expect((try? httpExchange(port: relay.port, "GET /healthz HTTP/1.1\r\nHost: relay\r\n\r\n"))?.status != 200)
        let c = try syncDaemon()
        let cc = try c.connect()
        _ = try cc.call("db.create", ["db": "other"])
        _ = try cc.call("db.share", ["db": "other"])
        _ = try cc.call("peer.add", ["db": "other", "address": .string(relay.address)])
        #expect(try eventually {
            let peer = try cc.call("sync.status", ["db": "other"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue?.first
            return (peer?["lastError"]?.stringValue ?? "").lowercased().contains("certificate")
        })
        a.stop()
        b.stop()
        c.stop()
        relay.stop()
    }

    /// Two members that reach each other only through a relay (one process with SQLite, or two processes sharing
    /// PostgreSQL) learn each other's acknowledgements from it, so what both hold becomes stable and is compacted
    /// away (Protocol/RELAY.md, SYNC.md §11).
    @Test(arguments: [false, true]) func membersMeetingOnlyThroughARelayReachStabilityAndCompact(sharedPostgres: Bool) throws {
        let pg = sharedPostgres ? try PostgresServer() : nil
        let r1 = try RelayProcess(postgres: pg)
        let r2 = sharedPostgres ? try RelayProcess(postgres: pg) : r1
        let a = try syncDaemon(), b = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        try r1.addSpace(try ca.relayCapability("team"))
        _ = try cb.call("peer.remove", ["db": "team", "address": .string(try a.syncAddress())])
        _ = try ca.call("peer.add", ["db": "team", "address": .string(r1.address)])
        _ = try cb.call("peer.add", ["db": "team", "address": .string(r2.address)])
        // Written once the direct link is gone: only the relay carries these, and what each device holds of them.
        for i in 0..<30 { _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": .string("a\(i)"), "doc": ["i": .int(Int64(i))]]) }
        for i in 0..<10 { _ = try cb.call("doc.put", ["db": "team", "collection": "c", "id": .string("b\(i)"), "doc": ["i": .int(Int64(i))]]) }
        #expect(try eventually { try replicaState(ca, "team") == replicaState(cb, "team") && replicaState(ca, "team").docs == 40 })
        let (na, nb) = (try nodeID(ca, "team"), try nodeID(cb, "team"))
        let vector = try #require(try versionVector(ca))
        let (aSeq, bSeq) = (try #require(vector[na]?.intValue), try #require(vector[nb]?.intValue))
        // Each compaction issues the device's acknowledgement; the relay passes it to the other.
        #expect(try eventually {
            let rb = try cb.call("db.compact", ["db": "team"])
            let ra = try ca.call("db.compact", ["db": "team"])
            return ra["stableVector"]?[na]?.intValue == aSeq && ra["stableVector"]?[nb]?.intValue == bSeq
                && rb["stableVector"]?[na]?.intValue == aSeq && rb["stableVector"]?[nb]?.intValue == bSeq
                && ra["silentMembers"] == [] && rb["silentMembers"] == []
        })
        #expect(try fileRows(dataDir: a.dataDir, db: "team", "sync_entries") == 0)
        #expect(try fileRows(dataDir: b.dataDir, db: "team", "sync_entries") == 0)
        // Still one replica: a write after compaction reaches the other through the relay.
        _ = try cb.call("doc.put", ["db": "team", "collection": "c", "id": "late", "doc": ["late": true]])
        #expect(try eventually { try replicaState(ca, "team") == replicaState(cb, "team") && replicaState(ca, "team").docs == 41 })
        for d in [a, b] { d.stop() }
        r1.stop()
        if sharedPostgres { r2.stop() }
    }

    @Test func threeDaemonsOnTwoRelayProcessesSharingPostgreSQLConvergeThroughCrashesAndARestart() throws {
        let pg = try PostgresServer()
        // Relay 1 restarts on its port: one outside the ephemeral range, which no outbound connection takes meanwhile.
        var r1 = try RelayProcess(listen: "127.0.0.1:\(StablePorts.next())", postgres: pg)
        let r2 = try RelayProcess(postgres: pg)
        let a = try syncDaemon(), b = try syncDaemon(), c = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect(), cc = try c.connect()
        _ = try ca.call("db.create", ["db": "team"])
        for x in [cb, cc] { _ = try x.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"]) }
        // The space is added through one process; the other learns it from PostgreSQL.
        try r1.addSpace(try ca.relayCapability("team"))
        for x in [cb, cc] { _ = try x.call("peer.remove", ["db": "team", "address": .string(try a.syncAddress())]) }
        _ = try ca.call("peer.add", ["db": "team", "address": .string(r1.address)])
        _ = try cb.call("peer.add", ["db": "team", "address": .string(r2.address)])
        _ = try cc.call("peer.add", ["db": "team", "address": .string(r1.address)])
        // Live, across processes: a write on A (relay 1) reaches B (relay 2), one on B reaches A and C.
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "fromA", "doc": ["v": 1]])
        #expect(eventually { (try? cb.call("doc.get", ["db": "team", "collection": "c", "id": "fromA"])) != nil })
        _ = try cb.call("doc.put", ["db": "team", "collection": "c", "id": "fromB", "doc": ["v": 2]])
        #expect(eventually { (try? ca.call("doc.get", ["db": "team", "collection": "c", "id": "fromB"])) != nil })
        #expect(eventually { (try? cc.call("doc.get", ["db": "team", "collection": "c", "id": "fromB"])) != nil })

        // kill -9 of relay 1 while A writes: A's link reconnects to a new relay 1 on the same port; nothing is lost.
        let port = r1.port
        for i in 0..<60 {
            if i == 20 { r1.killHard() }
            if i == 40 { r1 = try RelayProcess(dir: r1.dir, listen: "127.0.0.1:\(port)", postgres: pg) }
            _ = try ca.call("doc.put", ["db": "team", "collection": "k", "id": .string("a\(i)"), "doc": ["i": .int(Int64(i))]])
        }
        // The PostgreSQL server restarts while B writes: the relays' writes fail meanwhile, nothing is lost.
        for i in 0..<60 {
            if i == 20 { pg.stop() }
            if i == 40 { try pg.start() }
            _ = try cb.call("doc.put", ["db": "team", "collection": "p", "id": .string("b\(i)"), "doc": ["i": .int(Int64(i))]])
        }
        let converged = try eventually(timeout: .seconds(90)) {
            let (sa, sb, sc) = (try replicaState(ca, "team"), try replicaState(cb, "team"), try replicaState(cc, "team"))
            return sa == sb && sb == sc && sa.docs == 122
        }
        #expect(converged)
        if !converged {
            // What each side saw, for the failure's reader.
            for (name, x) in [("A", ca), ("B", cb), ("C", cc)] {
                print("\(name): \(try replicaState(x, "team")) \(try x.call("sync.status", ["db": "team"]))")
            }
            print("relay 1 log:\n\(r1.logText.suffix(4000))\nrelay 2 log:\n\(r2.logText.suffix(4000))")
        }
        // The relay's whole database holds no document content, id, collection or field name.
        let dump = try pg.dump()
        for needle in ["fromA", "fromB", "\"a1\"", "\"b1\"", "team"] {
            #expect(!dump.contains(needle), "\(needle) in the relay's database")
            let hex = Array(needle.utf8).map { String(format: "%02x", $0) }.joined()
            #expect(!dump.contains(hex), "\(needle) (hex) in the relay's database")
        }
        for d in [a, b, c] { d.stop() }
        r1.stop(errorsExpected: true)
        r2.stop(errorsExpected: true)
    }

    /// Members compacted their history; a relay that never saw it (new, or one whose retention dropped the space)
    /// gets a snapshot from the first member that connects, then what follows; a device that reaches only the relay
    /// joins from that snapshot (SYNC.md §11, RELAY.md).
    @Test func aDeviceReachingOnlyARelayJoinsFromTheSnapshotAMemberLeftThere() throws {
        let a = try syncDaemon(), b = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        try writeHistory(ca, "team", deleting: 20, from: 0)
        #expect(try joinAndCompactEverything(ca, cb))
        #expect(try fileRows(dataDir: a.dataDir, db: "team", "sync_entries") == 0)

        let relay = try RelayProcess()
        try relay.addSpace(try ca.relayCapability("team"))
        _ = try ca.call("peer.add", ["db": "team", "address": .string(relay.address)])
        // A fills the relay: it lacks entries A compacted away, so A leaves it a snapshot.
        #expect(eventually { (try? relay.count("relay_snapshots")) == 1 && (try? relay.count("relay_bases")) ?? 0 >= 1 })
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "afterSnapshot", "doc": ["v": 1]])

        // C never meets A or B: the invite names the relay, and the relay is its one peer.
        let c = try DaemonProcess()
        let cc = try c.connect()
        let token = try #require(
            try ca.call("db.invite", ["db": "team", "role": "writer", "address": .string(relay.address)])["token"]?.stringValue)
        _ = try cc.call("db.join", ["token": .string(token), "db": "team"])
        #expect(try eventually(timeout: .seconds(60)) { try replicaState(cc, "team") == replicaState(ca, "team") })
        #expect(try replicaState(cc, "team").docs == 182)
        #expect(try peerCounter(cc, "team", "snapshotsInstalled") >= 1)
        // Writes after the join go both ways through the relay.
        _ = try cc.call("doc.put", ["db": "team", "collection": "c", "id": "fromC", "doc": ["c": true]])
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "lastA", "doc": ["a": true]])
        #expect(try eventually {
            try replicaState(ca, "team") == replicaState(cc, "team") && replicaState(cb, "team") == replicaState(ca, "team")
                && replicaState(ca, "team").docs == 184
        })
        for d in [a, b, c] { d.stop() }
        relay.stop()
    }


}
