import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Dispatch
import Foundation
import GRDB
import Synchronization
import Testing

extension RelayProcess {
    /// Joins the relay's store holds now (every process of a PostgreSQL deployment sees the same).
    func joinsHeld() throws -> Int {
        if let postgres { return Int(try postgres.psql("SELECT count(*) FROM relay_joins").trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1 }
        return try count("relay_joins")
    }

    /// The holders of the joins held (relay process and connection), PostgreSQL only.
    func joinHolders() throws -> [String] {
        try #require(postgres).psql("SELECT holder FROM relay_joins").split(separator: "\n").map(String.init)
    }

    /// The relay's URL with another port (a proxy's in front of it).
    func address(port other: Int) -> String { address.replacingOccurrences(of: ":\(port)/", with: ":\(other)/") }
}

/// A `db.join` running on its own thread while the test goes on; `result` waits for its end.
final class BackgroundJoin: Sendable {
    private let outcome = Mutex<Result<JSONValue, any Error>?>(nil)
    private let done = DispatchSemaphore(value: 0)

    /// Calls `db.join {token, db}` on the daemon listening on `socket` (a connection of its own).
    init(_ daemon: DaemonProcess, token: String, db: String = "team") {
        let socket = daemon.socket
        DispatchQueue.global().async { [self] in
            let result = Result { try BlazeConnection(socketPath: socket, timeoutSeconds: 60).call("db.join", ["token": .string(token), "db": .string(db)]) }
            outcome.withLock { $0 = result }
            done.signal()
        }
    }

    /// The call's result, once it ended (a join ends within 20 s; the wait is bounded at 60).
    func result() throws -> JSONValue {
        guard done.wait(timeout: .now() + 60) == .success else { throw ClientError("db.join did not end in 60 s") }
        return try outcome.withLock { $0 }!.get()
    }
}

/// Joins through a relay deployment of several processes on one PostgreSQL (Protocol/RELAY.md, "Joins"): the joiner's
/// request and the admin's refusal reach each other whichever process each side is connected to, now or later, and
/// a joiner whose process dies completes through another.
@Suite(.serialized) struct RelayJoinTests {
    /// Two relay processes on one throwaway PostgreSQL, and an admin `a` whose space both serve.
    struct Deployment {
        let pg: PostgresServer
        let r1: RelayProcess, r2: RelayProcess
        let a: DaemonProcess
        let ca: BlazeConnection

        init() throws {
            pg = try PostgresServer()
            r1 = try RelayProcess(postgres: pg)
            r2 = try RelayProcess(postgres: pg)
            a = try syncDaemon()
            ca = try a.connect()
            _ = try ca.call("db.create", ["db": "team"])
            _ = try ca.call("db.share", ["db": "team"])
            try r1.addSpace(try ca.relayCapability("team"))
            _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "before", "doc": ["v": 1]])
        }

        /// An invite of `a` that names `address`.
        func invite(naming address: String) throws -> String {
            try #require(try ca.call("db.invite", ["db": "team", "role": "writer", "address": .string(address)])["token"]?.stringValue)
        }

        /// Connects `a` to relay 1 (its only peer).
        func connectAdmin() throws { _ = try ca.call("peer.add", ["db": "team", "address": .string(r1.address)]) }

