import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

/// A `blazed` that accepts sync peers on a loopback port it keeps across restarts, on the same data directory: a
/// device restarted by systemd (SIGTERM) or after a crash (kill -9).
final class RestartingDaemon: @unchecked Sendable {
    // @unchecked: driven by one test thread at a time (the chaos test's writers only read `socket`, which never changes).
    let dir = TempDir()
    let arguments: [String]
    private(set) var daemon: DaemonProcess?
    /// The sync port, fixed at the first start.
    private(set) var port = 0

    /// Starts it on a free loopback port outside the kernel's ephemeral range (`StablePorts`: no outbound connection
    /// takes it while the daemon is down), with `arguments` besides the socket, data and listen flags; a port some
    /// other program bound meanwhile is traded for another.
    init(arguments: [String] = []) throws {
        self.arguments = arguments
        for attempt in 1...20 {
            port = StablePorts.next()
            do {
                try start()
                return
            } catch let error as ClientError where attempt < 20 && error.description.contains("Address already in use") {
                continue
            }
        }
    }

    /// Where peers dial it.
    var address: String { "127.0.0.1:\(port)" }
    /// Its Unix socket (the same across restarts).
    var socket: String { dir.path + "/run/blazed.sock" }
    var isRunning: Bool { daemon?.process.isRunning == true }

    /// A new client of the running daemon.
    func connect() throws -> BlazeConnection {
        guard let daemon else { throw ClientError("the daemon is stopped") }
        return try daemon.connect()
    }

    /// Ends the process: SIGTERM and a clean exit (checked), or kill -9.
    func stop(kill9: Bool) {
        if kill9 { daemon?.kill9() } else { daemon?.stop() }
        daemon = nil
    }

    /// Starts it again on the same port and data directory.
    func start() throws {
        daemon = try DaemonProcess(arguments: ["--sync-listen", address] + arguments, dir: dir)
    }

    /// Stops it and starts it again.
    func restart(kill9: Bool) throws {
        stop(kill9: kill9)
        try start()
    }
}

