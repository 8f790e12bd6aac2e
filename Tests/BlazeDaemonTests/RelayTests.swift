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

    init(dir: TempDir = TempDir()) throws {
        self.dir = dir
        process.executableURL = URL(fileURLWithPath: buildDirectory + "/blaze-relay")
        process.arguments = ["serve", "--data-dir", dir.path + "/relay", "--listen", "127.0.0.1:0"]
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
}
