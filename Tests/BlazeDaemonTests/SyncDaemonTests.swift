import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import GRDB
import Synchronization
import Testing

/// A daemon that accepts sync peers on a free loopback port.
func syncDaemon(dir: TempDir = TempDir(), environment: [String: String] = [:]) throws -> DaemonProcess {
    try DaemonProcess(arguments: ["--sync-listen", "127.0.0.1:0"], dir: dir, environment: environment)
}

extension DaemonProcess {
    /// The `host:port` its sync listener is bound to.
    func syncAddress() throws -> String {
        try #require(try connect().call("sync.status")["listen"]?.stringValue)
    }
}

extension BlazeConnection {
    /// Shares `db` on this daemon (its device becomes the space's admin, if it is not a member yet) and returns a
    /// one-time invite for another device, with `role`.
    func invite(_ db: String, role: String = "writer") throws -> String {
        _ = try call("db.share", ["db": .string(db)])
        return try #require(try call("db.invite", ["db": .string(db), "role": .string(role)])["token"]?.stringValue)
    }
}

/// A legacy share token (as `db.share` printed before membership): whoever holds it is a member of its space.
func legacyToken() -> String { SpaceKey.generate().token! }

/// `db.info` facts used to compare replicas.
func replicaState(_ c: BlazeConnection, _ db: String) throws -> (hash: String, docs: Int64) {
    let info = try c.call("db.info", ["db": .string(db)])
    return (info["stateHash"]?.stringValue ?? "", info["documents"]?.intValue ?? -1)
}

@Suite(.serialized) struct SyncDaemonTests {
    @Test func threeDaemonsWritingConcurrentlyConverge() throws {
        let a = try syncDaemon(), b = try syncDaemon(), c = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect(), cc = try c.connect()
        _ = try ca.call("db.create", ["db": "team"])
        let space = try #require(try ca.call("db.share", ["db": "team"])["space"]?.stringValue)
        #expect(try ca.call("db.share", ["db": "team"]) == ["db": "team", "space": .string(space), "token": .null], "sharing again gives the same space")
        // B joins through A as an admin, C through B (so C's first peer is B).
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team", role: "admin")), "db": "team"])
        let joined = try cc.call("db.join", ["token": .string(try cb.invite("team"))])
        let cName = try #require(joined["db"]?.stringValue)
        let spaceA = try ca.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["space"]
        #expect(cName.hasPrefix("shared-") && joined["space"] == spaceA && spaceA?.stringValue?.hasPrefix(String(cName.dropFirst(7))) == true)
        // A chain: C talks only to B, B only to A. A's writes reach C through B.
        _ = try cb.call("peer.add", ["db": "team", "address": .string(try a.syncAddress())])
        _ = try cc.call("peer.add", ["db": .string(cName), "address": .string(try b.syncAddress())])
        let clients: [(BlazeConnection, String)] = [(ca, "team"), (cb, "team"), (cc, cName)]
        // Concurrent writers on all three daemons.
        let done = DispatchGroup()
        let writeErrors = Mutex<[String]>([])
        for (socket, db, tag) in [(a.socket, "team", "a"), (b.socket, "team", "b"), (c.socket, cName, "c")] {
            done.enter()
            Thread {
                defer { done.leave() }
                do {
                    let w = try BlazeConnection(socketPath: socket, timeoutSeconds: 60)
                    for i in 0..<150 {
                        _ = try w.call("doc.put", ["db": .string(db), "collection": "notes", "id": .string("\(tag)\(i)"), "doc": ["i": .int(Int64(i))]])
                    }
                } catch {
                    writeErrors.withLock { $0.append("writer \(tag): \(error)") }
                }
            }.start()
        }
        #expect(done.wait(timeout: .now() + 120) == .success)
        #expect(writeErrors.withLock { $0 }.isEmpty)
        let converged = try eventually {
            let states = try clients.map { try replicaState($0.0, $0.1) }
            return Set(states.map(\.hash)).count == 1 && states[0].docs == 3 * 150
        }
        let finalStates = try clients.map { try replicaState($0.0, $0.1) }
        #expect(converged, "states: \(finalStates)")
        // Every peer connection is up and nothing was rejected.
        let status = try cb.call("sync.status", ["db": "team"])
        let peers = try #require(status["databases"]?.arrayValue?.first?["peers"]?.arrayValue)
        #expect(peers.count == 2 && peers.allSatisfy { $0["rejected"] == [:] })
        #expect(peers.contains { $0["direction"] == "outbound" && $0["connected"] == true })
        // Each connection names the device at its other end, as proven in the handshake.
        let nodeA = try #require(try ca.call("db.info", ["db": "team"])["nodeId"])
        let nodeC = try #require(try cc.call("db.info", ["db": .string(cName)])["nodeId"])
        let outbound = peers.first { $0["direction"] == "outbound" }, inbound = peers.first { $0["direction"] == "inbound" }
        #expect(outbound?["devices"] == [nodeA] && outbound?["lastDevice"] == nodeA)
        #expect(inbound?["devices"] == [nodeC] && inbound?["lastDevice"] == nodeC)
        let list = try cb.call("peer.list", ["db": "team"])
        #expect(list["peers"] == [["address": .string(try a.syncAddress()), "connected": true, "device": nodeA]])
        for d in [a, b, c] { d.stop() }
    }

