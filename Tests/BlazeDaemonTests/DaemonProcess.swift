import BlazeClient
import BlazeProtocol
import Foundation
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Directory holding the built executables (next to the test bundle).
let buildDirectory = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent().path

/// A temporary directory removed on deinit.
final class TempDir {
    let path: String
    init() {
        var template = Array("/tmp/blazetest-XXXXXX".utf8CString)
        path = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// A real `blazed` process on a temporary socket and data directory; killed and checked on `stop()`/deinit.
///
/// Like Core Lightning's fixture, a test fails if the daemon logged at error level or crashed.
final class DaemonProcess: @unchecked Sendable {
    // @unchecked: `process` is only touched from the owning test; the log buffer is behind a Mutex.
    let dir: TempDir
    let socket: String
    let dataDir: String
    let process = Process()
    private let log = Mutex<String>("")
    private let ready = DispatchSemaphore(value: 0)
    private let readySignalled = Mutex(false)
    /// Set once the test stopped or killed the process itself; otherwise deinit stops it and checks it.
    private var settled = false
    /// Set by tests that provoke error-level log lines without calling `stop(expectErrors: true)`.
    var expectsErrors = false

    /// Starts blazed (this build's, or the one at `executable`) with `arguments` after the socket and data flags, in
    /// an environment without `BLAZEDB_*` settings or systemd variables and with its own empty `XDG_CONFIG_HOME`, plus
    /// `environment`.
    init(
        arguments: [String] = [], dir: TempDir = TempDir(), dataDir: String? = nil, environment: [String: String] = [:],
        executable: String? = nil
    ) throws {
        self.dir = dir
        socket = dir.path + "/run/blazed.sock"
        self.dataDir = dataDir ?? dir.path + "/data"
        process.executableURL = URL(fileURLWithPath: executable ?? buildDirectory + "/blazed")
        process.arguments = ["--socket", socket, "--data-dir", self.dataDir] + arguments
        process.environment = isolatedEnvironment(config: dir.path + "/config").merging(environment) { $1 }
        let pipe = Pipe()
        process.standardError = pipe
        process.standardOutput = FileHandle.nullDevice
        drain(pipe) { [weak self] data in
            guard let self else { return }
            let text = String(decoding: data, as: UTF8.self)
            let all = self.log.withLock { $0 += text; return $0 }
            if all.contains("Listening") || all.contains("blazed: ") {
                let first = self.readySignalled.withLock { old in defer { old = true }; return !old }
                if first { self.ready.signal() }
            }
        }
        try process.run()
        guard ready.wait(timeout: .now() + 60) == .success, logText.contains("Listening") else {
            settled = true
            process.terminate()
            throw ClientError("blazed did not start: \(logText)")
        }
    }

    var pid: Int32 { process.processIdentifier }
    var logText: String { log.withLock { $0 } }

    /// A client whose every result is checked against its schema in the protocol document (`ResultSchemas`).
    func connect(timeout: Int = 60) throws -> BlazeConnection {
        let c = try BlazeConnection(socketPath: socket, timeoutSeconds: timeout)
        ResultSchemas.observe(c)
        return c
    }

    /// Resident memory of the daemon in KiB.
    func rssKiB() -> Int {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") } ?? ""
        return Int(line.split(separator: " ").dropFirst().first ?? "0") ?? 0
    }

    func kill9() {
        settled = true
        // Only a process still running: the pid of one that ended may belong to another process by now.
        guard process.isRunning else { return }
        kill(pid, SIGKILL)
        process.waitUntilExit()
    }

    /// SIGTERM, wait for a clean exit, and check the log for errors.
    func stop(expectErrors: Bool = false, sourceLocation: SourceLocation = #_sourceLocation) {
        settled = true
        guard process.isRunning else { return }
        process.terminate()
        process.waitUntilExit()
        #expect(process.terminationReason == .exit && process.terminationStatus == 0,
            "blazed exited with \(process.terminationStatus)", sourceLocation: sourceLocation)
        if !expectErrors {
            #expect(loggedErrors.isEmpty, "daemon logged errors: \(loggedErrors)", sourceLocation: sourceLocation)
        }
    }

    /// The daemon runs and serves local clients: a write, a read and a delete succeed on `db`.
    func expectServing(db: String, sourceLocation: SourceLocation = #_sourceLocation) throws {
        #expect(process.isRunning, "blazed stopped", sourceLocation: sourceLocation)
        let c = try connect(timeout: 20)
        let id = "probe-\(UUID().uuidString.prefix(8))"
        _ = try c.call("doc.insert", ["db": .string(db), "collection": "notes", "doc": ["_id": .string(id), "v": 1]])
        _ = try c.call("doc.patch", ["db": .string(db), "collection": "notes", "id": .string(id), "incr": ["v": 1]])
        #expect(try c.call("doc.get", ["db": .string(db), "collection": "notes", "id": .string(id)])["doc"]?["v"] == 2,
            sourceLocation: sourceLocation)
        _ = try c.call("doc.delete", ["db": .string(db), "collection": "notes", "id": .string(id)])
    }

