import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// PEERS: blazed against PostgreSQL and Redis on Unix sockets on this machine, each a separate server process, all
/// measured in one run by the same blocking client code (`WireClient`: prebuilt request bytes out, one reply read and
/// checked per request, no parsing beyond each protocol's framing).
///
/// PostgreSQL runs with its defaults (`fsync=on`, `synchronous_commit=on`), the documents in a `jsonb` column with a
/// primary key on the id and expression indexes on `email` and `age`; Redis with `appendonly yes`,
/// `appendfsync always` (every write fsynced before its reply); blazed as a child process with its defaults
/// (`synchronous=FULL`). Rows a server has no counterpart for are left out for it.
enum PeerWorkloads {
    /// One server under test, and how each row's request reads in its protocol.
    struct Peer: Sendable {
        let name: String
        let socket: String
        let protocolKind: WireClient.Kind
        /// The request reading document `i` by id.
        let get: @Sendable (Int) -> [UInt8]
        /// The cheapest request the server answers.
        let trivial: [UInt8]
        /// The request durably inserting document `i`.
        let insert: @Sendable (Int) -> [UInt8]
        /// The request durably inserting document `i` as an outside client's first program does: into a collection
        /// (table) with no secondary index, the id left to blazed.
        let plainInsert: @Sendable (Int) -> [UInt8]
        /// The request finding 10 documents whose `age` is `a` through an index (nil: no such query).
        let find: (@Sendable (Int) -> [UInt8])?
        /// The request inserting documents `range` in one transaction (nil: no such request).
        let transaction: (@Sendable (Range<Int>) -> [UInt8])?
    }

    /// Runs the rows whose names start with one of `rows` (every row when nil).
    static func run(dir: String, preload: Int, operations: Int, repeats: Int, rows: [String]? = nil) throws -> [Result] {
        guard let redisPath = which("redis-server") else {
            throw ClientError("PEERS needs redis-server and PostgreSQL: run `make bench-peers`, which installs them")
        }
        let blazed = try BlazedChild(dir: dir + "/peers-blazed")
        defer { blazed.stop() }
        let postgres = try PostgresServer(durable: true)
        let redis = try RedisChild(executable: redisPath, dir: dir + "/peers-redis")
        defer { redis.stop() }
        let peers = [blazedPeer(socket: blazed.socket), postgresPeer(socket: postgres.directory), redisPeer(socket: redis.socket)]
        for peer in peers { try load(peer, count: preload) }

        var out: [Result] = []
        var next = preload  // the next unused document number for inserts
        // Each row measures the three servers one after another, `repeats` times, so drift hits them alike.
        func row(
            _ name: String, clients: Int, count: Int, latency: Bool, fresh: Bool = false, batch: Int = 1,
            request: (Peer) -> (@Sendable (Int) -> [UInt8])?
        ) throws {
            if let rows, !rows.contains(where: { name.hasPrefix($0) }) { return }
            var samples: [String: [Double]] = [:]
            var rates: [String: [Double]] = [:]
            // Each repeat's figure (p50 or rate) per server: blazed's ratio to PostgreSQL is the median of the
            // per-repeat ratios, since the two ran back to back under the same conditions.
            var perRepeat: [String: [Double]] = [:]
            for _ in 0..<repeats {
                for peer in peers {
                    guard let make = request(peer) else { continue }
                    let base = fresh ? next : 0
                    let kind = peer.protocolKind
                    let socket = peer.socket
                    // Requests are made before the clock starts: only sending one and reading its reply is timed.
                    let r = try onThreads(
                        clients, count: count, setup: { _ in try WireClient(kind, socket: socket) },
                        make: { i in make(fresh ? base + i * batch : (i * 7919) % preload) }
                    ) { c, request in
                        try (c as! WireClient).call(request)
                    }
                    if fresh { next += count * batch }
                    let rate = Double(r.latencies.count * batch) / r.wall
                    rates[peer.name, default: []].append(rate)
                    samples[peer.name, default: []] += latency ? r.latencies : [rate]
                    let sorted = r.latencies.sorted()
                    perRepeat[peer.name, default: []].append(latency ? sorted[sorted.count / 2] : rate)
                }
            }
            let unit = latency ? "µs" : (fresh ? "docs/s" : "req/s")
            var results = peers.compactMap { p in
                samples[p.name].map {
                    Result(name: "PEERS.\(name).\(p.name)", unit: unit, samples: $0, better: latency ? "lower" : "higher")
                }
            }
            for i in results.indices where latency {
                let perSecond = rates[String(results[i].name.split(separator: ".").last!)]!.sorted()
                results[i].note = String(format: "%.0f/s", perSecond[perSecond.count / 2])
            }
            let pg = results.first { $0.name.hasSuffix(".postgres") }
            let others = results.filter { !$0.name.hasSuffix(".blazed") }.map(\.median)
            for var r in results {
                if r.name.hasSuffix(".blazed"), let pg {
                    r.baseline = pg.name
                    r.latencyRatio = true
                    if let mine = perRepeat["blazed"], let theirs = perRepeat["postgres"] {
                        r.paired[pg.name] = zip(mine, theirs).map { $0 / $1 }
                    }
                    if others.count > 1, let best = latency ? others.min() : others.max() {
                        r.note = [r.note, String(format: "%.2f× the best peer", r.median / best)].compactMap { $0 }
                            .joined(separator: "; ")
                    }
                }
                out.append(r)
            }
        }
        let ops = operations
        try row("get.1client", clients: 1, count: ops, latency: true) { $0.get }
        try row("get.8clients", clients: 8, count: 4 * ops, latency: false) { $0.get }
        try row("trivial.8clients", clients: 8, count: 4 * ops, latency: false) { p in { _ in p.trivial } }
        try row("insert.1client", clients: 1, count: ops / 4, latency: true, fresh: true) { $0.insert }
        try row("insert.8clients", clients: 8, count: ops, latency: false, fresh: true) { $0.insert }
        try row("insert.plain.1client", clients: 1, count: ops / 4, latency: true, fresh: true) { $0.plainInsert }
        let find: (Peer) -> (@Sendable (Int) -> [UInt8])? = { p in
            guard let f = p.find else { return nil }
            return { i in f(i % 90) }
        }
        try row("find.1client", clients: 1, count: ops, latency: true, request: find)
        try row("find.8clients", clients: 8, count: 2 * ops, latency: false, request: find)
        let transaction: (Peer) -> (@Sendable (Int) -> [UInt8])? = { p in
            guard let t = p.transaction else { return nil }
            return { i in t(i..<(i + 500)) }
        }
        try row("tx500", clients: 1, count: max(2, ops / 500), latency: false, fresh: true, batch: 500, request: transaction)
        return out
    }