    @Test func aStoppedAndAPausedDaemonCatchUpWithNothingLostOrAppliedTwice() throws {
        let a = try syncDaemon()
        let dirB = TempDir()
        var b = try syncDaemon(dir: dirB)
        let c = try syncDaemon()
        let ca = try a.connect()
        _ = try ca.call("db.create", ["db": "team"])
        for d in [b, c] {
            let conn = try d.connect()
            _ = try conn.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
            _ = try conn.call("peer.add", ["db": "team", "address": .string(try a.syncAddress())])
        }
        // A subscriber on C sees A's writes as they arrive, with A as their origin.
        let watcher = try c.connect()
        let (sub, _) = try subscribe(watcher, ["db": "team", "collection": "k"])
        _ = try ca.call("doc.put", ["db": "team", "collection": "k", "id": "counter", "doc": ["n": 0]])
        let arrived = try readEvents(watcher, sub, count: 1)
        #expect(arrived.first?["origin"] == (try ca.call("daemon.info")["nodeId"]) && arrived.first?["type"] == "insert")
        #expect(arrived.first?["doc"]?["n"] == 0 && arrived.first?["id"] == "counter")
        #expect(try eventually { try replicaState(try c.connect(), "team").docs == 1 && replicaState(try b.connect(), "team").docs == 1 })
        // B stops, C pauses; A and C keep writing (C offline), including counter increments that would show any
        // change applied twice.
        b.stop()
        let cc = try c.connect()
        _ = try cc.call("sync.pause", ["db": "team"])
        #expect(try cc.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["paused"] == true)
        for i in 0..<100 {
            _ = try ca.call("doc.patch", ["db": "team", "collection": "k", "id": "counter", "incr": ["n": 1]])
            _ = try cc.call("doc.patch", ["db": "team", "collection": "k", "id": "counter", "incr": ["n": 10]])
            _ = try ca.call("doc.put", ["db": "team", "collection": "a", "id": .string("a\(i)"), "doc": ["i": .int(Int64(i))]])
            _ = try cc.call("doc.put", ["db": "team", "collection": "c", "id": .string("c\(i)"), "doc": ["i": .int(Int64(i))]])
        }
        #expect(try replicaState(ca, "team").docs == 101, "C's offline writes stayed on C")
        _ = try cc.call("sync.resume", ["db": "team"])
        b = try syncDaemon(dir: dirB)
        let all = [a, b, c]
        let converged = try eventually {
            let states = try all.map { try replicaState(try $0.connect(), "team") }
            return Set(states.map(\.hash)).count == 1 && states[0].docs == 201
        }
        #expect(converged)
        for d in all {
            let doc = try d.connect().call("doc.get", ["db": "team", "collection": "k", "id": "counter"])
            #expect(doc["doc"]?["n"] == 1100, "every increment applied exactly once")
        }
        for d in all { d.stop() }
    }

