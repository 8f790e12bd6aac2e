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

/// A real `blaze-relay` process on loopback with a temporary data directory; stopped (and checked) by `stop()`,
/// killed on deinit otherwise.
final class RelayProcess: @unchecked Sendable {
    // @unchecked: `process` is only touched from the owning test; the output buffers are behind Mutexes.
    let dir: TempDir
    let process = Process()
    private(set) var port = 0
    private let out = Mutex<String>("")
    private let err = Mutex<String>("")
    private let ready = DispatchSemaphore(value: 0)
    private var settled = false

    var dataDir: String { dir.path + "/relay" }
    var address: String { "127.0.0.1:\(port)" }
    var logText: String { err.withLock { $0 } }

    init(dir: TempDir = TempDir(), arguments: [String] = []) throws {
        self.dir = dir
        process.executableURL = URL(fileURLWithPath: buildDirectory + "/blaze-relay")
        process.arguments = ["serve", "--data-dir", dir.path + "/relay", "--listen", "127.0.0.1:0"] + arguments
        let stdout = Pipe(), stderr = Pipe()
        process.standardOutput = stdout
        process.standardError = stderr
        stdout.fileHandleForReading.readabilityHandler = { [weak self] handle in
            let data = handle.availableData
            guard let self, !data.isEmpty else { return }
            let all = self.out.withLock { $0 += String(decoding: data, as: UTF8.self); return $0 }
            if all.contains("\n") { self.ready.signal() }
        }
        stderr.fileHandleForReading.readabilityHandler = { [weak self] handle in
            let data = handle.availableData
            guard let self, !data.isEmpty else { return }
            self.err.withLock { $0 += String(decoding: data, as: UTF8.self) }
        }
        try process.run()
        guard ready.wait(timeout: .now() + 30) == .success,
            let line = out.withLock({ $0 }).split(separator: "\n").first, line.hasPrefix("listening "),
            let p = Int(line.split(separator: ":").last ?? "")
        else {
            settled = true
            process.terminate()
            throw ClientError("blaze-relay did not start: \(out.withLock { $0 }) \(logText)")
        }
        port = p
    }

    /// Serves the space of `capability` (`blaze-relay add-space -`, the token on stdin).
    func addSpace(_ capability: String) throws {
        let r = try run(
            buildDirectory + "/blaze-relay", ["add-space", "--data-dir", dataDir, "-"], input: capability + "\n")
        guard r.status == 0 else { throw ClientError("add-space failed: \(r.err)") }
    }

    /// The highest seq the relay holds per origin (hex) of every space, read from its database.
    func held() throws -> [String: Int64] {
        let queue = try DatabaseQueue(path: dataDir + "/relay.db")
        return try queue.read { db in
            Dictionary(
                uniqueKeysWithValues: try Row.fetchAll(db, sql: "SELECT origin, max(seq) FROM relay_entries GROUP BY origin").map {
                    (hexString(Array($0[0] as Data)), $0[1] as Int64)
                })
        }
    }

    /// Rows of one of the relay's tables.
    func count(_ table: String) throws -> Int {
        try DatabaseQueue(path: dataDir + "/relay.db").read { try Int.fetchOne($0, sql: "SELECT count(*) FROM \(table)") ?? 0 }
    }

    /// SIGTERM and a clean exit, with no error logged.
    func stop(sourceLocation: SourceLocation = #_sourceLocation) {
        settled = true
        guard process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
        #expect(process.terminationReason == .exit && process.terminationStatus == 0, sourceLocation: sourceLocation)
        #expect(!logText.contains("error"), "relay logged errors: \(logText)", sourceLocation: sourceLocation)
    }

    deinit {
        guard !settled, process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
    }
}

