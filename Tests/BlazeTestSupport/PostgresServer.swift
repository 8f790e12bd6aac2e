import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A throwaway PostgreSQL server for a test: a fresh cluster (`initdb`) in a temporary directory, listening only on a
/// Unix socket in that directory, run as an unprivileged user when the tests run as root (PostgreSQL refuses root).
/// `stop()` / `start()` restart it on the same data; deinit stops it and removes everything.
///
/// The server binaries come from `BLAZE_POSTGRES_BIN`, else the newest `/usr/lib/postgresql/*/bin` (Debian's
/// `postgresql` package, which `.ci/run` installs).
public final class PostgresServer: @unchecked Sendable {
    // @unchecked: the process handle is only touched by the owning test.
    /// The directory holding the cluster (`data/`) and the socket.
    public let directory: String
    private let bin: String
    private var process: Process?
    private let log: String
    /// False for test servers (`fsync=off`); true for benchmark peers, which must pay for durable commits.
    private let durable: Bool

    /// The URL `blaze-relay --postgres` takes.
    public var url: String { "postgres://blaze@/postgres?host=\(directory)" }

    /// Creates and starts the cluster (with `fsync=off` unless `durable`); throws with what to install when PostgreSQL
    /// is not there.
    public init(durable: Bool = false) throws {
        self.durable = durable
        bin = try Self.findBinaries()
        var template = Array("/tmp/blazepg-XXXXXX".utf8CString)
        directory = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        log = directory + "/server.log"
        chmod(directory, 0o755)
        if getuid() == 0 {
            // The unprivileged user must own the directory it writes the cluster and socket into.
            chown(directory, Self.nobody.uid, Self.nobody.gid)
        }
        let initdb = try Self.run(
            bin + "/initdb", ["-D", directory + "/data", "-U", "blaze", "--auth=trust", "--no-sync", "-E", "UTF8"])
        guard initdb.status == 0 else { throw PostgresServerError("initdb failed: \(initdb.output)") }
        try start()
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Starts the server on the existing cluster and waits (at most 30 s) until it accepts connections.
    public func start() throws {
        guard process == nil else { return }
        let p = Process()
        let args =
            [
                bin + "/postgres", "-D", directory + "/data", "-k", directory, "-c", "listen_addresses=",
                "-c", "max_connections=200",
            ] + (durable ? [] : ["-c", "fsync=off"])
        p.executableURL = URL(fileURLWithPath: Self.asUnprivileged(args)[0])
        p.arguments = Array(Self.asUnprivileged(args).dropFirst())
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        p.standardOutput = FileHandle(forWritingAtPath: log)
        p.standardError = FileHandle(forWritingAtPath: log)
        try p.run()
        process = p
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline {
            if try Self.run(bin + "/pg_isready", ["-h", directory, "-p", "5432", "-U", "blaze", "-q"]).status == 0 { return }
            guard p.isRunning else { break }
            usleep(50_000)
        }
        throw PostgresServerError("PostgreSQL did not start: \((try? String(contentsOfFile: log, encoding: .utf8)) ?? "")")
    }

    /// Stops the server (fast shutdown: open transactions roll back) and waits for it to exit.
    public func stop() {
        guard let p = process else { return }
        process = nil
        if p.isRunning {
            kill(p.processIdentifier, SIGINT)
            p.waitUntilExit()
        }
    }

    /// Runs `sql` with `psql` and returns its output (unaligned, tuples only).
    public func psql(_ sql: String) throws -> String {
        let r = try Self.run(bin + "/psql", ["-h", directory, "-U", "blaze", "-d", "postgres", "-At", "-c", sql])
        guard r.status == 0 else { throw PostgresServerError("psql failed: \(r.output)") }
        return r.output
    }

    /// The whole database as `pg_dump` writes it (plain SQL; bytea as hex).
    public func dump() throws -> String {
        let r = try Self.run(bin + "/pg_dump", ["-h", directory, "-U", "blaze", "-d", "postgres"])
        guard r.status == 0 else { throw PostgresServerError("pg_dump failed: \(r.output)") }
        return r.output
    }

    // MARK: Helpers

    private static let nobody: (uid: uid_t, gid: gid_t) = {
        guard let pw = getpwnam("nobody") else { return (65534, 65534) }
        return (pw.pointee.pw_uid, pw.pointee.pw_gid)
    }()

    /// `args` as run by an unprivileged user when this process is root (setpriv, from util-linux).
    private static func asUnprivileged(_ args: [String]) -> [String] {
        guard getuid() == 0 else { return args }
        return ["/usr/bin/setpriv", "--reuid=\(nobody.uid)", "--regid=\(nobody.gid)", "--clear-groups", "--"] + args
    }

    private static func findBinaries() throws -> String {
        if let dir = ProcessInfo.processInfo.environment["BLAZE_POSTGRES_BIN"] { return dir }
        let root = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []).compactMap(Int.init).sorted()
        for v in versions.reversed() where FileManager.default.isExecutableFile(atPath: "\(root)/\(v)/bin/postgres") {
            return "\(root)/\(v)/bin"
        }
        throw PostgresServerError(
            "PostgreSQL server binaries not found: install Debian's postgresql package (.ci/run does) or set BLAZE_POSTGRES_BIN")
    }

    private static func run(_ executable: String, _ arguments: [String]) throws -> (status: Int32, output: String) {
        let full = executable.hasSuffix("/psql") ? [executable] + arguments : asUnprivileged([executable] + arguments)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: full[0])
        p.arguments = Array(full.dropFirst())
        let pipe = Pipe()
        p.standardOutput = pipe
        p.standardError = pipe
        try p.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: data, as: UTF8.self))
    }
}

/// Why a throwaway PostgreSQL server could not be set up.
public struct PostgresServerError: Error, CustomStringConvertible {
    /// What went wrong.
    public let description: String
    init(_ description: String) { self.description = description }
}