    @Test func killedMidSyncConvergesAndItsDatabaseIsIntact() throws {
        let a = try syncDaemon()
        let dirB = TempDir()
        let ca = try a.connect()
        _ = try ca.call("db.create", ["db": "big"])
        var ops: [JSONValue] = []
        for i in 0..<3000 {
            ops.append(["op": "put", "collection": "c", "id": .string("d\(i)"), "doc": ["i": .int(Int64(i)), "pad": .string(String(repeating: "x", count: 200))]])
            if ops.count == 10 {
                _ = try ca.call("tx.commit", ["db": "big", "ops": .array(ops)])
                ops = []
            }
        }
        let token = try ca.invite("big")
        var b = try syncDaemon(dir: dirB)
        let cb = try b.connect()
        _ = try cb.call("db.join", ["token": .string(token), "db": "big"])
        _ = try cb.call("peer.add", ["db": "big", "address": .string(try a.syncAddress())])
        // Kill B as soon as it has received part of the log.
        #expect(try eventually { try replicaState(cb, "big").docs > 0 })
        b.kill9()
        let check = try DatabaseQueue(path: dirB.path + "/data/databases/big.db")
        #expect(try check.read { try String.fetchAll($0, sql: "PRAGMA integrity_check") } == ["ok"])
        try check.close()
        b = try syncDaemon(dir: dirB)
        let target = try replicaState(ca, "big")
        #expect(try eventually { try replicaState(try b.connect(), "big") == target })
        a.stop()
        b.stop()
    }