    /// The error-level lines of the log.
    var loggedErrors: [Substring] {
        logText.split(separator: "\n").filter { $0.contains("level=error") || $0.contains("level=critical") }
    }

    /// A test that ends without `stop()` (it threw, or forgot) still fails if the daemon crashed or logged errors.
    deinit {
        guard !settled else { return }
        if process.isRunning {
            process.terminate()
            process.waitUntilExit()
        } else if process.terminationReason == .uncaughtSignal {
            Issue.record("blazed died of signal \(process.terminationStatus); log:\n\(logText.suffix(2000))")
        }
        if !expectsErrors && !loggedErrors.isEmpty {
            Issue.record("daemon logged errors: \(loggedErrors)")
        }
    }
}

/// Reads `pipe` with blocking reads on a thread of its own until end of file, handing each piece read to `onData`.
///
/// Not `FileHandle.readabilityHandler`: on Linux, tearing down the dispatch read source it installs races
/// libdispatch's epoll bookkeeping, and the test process crashed in `_dispatch_event_loop_drain` (CI, stop 67). A
/// blocking read registers nothing with libdispatch.
func drain(_ pipe: Pipe, _ onData: @escaping @Sendable (Data) -> Void) {
    let handle = pipe.fileHandleForReading
    let thread = Thread {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(handle.fileDescriptor, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            onData(Data(buffer[..<n]))
        }
        // The handle (and so the descriptor) lives as long as this loop, which ends at end of file or on an error.
        withExtendedLifetime(handle) {}
    }
    thread.name = "pipe drain"
    thread.start()
}

/// This process's environment without BlazeDB settings or systemd's variables, with `XDG_CONFIG_HOME` at `config`.
func isolatedEnvironment(config: String) -> [String: String] {
    var env = ProcessInfo.processInfo.environment.filter {
        !$0.key.hasPrefix("BLAZEDB_") && !$0.key.hasPrefix("BLAZE_RELAY_") && !["NOTIFY_SOCKET", "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"].contains($0.key)
    }
    env["XDG_CONFIG_HOME"] = config
    return env
}

/// Runs a command, returning exit status, stdout and stderr; `input`, when given, is its standard input.
func run(_ executable: String, _ arguments: [String], environment: [String: String]? = nil, input: String? = nil) throws
    -> (status: Int32, out: String, err: String)
{
    let p = Process()
    p.executableURL = URL(fileURLWithPath: executable)
    p.arguments = arguments
    if let environment { p.environment = environment }
    let out = Pipe()
    let err = Pipe()
    p.standardOutput = out
    p.standardError = err
    let stdin = Pipe()
    if input != nil { p.standardInput = stdin }
    try p.run()
    if let input {
        stdin.fileHandleForWriting.write(Data(input.utf8))
        try stdin.fileHandleForWriting.close()
    }
    let o = out.fileHandleForReading.readDataToEndOfFile()
    let e = err.fileHandleForReading.readDataToEndOfFile()
    p.waitUntilExit()
    return (p.terminationStatus, String(decoding: o, as: UTF8.self), String(decoding: e, as: UTF8.self))
}

/// Calls a method expecting an error, returning it.
func expectRPCError(
    _ c: BlazeConnection, _ method: String, _ params: [String: JSONValue], code: Int, kind: String? = nil,
    sourceLocation: SourceLocation = #_sourceLocation
) {
    do {
        let r = try c.call(method, params)
        Issue.record("\(method) succeeded with \(r.jsonText); expected error \(code)", sourceLocation: sourceLocation)
    } catch let e as RPCError {
        #expect(e.code == code, "\(method): \(e)", sourceLocation: sourceLocation)
        if let kind { #expect(e.kind == kind, "\(method): \(e)", sourceLocation: sourceLocation) }
    } catch {
        Issue.record("\(method): unexpected \(error)", sourceLocation: sourceLocation)
    }
}