    /// Loads documents 0..<count into `peer`, 500 at a time (the store's own bulk path for each).
    static func load(_ peer: Peer, count: Int) throws {
        let c = try WireClient(peer.protocolKind, socket: peer.socket)
        if let t = peer.transaction {
            for start in stride(from: 0, to: count, by: 500) { try c.call(t(start..<min(count, start + 500))) }
        } else {
            for i in 0..<count { try c.call(peer.insert(i)) }
        }
        // Planner statistics, as blazed keeps its own (it analyzes as its tables grow).
        if peer.protocolKind == .postgres { try c.call(WireClient.pgQuery("VACUUM ANALYZE docs")) }
    }

    // MARK: the three servers' requests

    static func line(_ method: String, _ params: String) -> [UInt8] {
        Array("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\(method)\",\"params\":\(params)}\n".utf8)
    }

    static func blazedPeer(socket: String) -> Peer {
        Peer(
            name: "blazed", socket: socket, protocolKind: .blazed,
            get: { line("doc.get", "{\"db\":\"default\",\"collection\":\"c\",\"id\":\"\(String(format: "doc-%08d", $0))\"}") },
            trivial: line("daemon.info", "{}"),
            insert: { line("doc.insert", "{\"db\":\"default\",\"collection\":\"c\",\"doc\":\(benchJSON($0))}") },
            plainInsert: { line("doc.insert", "{\"db\":\"default\",\"collection\":\"plain\",\"doc\":\(benchJSON($0, id: false))}") },
            find: { line("query.find", "{\"db\":\"default\",\"collection\":\"c\",\"where\":{\"age\":\($0)},\"limit\":10}") },
            transaction: { range in
                let ops = range.map { "{\"op\":\"insert\",\"collection\":\"c\",\"doc\":\(benchJSON($0))}" }
                return line("tx.commit", "{\"db\":\"default\",\"ops\":[\(ops.joined(separator: ","))]}")
            })
    }