        func stop() {
            a.stop()
            r1.stop()
            r2.stop()
        }
    }

    /// The joiner holds the space's data and the admin lists it: the join completed end to end.
    static func expectJoined(_ cb: BlazeConnection, admin ca: BlazeConnection, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(
            eventually { (try? cb.call("doc.get", ["db": "team", "collection": "c", "id": "before"])) != nil },
            sourceLocation: sourceLocation)
        #expect((try? members(ca, "team").count) == 2, sourceLocation: sourceLocation)
    }

    @Test func aJoinThroughOneProcessReachesTheAdminOnAnother() throws {
        let d = try Deployment()
        try d.connectAdmin()
        let b = try DaemonProcess()
        let cb = try b.connect()
        let started = ContinuousClock.now
        let joined = try cb.call("db.join", ["token": .string(try d.invite(naming: d.r2.address)), "db": "team"])
        print("a join through relay 2 to the admin on relay 1 took \(ContinuousClock.now - started)")
        #expect(joined["db"] == "team")
        Self.expectJoined(cb, admin: d.ca)
        // Admitted: the join is held no more.
        #expect(eventually { (try? d.r1.joinsHeld()) == 0 })
        b.stop()
        d.stop()
    }

    @Test func aJoinSentBeforeTheAdminConnectsCompletesOnceItDoes() throws {
        let d = try Deployment()
        let b = try DaemonProcess()
        let join = BackgroundJoin(b, token: try d.invite(naming: d.r2.address))
        #expect(eventually { (try? d.r2.joinsHeld()) == 1 }, "the join is held while no admin is connected")
        try d.connectAdmin()
        #expect(try join.result()["db"] == "team")
        Self.expectJoined(try b.connect(), admin: d.ca)
        b.stop()
        d.stop()
    }

    @Test func aRefusedJoinSaysWhyThroughTheJoinersProcess() throws {
        let d = try Deployment()
        try d.connectAdmin()
        let token = try d.invite(naming: d.r2.address)
        let first = try DaemonProcess(), second = try DaemonProcess()
        _ = try first.connect().call("db.join", ["token": .string(token), "db": "team"])
        // The same invite again, by another device: the admin (on relay 1) refuses it, and the joiner (on relay 2)
        // hears why at once instead of waiting out its 20 s.
        let started = ContinuousClock.now
        let cs = try second.connect()
        expectRPCError(cs, "db.join", ["token": .string(token), "db": "team"], code: -32020, kind: "invite_used")
        print("a refused join through relay 2 ended after \(ContinuousClock.now - started)")
        #expect(try d.ca.call("sync.status")["invitesRefused"]?["invite_used"] == 1)
        #expect(
            try cs.call("db.list")["databases"]?.arrayValue?.contains { $0["name"] == "team" } == false,
            "a refused join leaves nothing behind")
        #expect(eventually { (try? d.r2.joinsHeld()) == 0 }, "the refused join is dropped once told")
        #expect(try members(d.ca, "team").count == 2)
        for x in [first, second] { x.stop() }
        d.stop()
    }

    /// The joiner reaches the relays through a failover proxy (a load balancer); the process holding its connection
    /// is killed while it waits, and it completes through the other.
    @Test func aJoinerWhoseRelayProcessDiesCompletesThroughAnother() throws {
        let d = try Deployment()
        let balancer = try LinkProxy(targetPorts: [d.r2.port, d.r1.port])
        defer { balancer.shutdown() }
        let b = try DaemonProcess()
        let join = BackgroundJoin(b, token: try d.invite(naming: d.r2.address(port: balancer.port)))
        #expect(eventually { (try? d.r2.joinsHeld()) == 1 })
        let before = try d.r2.joinHolders()
        d.r2.killHard()
        // Its join stays on the dead process's account until the joiner, reconnected through relay 1, sends it again.
        #expect(eventually { let now = (try? d.r1.joinHolders()) ?? []; return now.count == 1 && now != before })
        try d.connectAdmin()
        #expect(try join.result()["db"] == "team")
        Self.expectJoined(try b.connect(), admin: d.ca)
        b.stop()
        d.a.stop()
        d.r1.stop()
    }

    /// A capability holder cannot hold a join for another device's keys, keeps at most 64 per space (a newer join
    /// makes room by dropping the oldest), loses its joins with its connections, and cannot refuse another device's
    /// join (only an admin the log lists can).
    @Test func joinsAreBoundedOwnedByTheirConnectionAndRefusedOnlyByAnAdmin() throws {
        let relay = try RelayProcess(arguments: ["--max-connections-per-address", "200", "--handshake-rate", "1000"])
        let (a, ca, capability) = try sharedTeam(servedBy: relay)
        let key = try RelayCapability(text: capability).key
        func join(_ h: HostileMember, keys: DevicePublicKeys) throws {
            try h.send([6] + SpaceKey.randomBytes(16) + keys.signing + keys.agreement + SpaceKey.randomBytes(32))
        }
        // Another device's keys: not held (the connection proved other keys in its handshake).
        let impostor = HostileMember(key: key)
        try impostor.connect(port: relay.port, webSocket: "/v1/sync")
        try join(impostor, keys: DeviceIdentity().publicKeys)
        // 70 holders of the capability, each asking for its own device: 64 held at most.
        let flood = try (0..<70).map { _ -> HostileMember in
            let h = HostileMember(key: key)
            try h.connect(port: relay.port, webSocket: "/v1/sync")
            h.startDraining()
            try join(h, keys: h.identity.publicKeys)
            return h
        }
        // A real joiner after the flood (the admin is not connected yet): its join is the newest, so it is held.
        let b = try DaemonProcess()
        let token = try #require(
            try ca.call("db.invite", ["db": "team", "role": "writer", "address": .string(relay.address)])["token"]?.stringValue)
        let background = BackgroundJoin(b, token: token)
        let invite = try InviteToken(text: token).id
        let held = { () -> [(device: [UInt8], invite: [UInt8])] in
            (try? DatabaseQueue(path: relay.dataDir + "/relay.db").read { db in
                try Row.fetchAll(db, sql: "SELECT device, invite FROM relay_joins").map { (Array($0[0] as Data), Array($0[1] as Data)) }
            }) ?? []
        }
        #expect(eventually { held().contains { $0.invite == invite } })
        #expect(held().count == RelayJoinTests.maxJoinsPerSpace)
        #expect(!held().contains { $0.device == impostor.identity.publicKeys.signing })
        // A capability holder that knows B's invite and key (it is no admin) refuses B's join: nothing happens.
        let bKey = try #require(held().first { $0.invite == invite }?.device)
        try impostor.send([10] + invite + bKey + Array("invite_used".utf8))
        // The flood's connections close: their joins go with them, B's stays.
        for h in flood { h.close() }
        #expect(eventually { held().count == 1 })
        // The admin connects: B is admitted (the impostor's refusal was not passed on).
        _ = try ca.call("peer.add", ["db": "team", "address": .string(relay.address)])
        #expect(try background.result()["db"] == "team")
        #expect(eventually { held().isEmpty })
        impostor.close()
        for x in [a, b] { x.stop() }
        relay.stop()
    }

    /// A joiner admitted already that sends its join again (it reconnected before the operation reached it) is not
    /// refused: it gets the log like any member, and its `db.join` does not fail with `invite_used`.
    @Test func aJoinSentAgainAfterItsAdmissionIsNotRefused() throws {
        let a = try syncDaemon(), b = try DaemonProcess()
        let ca = try a.connect()
        _ = try ca.call("db.create", ["db": "team"])
        let token = try ca.invite("team")
        _ = try b.connect().call("db.join", ["token": .string(token), "db": "team"])
        // B's own keys, redeeming its invite once more on a new connection to A.
        let identity = try DeviceIdentity.loadOrCreate(directory: b.dataDir + "/keys")
        let invite = try InviteToken(text: token)
        let again = HostileMember(key: try RelayCapability(text: try ca.relayCapability("team")).key, identity: identity)
        try again.connect(port: Int(try a.syncAddress().split(separator: ":").last!)!, timeoutSeconds: 2)
        try again.send([6] + invite.id + identity.publicKeys.signing + identity.publicKeys.agreement + invite.joinProof(device: identity.publicKeys))
        #expect(again.awaitClose(seconds: 4).error == nil, "no ERROR invite_used")
        #expect(try ca.call("sync.status")["invitesRefused"]?["invite_used"] == nil)
        again.close()
        for x in [a, b] { x.stop() }
    }

    /// `RelayServer.maxJoinsPerSpace`, as RELAY.md states it.
    static let maxJoinsPerSpace = 64

    @Test func aDeviceJoinsThroughTheRelayWithAnInviteNamingIt() throws {
        let relay = try RelayProcess()
        let a = try syncDaemon()
        // B listens nowhere and is never given A's address: the relay is all it knows.
        let b = try DaemonProcess()
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try ca.call("db.share", ["db": "team"])
        try relay.addSpace(try ca.relayCapability("team"))
        _ = try ca.call("peer.add", ["db": "team", "address": .string(relay.address)])
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "before", "doc": ["v": 1]])
        let token = try #require(
            try ca.call("db.invite", ["db": "team", "role": "writer", "address": .string(relay.address)])["token"]?.stringValue)
        #expect(try InviteToken(text: token).address == relay.address)
        // The join goes through the relay to A, which admits B; B's one peer is the relay.
        let joined = try cb.call("db.join", ["token": .string(token), "db": "team"])
        #expect(joined["db"] == "team")
        let peers = try cb.call("peer.list", ["db": "team"])["peers"]?.arrayValue?.compactMap { $0["address"]?.stringValue }
        #expect(peers == [relay.address])
        #expect(try members(ca, "team").count == 2)
        #expect(eventually { (try? cb.call("doc.get", ["db": "team", "collection": "c", "id": "before"])) != nil })
        _ = try cb.call("doc.put", ["db": "team", "collection": "c", "id": "fromB", "doc": ["v": 2]])
        #expect(eventually { (try? ca.call("doc.get", ["db": "team", "collection": "c", "id": "fromB"])) != nil })
        // The secret never reached the relay: only a proof bound to B's keys did.
        let secret = try InviteToken(text: token).secret
        let stored = try Data(contentsOf: URL(fileURLWithPath: relay.dataDir + "/relay.db"))
        #expect(stored.range(of: Data(secret)) == nil)
        for d in [a, b] { d.stop() }
        relay.stop()
    }
}