    @Test func aFaultInjectingProxyGetsNothingCorruptAcceptedAndSyncRecovers() throws {
        let seed = testSeed("fault proxy")
        // Short timeouts so that a stalled stream (bytes dropped at the end of a burst) is noticed within seconds.
        let a = try DaemonProcess(arguments: ["--sync-listen", "127.0.0.1:0", "--sync-timeout", "2"])
        let b = try DaemonProcess(arguments: ["--sync-timeout", "2"])
        let clean = try DaemonProcess()
        let ca = try a.connect(), cb = try b.connect(), cc = try clean.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try ca.call("doc.put", ["db": "team", "collection": "k", "id": "counter", "doc": ["n": 0]])
        for conn in [cb, cc] { _ = try conn.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"]) }
        let aAddress = try a.syncAddress()
        // Joining made A a peer of both; B must reach A only through the proxy.
        _ = try cb.call("peer.remove", ["db": "team", "address": .string(aAddress)])
        let proxy = try FaultProxy(targetPort: try #require(Int(aAddress.split(separator: ":").last ?? "")), seed: seed)
        defer { proxy.shutdown() }
        // B reaches A only through the proxy; the clean replica talks to A directly.
        _ = try cb.call("peer.add", ["db": "team", "address": .string("127.0.0.1:\(proxy.port)")])
        #expect(try cc.call("peer.add", ["db": "team", "address": .string(aAddress)])["added"] == false)

        // A and B write (new documents and counter increments) until the proxy has corrupted enough connections.
        let stop = Atomic<Bool>(false)
        let written = Mutex<(docs: Int, increments: Int64)>((0, 0))
        let done = DispatchGroup()
        for (socket, tag) in [(a.socket, "a"), (b.socket, "b")] {
            done.enter()
            Thread {
                defer { done.leave() }
                guard let w = try? BlazeConnection(socketPath: socket, timeoutSeconds: 60) else { return }
                var i = 0
                while !stop.load(ordering: .relaxed) && i < 20_000 {
                    let pad = String(repeating: tag, count: i % 300)
                    guard (try? w.call("doc.put", ["db": "team", "collection": .string(tag), "id": .string("\(tag)\(i)"),
                        "doc": ["i": .int(Int64(i)), "pad": .string(pad)]])) != nil else { return }
                    written.withLock { $0.docs += 1 }
                    if i % 5 == 0 {
                        guard (try? w.call("doc.patch", ["db": "team", "collection": "k", "id": "counter", "incr": ["n": 1]])) != nil
                        else { return }
                        written.withLock { $0.increments += 1 }
                    }
                    i += 1
                    usleep(1000)  // pacing for the writers, not synchronisation: a steady trickle of live changes
                }
            }.start()
        }
        let corrupting: () -> Int = { proxy.applied.filter(\.key.corrupts).values.reduce(0, +) }
        let enoughFaults = eventually(timeout: .seconds(120)) { corrupting() >= 16 && proxy.applied.count >= 5 }
        proxy.setFaulty(false)
        stop.store(true, ordering: .relaxed)
        #expect(done.wait(timeout: .now() + 60) == .success)
        let applied = proxy.applied
        #expect(enoughFaults, "faults applied: \(applied)")
        print("faults applied: \(applied.map { "\($0.key.rawValue)=\($0.value)" }.sorted())")

        // With the proxy clean, B catches up on its own and every replica holds exactly what was written.
        let (docs, increments) = written.withLock { $0 }
        let replicas = [ca, cb, cc]
        let converged = try eventually(timeout: .seconds(90)) {
            let states = try replicas.map { try replicaState($0, "team") }
            return Set(states.map(\.hash)).count == 1 && states[0].docs == Int64(docs + 1)
        }
        let finalStates = try replicas.map { try replicaState($0, "team") }
        #expect(converged, "states: \(finalStates), written \(docs + 1)")
        for conn in replicas {
            let counter = try conn.call("doc.get", ["db": "team", "collection": "k", "id": "counter"])
            #expect(counter["doc"]?["n"] == .int(increments), "every increment exactly once")
        }
        let check = try DatabaseQueue(path: b.dataDir + "/databases/team.db")
        #expect(try check.read { try String.fetchAll($0, sql: "PRAGMA integrity_check") } == ["ok"])
        try check.close()

        // Every refusal is counted, and nothing was refused that the proxy did not damage.
        func peer(_ c: BlazeConnection) throws -> JSONValue {
            let status = try c.call("sync.status", ["db": "team"])
            return try #require(status["databases"]?.arrayValue?.first?["peers"]?.arrayValue?.first {
                $0["peer"] == (c === ca ? "inbound" : .string("127.0.0.1:\(proxy.port)"))
            })
        }
        // A connection damaged just before the proxy turned clean may still be timing out; B then reconnects on its own.
        let reconnected = try eventually(timeout: .seconds(30)) { try peer(cb)["connected"] == true }
        #expect(reconnected, "B's link comes back once the proxy is clean")
        var pa = try peer(ca), pb = try peer(cb)
        var reasons: [String: JSONValue] = [:]
        var rejections = 0, errors = 0, strangers = 0
        func count() throws {
            pa = try peer(ca)
            pb = try peer(cb)
            reasons = (pa["rejected"]?.objectValue ?? [:]).merging(pb["rejected"]?.objectValue ?? [:]) {
                .int(($0.intValue ?? 0) + ($1.intValue ?? 0))
            }
            strangers = Int(try ca.call("sync.status")["strangersRefused"]?.intValue ?? 0)
            rejections = strangers + reasons.values.reduce(0) { $0 + Int($1.intValue ?? 0) }
            errors = Int((pa["errors"]?.intValue ?? 0) + (pb["errors"]?.intValue ?? 0))
        }
        // The last damaged connection's refusal or timeout can be counted just after B reconnects: wait for it.
        _ = try eventually(timeout: .seconds(30)) {
            try count()
            return rejections + errors >= corrupting()
        }
        #expect(Set(reasons.keys).isSubset(of: ["bad_frame"]), "the session cipher refuses damage first: \(reasons)")
        print("rejections \(rejections) (\(reasons), strangers \(strangers)), errors \(errors)")
        #expect(rejections <= corrupting(), "no refusal without damage")
        #expect(rejections >= applied[.flip, default: 0], "every flipped bit refused")
        #expect(rejections + errors >= corrupting(), "every damaged connection refused or timed out")
        #expect(pb["lastError"] != nil, "the damage B saw is reported")
        a.stop()
        b.stop()
        clean.stop()
    }