/// `sync.status`'s entry for one peer of `db` (an outbound address, `inbound`, or a relay URL).
func peerStatus(_ c: BlazeConnection, _ db: String, _ peer: String) throws -> JSONValue? {
    let peers = try c.call("sync.status", ["db": .string(db)])["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
    return peers.first { $0["peer"]?.stringValue == peer }
}

/// Writes a document on `writer` and waits until `reader` holds it; returns the seconds it took (nil: never arrived).
func deliver(_ id: String, from writer: BlazeConnection, to reader: BlazeConnection, db: String = "notes") throws -> Double? {
    let started = ContinuousClock.now
    _ = try writer.call("doc.put", ["db": .string(db), "collection": "c", "id": .string(id), "doc": ["by": .string(id)]])
    let arrived = eventually(timeout: .seconds(30)) {
        (try? reader.call("doc.get", ["db": .string(db), "collection": "c", "id": .string(id)])) != nil
    }
    guard arrived else { return nil }
    let d = ContinuousClock.now - started
    return Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
}

/// A daemon restarted (SIGTERM or kill -9) serves its shared databases again at once, on every transport, whether it
/// created the space or joined it, and whether or not it dials anyone itself.
@Suite(.serialized) struct RestartTests {
    /// Two devices where only one dials the other (a phone behind NAT dialing a desktop): the one that only receives
    /// is restarted while the other holds an open link to it, and every write after the restart crosses both ways.
    @Test(arguments: ["creator", "member"], ["SIGTERM", "kill -9"])
    func aDaemonThatOnlyReceivesItsLinkServesItAgainAfterARestart(restarted: String, signal: String) throws {
        let creator = try RestartingDaemon(), member = try RestartingDaemon()
        let cc = try creator.connect(), cm = try member.connect()
        _ = try cc.call("db.create", ["db": "notes"])
        _ = try cm.call("db.join", ["token": .string(try cc.invite("notes")), "db": "notes"])
        // Joining made the creator the member's peer; from here on only the other side dials.
        _ = try cm.call("peer.remove", ["db": "notes", "address": .string(creator.address)])
        let (target, dialer) = restarted == "creator" ? (creator, member) : (member, creator)
        let dc = try dialer.connect()
        _ = try dc.call("peer.add", ["db": "notes", "address": .string(target.address)])
        #expect(try deliver("before", from: dc, to: try target.connect()) != nil)
        #expect(try peerStatus(dc, "notes", target.address)?["connected"] == true, "the link is open when the target stops")

        try target.restart(kill9: signal == "kill -9")
        let tc = try target.connect()
        #expect(try tc.call("peer.list", ["db": "notes"])["peers"] == [], "the restarted daemon dials nobody")
        var latencies: [Double] = []
        for i in 0..<5 {
            latencies.append(try #require(try deliver("to-target-\(i)", from: dc, to: tc), "write \(i) never reached the restarted daemon"))
            latencies.append(try #require(try deliver("from-target-\(i)", from: tc, to: dc), "write \(i) of the restarted daemon never arrived"))
        }
        print("\(restarted) restarted by \(signal): first write after the restart arrived in \(latencies[0]) s, the rest in at most \(latencies.dropFirst().max() ?? 0) s")
        #expect(try tc.call("sync.status")["strangersRefused"] == 0, "the dialing member is not taken for a stranger")
        let link = try #require(try peerStatus(dc, "notes", target.address))
        #expect(link["connected"] == true && link["rejected"] == [:])
        #expect(link["lastError"]?.stringValue?.hasPrefix("refused by the peer") != true, "\(link)")
        #expect(try replicaState(tc, "notes") == replicaState(dc, "notes"))
        creator.stop(kill9: false)
        member.stop(kill9: false)
    }

    /// The dialing side tells "refused" from "unreachable": a peer that does not serve the space closes the handshake
    /// after the dialer's proof, and a port nobody listens on refuses the connection.
    @Test func theDialingSideSaysWhyALinkIsDown() throws {
        let a = try RestartingDaemon(), stranger = try RestartingDaemon()
        let ca = try a.connect()
        _ = try ca.call("db.create", ["db": "notes"])
        _ = try ca.call("db.share", ["db": "notes"])
        let closed = try RestartingDaemon()
        closed.stop(kill9: false)
        for peer in [stranger.address, closed.address] { _ = try ca.call("peer.add", ["db": "notes", "address": .string(peer)]) }
        #expect(try eventually {
            try peerStatus(ca, "notes", stranger.address)?["lastError"]?.stringValue?.hasPrefix("refused by the peer: it closed the handshake") == true
                && peerStatus(ca, "notes", closed.address)?["lastError"]?.stringValue?.hasPrefix("connect: ") == true
        })
        #expect(try stranger.connect().call("sync.status")["strangersRefused"]?.intValue ?? 0 >= 1)
        a.stop(kill9: false)
        stranger.stop(kill9: false)
    }

    /// Both devices reach only a relay; each, restarted, is back in the space through it.
    @Test(arguments: ["creator", "member"], ["SIGTERM", "kill -9"])
    func aDaemonRestartedBehindARelayIsBackThroughIt(restarted: String, signal: String) throws {
        let relay = try RelayProcess()
        let creator = try RestartingDaemon(), member = try RestartingDaemon()
        let cc = try creator.connect(), cm = try member.connect()
        _ = try cc.call("db.create", ["db": "notes"])
        _ = try cm.call("db.join", ["token": .string(try cc.invite("notes")), "db": "notes"])
        try relay.addSpace(try cc.relayCapability("notes"))
        _ = try cm.call("peer.remove", ["db": "notes", "address": .string(creator.address)])
        for c in [cc, cm] { _ = try c.call("peer.add", ["db": "notes", "address": .string(relay.address)]) }
        #expect(try deliver("before", from: cc, to: cm) != nil)

        let (target, other) = restarted == "creator" ? (creator, member) : (member, creator)
        try target.restart(kill9: signal == "kill -9")
        let tc = try target.connect(), oc = try other.connect()
        for i in 0..<3 {
            #expect(try deliver("to-target-\(i)", from: oc, to: tc) != nil, "write \(i) never reached the restarted daemon")
            #expect(try deliver("from-target-\(i)", from: tc, to: oc) != nil, "write \(i) of the restarted daemon never arrived")
        }
        #expect(try replicaState(tc, "notes") == replicaState(oc, "notes"))
        creator.stop(kill9: false)
        member.stop(kill9: false)
        relay.stop()
    }

    /// Two devices meeting only in a folder; one, restarted, reads and writes the folder again.
    @Test(arguments: ["SIGTERM", "kill -9"])
    func aDaemonRestartedOnAFolderIsBackThroughIt(signal: String) throws {
        var team = try FolderTeam(count: 2)
        let folder = TempDir()
        for c in team.clients { _ = try c.call("folder.add", ["db": "team", "path": .string(folder.path)]) }
        #expect(try deliver("before", from: team.clients[0], to: team.clients[1], db: "team") != nil)
        if signal == "kill -9" { team.daemons[1].kill9() } else { team.daemons[1].stop() }
        try team.restart(1)
        for i in 0..<3 {
            #expect(try deliver("to-target-\(i)", from: team.clients[0], to: team.clients[1], db: "team") != nil)
            #expect(try deliver("from-target-\(i)", from: team.clients[1], to: team.clients[0], db: "team") != nil)
        }
        #expect(try replicaState(team.clients[0], "team") == replicaState(team.clients[1], "team"))
        team.stopAll()
    }
}
