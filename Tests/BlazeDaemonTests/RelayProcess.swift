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
    /// The URL devices reach it at, as it printed it.
    private(set) var address = ""
    private let out = Mutex<String>("")
    private let err = Mutex<String>("")
    private let ready = DispatchSemaphore(value: 0)
    private var settled = false

    var dataDir: String { dir.path + "/relay" }
    var logText: String { err.withLock { $0 } }

    /// The PostgreSQL server it keeps its data in, nil for SQLite.
    let postgres: PostgresServer?
    /// The blaze-relay it runs (and that `addSpace` runs).
    let executable: String

    init(
        dir: TempDir = TempDir(), arguments: [String] = [], listen: String = "127.0.0.1:0", postgres: PostgresServer? = nil,
        environment: [String: String] = [:], executable: String? = nil
    ) throws {
        self.dir = dir
        self.postgres = postgres
        self.executable = executable ?? buildDirectory + "/blaze-relay"
        process.executableURL = URL(fileURLWithPath: self.executable)
        process.arguments =
            ["serve", "--data-dir", dir.path + "/relay", "--listen", listen] + (postgres.map { ["--postgres", $0.url] } ?? [])
            + arguments
        // No settings from this machine's environment or configuration file; its own empty XDG_CONFIG_HOME.
        process.environment = isolatedEnvironment(config: dir.path + "/config").merging(environment) { $1 }
        let stdout = Pipe(), stderr = Pipe()
        process.standardOutput = stdout
        process.standardError = stderr
        drain(stdout) { [weak self] data in
            guard let self else { return }
            let all = self.out.withLock { $0 += String(decoding: data, as: UTF8.self); return $0 }
            if all.contains("\n") { self.ready.signal() }
        }
        drain(stderr) { [weak self] data in
            guard let self else { return }
            self.err.withLock { $0 += String(decoding: data, as: UTF8.self) }
        }
        try process.run()
        guard ready.wait(timeout: .now() + 30) == .success,
            let line = out.withLock({ $0 }).split(separator: "\n").first, line.hasPrefix("listening "),
            let url = PeerAddress(String(line.dropFirst("listening ".count))), case .webSocket = url.transport
        else {
            settled = true
            process.terminate()
            throw ClientError("blaze-relay did not start: \(out.withLock { $0 }) \(logText)")
        }
        port = url.port
        address = url.description
    }

    /// Serves the space of `capability` (`blaze-relay add-space -`, the token on stdin).
    func addSpace(_ capability: String) throws {
        let r = try run(
            executable,
            ["add-space", "--data-dir", dataDir] + (postgres.map { ["--postgres", $0.url] } ?? []) + ["-"],
            input: capability + "\n")
        guard r.status == 0 else { throw ClientError("add-space failed: \(r.err)") }
    }

    /// The highest seq the relay holds per origin (hex) of every space, read from its database.
    func held() throws -> [String: Int64] {
        if let postgres {
            let text = try postgres.psql("SELECT encode(origin, 'hex'), max(seq) FROM relay_entries GROUP BY origin")
            return Dictionary(
                uniqueKeysWithValues: text.split(separator: "\n").compactMap { line -> (String, Int64)? in
                    let parts = line.split(separator: "|")
                    guard parts.count == 2, let seq = Int64(parts[1]) else { return nil }
                    return (String(parts[0]), seq)
                })
        }
        let queue = try DatabaseQueue(path: dataDir + "/relay.db")
        return try queue.read { db in
            Dictionary(
                uniqueKeysWithValues: try Row.fetchAll(db, sql: "SELECT origin, max(seq) FROM relay_entries GROUP BY origin").map {
                    (hexString(Array($0[0] as Data)), $0[1] as Int64)
                })
        }
    }

    /// The connections the relay has open besides the one asking (`GET /healthz` counts itself), nil when it does
    /// not answer.
    func connections() -> Int? {
        guard let body = try? httpExchange(port: port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").body,
            let health: JSONValue = try? JSONParser().parse(body), let count = health["connections"]?.intValue
        else { return nil }
        return Int(count) - 1
    }

    /// Rows of one of the relay's tables (in its SQLite file, or its PostgreSQL database).
    func count(_ table: String) throws -> Int {
        if let postgres {
            return try Int(postgres.psql("SELECT count(*) FROM \(table)").trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
        }
        return try DatabaseQueue(path: dataDir + "/relay.db").read { try Int.fetchOne($0, sql: "SELECT count(*) FROM \(table)") ?? 0 }
    }

    /// SIGTERM and a clean exit, with no error logged (unless `errorsExpected`: its store was taken away meanwhile).
    func stop(errorsExpected: Bool = false, sourceLocation: SourceLocation = #_sourceLocation) {
        settled = true
        guard process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
        #expect(process.terminationReason == .exit && process.terminationStatus == 0, sourceLocation: sourceLocation)
        if !errorsExpected {
            #expect(!logText.contains("error"), "relay logged errors: \(logText)", sourceLocation: sourceLocation)
        }
    }

    /// SIGKILL: the process ends mid-whatever, as a crash or an OOM kill would end it.
    func killHard() {
        settled = true
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    deinit {
        guard !settled, process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
    }
}

/// One HTTP/1.1 exchange over a new loopback connection (the relay closes after each answer): the status code (0
/// when the answer is not HTTP) and the body.
func httpExchange(port: Int, _ request: String) throws -> (status: Int, body: String) {
    let fd = try HostileMember.openSocket(port: port, timeoutSeconds: 10)
    defer { Glibc.close(fd) }
    let bytes = Array(request.utf8)
    guard bytes.withUnsafeBytes({ send(fd, $0.baseAddress!, $0.count, Int32(MSG_NOSIGNAL)) }) == bytes.count else {
        throw ClientError("send failed")
    }
    var answer: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65_536)
    while answer.count < 1 << 22 {
        let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
        guard n > 0 else { break }
        answer += buffer[..<n]
    }
    let text = String(decoding: answer, as: UTF8.self)
    let status = text.hasPrefix("HTTP/1.1 ") ? Int(text.dropFirst(9).prefix(3)) ?? 0 : 0
    let body = text.range(of: "\r\n\r\n").map { String(text[$0.upperBound...]) } ?? ""
    return (status, body)
}

/// A daemon whose database `team` is shared and served by `relay`: the daemon, a connection to it, the capability.
func sharedTeam(servedBy relay: RelayProcess) throws -> (DaemonProcess, BlazeConnection, String) {
    let a = try syncDaemon()
    let ca = try a.connect()
    _ = try ca.call("db.create", ["db": "team"])
    _ = try ca.call("db.share", ["db": "team"])
    let capability = try ca.relayCapability("team")
    try relay.addSpace(capability)
    return (a, ca, capability)
}

extension BlazeConnection {
    /// The relay capability of `db` (any member prints it).
    func relayCapability(_ db: String) throws -> String {
        try #require(try call("db.relayCapability", ["db": .string(db)])["capability"]?.stringValue)
    }
}

/// How many changes of its own a daemon's database holds (its entry in `db.info`'s version vector).
func ownSeq(_ c: BlazeConnection, _ db: String) throws -> Int64 {
    let info = try c.call("db.info", ["db": .string(db)])
    let node = info["nodeId"]?.stringValue ?? ""
    return try #require(info["versionVector"]?[node]?.intValue)
}