    @Test func aPeerWithoutTheKeyIsRefusedAndLearnsNothing() throws {
        let a = try syncDaemon(), d = try syncDaemon()
        let ca = try a.connect(), cd = try d.connect()
        _ = try ca.call("db.create", ["db": "private"])
        _ = try ca.call("doc.put", ["db": "private", "collection": "c", "id": "x", "doc": ["secret": "yes"]])
        _ = try ca.call("db.share", ["db": "private"])
        _ = try cd.call("db.create", ["db": "guess"])
        _ = try cd.call("db.share", ["db": "guess"])  // another space, another key
        _ = try cd.call("peer.add", ["db": "guess", "address": .string(try a.syncAddress())])
        #expect(try eventually { (try ca.call("sync.status")["strangersRefused"]?.intValue ?? 0) >= 2 })
        let peer = try cd.call("sync.status", ["db": "guess"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue?.first
        #expect(peer?["connected"] == false && peer?["receivedEntries"] == 0)
        #expect(try replicaState(cd, "guess").docs == 0)
        // A shows nothing about the stranger under its database.
        #expect(try ca.call("sync.status", ["db": "private"])["databases"]?.arrayValue?.first?["peers"] == [])
        a.stop()
        d.stop(expectErrors: false)
    }

    @Test func syncMethodsRejectBadInput() throws {
        let a = try syncDaemon()
        let c = try a.connect()
        _ = try c.call("db.create", ["db": "solo"])
        let token = try c.invite("solo")
        let invalid = RPCErrorCode.invalidParams
        for method in ["db.share", "db.invite", "db.members", "db.revoke", "peer.add", "peer.remove", "peer.list", "sync.now", "sync.pause", "sync.resume"] {
            var address: [String: JSONValue] = method.hasPrefix("peer.") && method != "peer.list" ? ["address": "127.0.0.1:1"] : [:]
            if method == "db.invite" { address = ["role": "writer"] }
            if method == "db.revoke" { address = ["device": "00000000000000000000000000000000"] }
            expectRPCError(c, method, [:], code: invalid)
            expectRPCError(c, method, address.merging(["db": 5]) { $1 }, code: invalid)
            expectRPCError(c, method, address.merging(["db": "nope"]) { $1 }, code: RPCErrorCode.notFound)
            expectRPCError(c, method, address.merging(["db": "solo", "extra": 1]) { $1 }, code: invalid)
        }
        expectRPCError(c, "peer.add", ["db": "solo", "address": 80], code: invalid)
        expectRPCError(c, "db.join", [:], code: invalid)
        expectRPCError(c, "db.join", ["token": 7], code: invalid)
        expectRPCError(c, "db.join", ["token": "blazedb-secret-1.AAAA"], code: invalid, kind: "invalid_token")
        expectRPCError(c, "db.join", ["token": "hello"], code: invalid, kind: "invalid_token")
        expectRPCError(c, "db.join", ["token": .string(token)], code: RPCErrorCode.conflict, kind: "already_joined")
        _ = try c.call("db.create", ["db": "gone"])
        let orphan = JSONValue.string(try c.invite("gone"))
        _ = try c.call("db.drop", ["db": "gone"])
        expectRPCError(c, "db.join", ["token": orphan, "db": "bad/name"], code: invalid, kind: "invalid_name")
        expectRPCError(c, "db.join", ["token": orphan, "db": "solo"], code: RPCErrorCode.conflict)
        expectRPCError(c, "sync.status", ["db": "nope"], code: RPCErrorCode.notFound)
        for bad in ["nohost", "host:0", "host:99999", ":80", "a b:1"] {
            expectRPCError(c, "peer.add", ["db": "solo", "address": .string(bad)], code: invalid, kind: "invalid_address")
        }
        _ = try c.call("db.create", ["db": "local"])
        for method in ["peer.add", "sync.now", "sync.pause", "sync.resume", "db.members"] {
            let params: [String: JSONValue] = method == "peer.add" ? ["db": "local", "address": "127.0.0.1:1"] : ["db": "local"]
            expectRPCError(c, method, params, code: -32020, kind: "not_shared")
        }
        #expect(try c.call("peer.add", ["db": "solo", "address": "127.0.0.1:1"])["added"] == true)
        #expect(try c.call("peer.add", ["db": "solo", "address": "127.0.0.1:1"])["added"] == false)
        #expect(try c.call("peer.remove", ["db": "solo", "address": "127.0.0.1:1"])["removed"] == true)
        #expect(try c.call("peer.remove", ["db": "solo", "address": "127.0.0.1:1"])["removed"] == false)
        // Membership methods: bad roles, expiries, devices; unknown members; the last admin stays.
        expectRPCError(c, "db.invite", ["db": "solo", "role": "owner"], code: invalid, kind: "invalid_role")
        expectRPCError(c, "db.invite", ["db": "solo", "role": 3], code: invalid)
        for seconds in [0, -5, 30 * 86_400 + 1] {
            expectRPCError(c, "db.invite", ["db": "solo", "role": "reader", "expiresIn": .int(Int64(seconds))], code: invalid, kind: "invalid_expiry")
        }
        expectRPCError(c, "db.invite", ["db": "solo", "role": "reader", "address": "nohost"], code: invalid, kind: "invalid_address")
        expectRPCError(c, "db.invite", ["db": "local", "role": "reader"], code: -32020, kind: "not_shared")
        expectRPCError(c, "db.revoke", ["db": "solo", "device": "xyz"], code: invalid, kind: "invalid_device")
        expectRPCError(c, "db.revoke", ["db": "solo", "device": "00000000000000000000000000000000"], code: RPCErrorCode.notFound, kind: "unknown_member")
        let me = try #require(try c.call("db.members", ["db": "solo"])["members"]?.arrayValue?.first)
        #expect(me["role"] == "admin" && me["thisDevice"] == true && me["addedBy"] == .null)
        expectRPCError(c, "db.revoke", ["db": "solo", "device": try #require(me["device"])], code: -32020, kind: "last_admin")
        // A legacy space (a secret token from before membership) keeps syncing, but has no members to manage.
        _ = try c.call("db.join", ["token": .string(legacyToken()), "db": "old"])
        #expect(try c.call("db.share", ["db": "old"])["token"]?.stringValue?.hasPrefix("blazedb-secret-1.") == true)
        expectRPCError(c, "db.invite", ["db": "old", "role": "writer"], code: -32020, kind: "legacy_space")
        expectRPCError(c, "db.members", ["db": "old"], code: -32020, kind: "legacy_space")
        // Dropping a shared legacy database removes its key file.
        let space = try #require(try c.call("sync.status", ["db": "old"])["databases"]?.arrayValue?.first?["space"]?.stringValue)
        let keyFile = a.dataDir + "/keys/spaces/\(space).json"
        #expect(FileManager.default.fileExists(atPath: keyFile))
        _ = try c.call("db.drop", ["db": "old"])
        #expect(!FileManager.default.fileExists(atPath: keyFile))
        a.stop()
    }
}