/// How many changes of its own a daemon's database holds (its entry in `db.info`'s version vector).
func ownSeq(_ c: BlazeConnection, _ db: String) throws -> Int64 {
    let info = try c.call("db.info", ["db": .string(db)])
    let node = info["nodeId"]?.stringValue ?? ""
    return try #require(info["versionVector"]?[node]?.intValue)
}

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
        let capability = try #require(try ca.call("db.relayCapability", ["db": "team"])["capability"]?.stringValue)
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
        try relay.addSpace(try #require(try ca.call("db.relayCapability", ["db": "team"])["capability"]?.stringValue))
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
        let a = try syncDaemon()
        let ca = try a.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try ca.call("db.share", ["db": "team"])
        let capability = try #require(try ca.call("db.relayCapability", ["db": "team"])["capability"]?.stringValue)
        try relay.addSpace(capability)
        let cap = try RelayCapability(text: capability)
        // A device proving another space's capability is closed during the handshake.
        #expect(throws: (any Error).self) { try HostileMember(key: SpaceKey.generate()).connect(port: relay.port) }
        // Bytes that are not a sealed frame close the connection.
        let garbage = HostileMember(key: cap.key)
        try garbage.connect(port: relay.port)
        try garbage.writeAll([UInt8](repeating: 0xAB, count: 64))
        #expect(garbage.awaitClose().closed)
        // A device outside the log signs and seals entries (with a key of its own): refused, nothing stored.
        let outsider = HostileMember(key: cap.key)
        outsider.key = try SpaceKey(id: cap.space, capability: cap.capability, epoch: 1, current: SpaceKey.randomSecret(), ring: [])
        try outsider.connect(port: relay.port)
        try outsider.send(SyncTarget.change(outsider, [HostileMember.docOp("notes", "forged", set: ["v": .int(1)])]))
        #expect(outsider.awaitClose().error == "not_a_member")
        // Membership operations it signs (a create of its own, an add of itself) never take part in the log: the
        // relay keeps none of them.
        let forger = HostileMember(key: cap.key)
        try forger.connect(port: relay.port)
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
        // A JOIN: only members admit devices.
        let joiner = HostileMember(key: cap.key)
        try joiner.connect(port: relay.port)
        try joiner.send([6] + SpaceKey.randomBytes(48))
        #expect(joiner.awaitClose().error == "invite_unknown")
        // A message that does not decode.
        let malformed = HostileMember(key: cap.key)
        try malformed.connect(port: relay.port)
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

    @Test func connectionsOverTheLimitsAreClosedBeforeAByteIsRead() throws {
        let relay = try RelayProcess(arguments: ["--max-connections", "2", "--handshake-timeout", "30"])
        let a = try syncDaemon()
        let ca = try a.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try ca.call("db.share", ["db": "team"])
        let capability = try #require(try ca.call("db.relayCapability", ["db": "team"])["capability"]?.stringValue)
        try relay.addSpace(capability)
        // Two connections that never finish their handshake hold both places; a third is closed at once.
        let held = try (0..<2).map { _ in try HostileMember.openSocket(port: relay.port) }
        let third = try HostileMember.openSocket(port: relay.port)
        var byte: UInt8 = 0
        #expect(recv(third, &byte, 1, 0) == 0, "closed without a word")
        Glibc.close(third)
        // A place freed is a place taken: the member gets through.
        Glibc.close(held[0])
        let member = HostileMember(key: try RelayCapability(text: capability).key)
        #expect(eventually { (try? member.connect(port: relay.port)) != nil })
        member.close()
        Glibc.close(held[1])
        a.stop()
        relay.stop()
    }

    @Test func operatorErrorsAreClear() throws {
        let dir = TempDir()
        let bad = try run(buildDirectory + "/blaze-relay", ["add-space", "--data-dir", dir.path, "not-a-token"])
        #expect(bad.status != 0 && bad.err.contains("not a relay capability"))
        let limits = try run(buildDirectory + "/blaze-relay", ["serve", "--data-dir", dir.path, "--max-connections", "0"])
        #expect(limits.status != 0 && limits.err.contains("--max-connections must be from 1"))
        let help = try run(buildDirectory + "/blaze-relay", ["--help"])
        #expect(help.status == 0 && help.out.contains("add-space") && help.out.contains("serve"))
    }
}