    static func postgresPeer(socket: String) -> Peer {
        let path = socket + "/.s.PGSQL.5432"
        return Peer(
            name: "postgres", socket: path, protocolKind: .postgres,
            get: { WireClient.pgExecute("get", [String(format: "doc-%08d", $0)]) },
            trivial: WireClient.pgExecute("one", []),
            insert: { WireClient.pgExecute("ins", [String(format: "doc-%08d", $0), benchJSON($0)]) },
            plainInsert: { WireClient.pgExecute("insplain", [String(format: "doc-%08d", $0), benchJSON($0, id: false)]) },
            find: { WireClient.pgExecute("find", [String($0)]) },
            transaction: { range in
                // One multi-row INSERT, its values as literals (the bench texts hold no quote characters).
                let rows = range.map { "('\(String(format: "doc-%08d", $0))','\(benchJSON($0))')" }
                return WireClient.pgQuery("INSERT INTO docs(id, body) VALUES " + rows.joined(separator: ","))
            })
    }

    static func redisPeer(socket: String) -> Peer {
        Peer(
            name: "redis", socket: socket, protocolKind: .redis,
            get: { WireClient.resp(["GET", String(format: "doc-%08d", $0)]) },
            trivial: WireClient.resp(["PING"]),
            insert: { WireClient.resp(["SET", String(format: "doc-%08d", $0), benchJSON($0)]) },
            plainInsert: { WireClient.resp(["SET", String(format: "plain-%08d", $0), benchJSON($0, id: false)]) },
            find: nil, transaction: nil)
    }

    static func which(_ name: String) -> String? {
        let dirs = (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin").split(separator: ":") + ["/usr/sbin", "/usr/bin"]
        return dirs.map { "\($0)/\(name)" }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// The `blazed` binary beside blazebench, started as `make run` starts it (its default settings and log level),
    /// with `email` and `age` indexed in collection `c`: what an outside client talks to.
    final class BlazedChild {
        let process = Process()
        let socket: String

        init(dir: String) throws {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            let binary = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
                .appendingPathComponent("blazed")
            guard FileManager.default.isExecutableFile(atPath: binary.path) else {
                throw ClientError("PEERS runs \(binary.path): build it first (`swift build -c release --product blazed`)")
            }
            socket = dir + "/blazed.sock"
            process.executableURL = binary
            process.arguments = ["--socket", socket, "--data-dir", dir + "/data"]
            process.environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("BLAZEDB_") }
                .merging(["XDG_CONFIG_HOME": dir + "/config"]) { $1 }
            _ = FileManager.default.createFile(atPath: dir + "/blazed.log", contents: nil)
            let log = FileHandle(forWritingAtPath: dir + "/blazed.log")
            process.standardOutput = log
            process.standardError = log
            try process.run()
            try log?.close()
            do {
                let c = try WireClient.waitForServer(.blazed, socket: socket, process: process)
                for field in ["email", "age"] {
                    try c.call(line("index.create", "{\"db\":\"default\",\"collection\":\"c\",\"fields\":[\"\(field)\"]}"))
                }
            } catch {
                stop()
                throw error
            }
        }

        func stop() {
            process.terminate()
            process.waitUntilExit()
        }
    }

    /// A throwaway Redis on a Unix socket only, every write fsynced to its append-only file before the reply.
    final class RedisChild {
        let process = Process()
        let socket: String

        init(executable: String, dir: String) throws {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            socket = dir + "/redis.sock"
            process.executableURL = URL(fileURLWithPath: executable)
            process.arguments = [
                "--port", "0", "--unixsocket", socket, "--unixsocketperm", "700", "--dir", dir, "--appendonly", "yes",
                "--appendfsync", "always", "--save", "", "--daemonize", "no", "--logfile", dir + "/redis.log",
            ]
            try process.run()
            _ = try WireClient.waitForServer(.redis, socket: socket, process: process)
        }

        /// Kills the server (a throwaway: nothing to save; and it inherits a mask that blocks SIGTERM).
        func stop() {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }
}
