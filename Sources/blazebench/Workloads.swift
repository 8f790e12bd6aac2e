import BlazeClient
import BlazeCRDT
import BlazeDaemon
import BlazeProtocol
import BlazeStore
import BlazeSync
import Foundation
import Logging
import Synchronization

/// The workloads of issue #7 that current capabilities allow (W1–W3, W8); the others arrive with sync.
enum Workloads {
    /// W1: store insert and update with CRDT bookkeeping, in process, 1,000-change transactions.
    ///
    /// Each repeat samples its baseline (B_ins, B_ins.idx, B_upd.idx) just before each of its phases, and the ratios
    /// reported are the medians of those pairs.
    static func store(
        dir: String, n: Int, repeats: Int, docs: [[String: JSONValue]], texts: [String], updated: [String]
    ) throws -> [Result] {
        var inserts: [Double] = []
        var updates: [Double] = []
        var plain: [Double] = []
        var pairs: [String: [Double]] = [:]
        let indexed = ["email", "age"]
        for r in 0..<repeats {
            let bIns = try Baselines.insertRate(dir: dir, name: "w1-bins-\(r)", n: n, texts: texts, indexedFields: [])
            // The same inserts into a collection without user indexes: the counterpart of B_ins.
            let bare = try Store(directory: "\(dir)/w1-bare-\(r)", node: NodeID(bytes: [UInt8](repeating: UInt8(r + 1), count: 16)))
            let bareDB = try bare.create("bench")
            plain.append(
                Double(n)
                    / (try seconds {
                        for chunk in stride(from: 0, to: n, by: 1000) {
                            _ = try bareDB.commit((chunk..<min(chunk + 1000, n)).map { .insert(collection: "c", doc: docs[$0]) })
                        }
                    }))
            bare.closeAll()
            pairs["noidx/B_ins", default: []].append(plain[r] / bIns)
            let bIdx = try Baselines.insertRate(dir: dir, name: "w1-bidx-\(r)", n: n, texts: texts, indexedFields: indexed)
            let store = try Store(directory: "\(dir)/w1-\(r)", node: NodeID(bytes: [UInt8](repeating: UInt8(r + 1), count: 16)))
            let db = try store.create("bench")
            _ = try db.write { tx in try tx.createIndex(collection: "c", fields: ["email"], name: nil) }
            _ = try db.write { tx in try tx.createIndex(collection: "c", fields: ["age"], name: nil) }
            let ti = try seconds {
                for chunk in stride(from: 0, to: n, by: 1000) {
                    _ = try db.commit((chunk..<min(chunk + 1000, n)).map { .insert(collection: "c", doc: docs[$0]) })
                }
            }
            let bUpd = try Baselines.updateRate(
                dir: dir, name: "w1-bupd-\(r)", n: n, texts: texts, updated: updated, indexedFields: indexed)
            let tu = try seconds {
                for chunk in stride(from: 0, to: n, by: 1000) {
                    _ = try db.commit(
                        (chunk..<min(chunk + 1000, n)).map {
                            .patch(collection: "c", id: docs[$0]["_id"]!.stringValue!, set: ["score": .double(Double($0))])
                        })
                }
            }
            inserts.append(Double(n) / ti)
            updates.append(Double(n) / tu)
            pairs["insert/B_ins", default: []].append(inserts[r] / bIns)
            pairs["insert/B_ins.idx", default: []].append(inserts[r] / bIdx)
            pairs["update/B_ins", default: []].append(updates[r] / bIns)
            pairs["update/B_upd.idx", default: []].append(updates[r] / bUpd)
            store.closeAll()
        }
        return [
            Result(name: "W1.insert.noidx", unit: "docs/s", samples: plain, better: "higher", baseline: "B_ins",
                target: "≥ 0.5×", note: "no user index", paired: ["B_ins": pairs["noidx/B_ins"]!]),
            Result(name: "W1.insert", unit: "docs/s", samples: inserts, better: "higher", baseline: "B_ins",
                secondBaseline: "B_ins.idx", target: "≥ 0.5×", note: "2 indexed fields",
                paired: ["B_ins": pairs["insert/B_ins"]!, "B_ins.idx": pairs["insert/B_ins.idx"]!]),
            Result(name: "W1.update", unit: "docs/s", samples: updates, better: "higher", baseline: "B_ins",
                secondBaseline: "B_upd.idx", target: "≥ 0.5×", note: "patch set one field",
                paired: ["B_ins": pairs["update/B_ins"]!, "B_upd.idx": pairs["update/B_upd.idx"]!]),
        ]
    }

    /// W1.commit: durable single-document writes one at a time, in process (no RPC): their p50 latency against
    /// B_commit, the same document inserted by plain SQLite in a transaction of its own into the same table and
    /// indexes as B_ins.idx, the two interleaved so that both see the same conditions.
    static func singleCommits(dir: String, count: Int, docs: [[String: JSONValue]], texts: [String]) throws -> [Result] {
        let store = try Store(directory: "\(dir)/w1-commit", node: NodeID(bytes: [UInt8](repeating: 9, count: 16)))
        defer { store.closeAll() }
        let db = try store.create("bench")
        for field in ["email", "age"] { _ = try db.write { tx in try tx.createIndex(collection: "c", fields: [field], name: nil) } }
        let raw = try Baselines.indexedTable(dir, "bcommit", indexedFields: ["email", "age"])
        defer { try? raw.close() }
        let ids = Baselines.ids(count)
        func micros(_ body: () throws -> Void) rethrows -> Double {
            let start = DispatchTime.now().uptimeNanoseconds
            try body()
            return Double(DispatchTime.now().uptimeNanoseconds - start) / 1000
        }
        var (ours, plain): ([Double], [Double]) = ([], [])
        for i in 0..<count {
            ours.append(try micros { _ = try db.apply(.insert(collection: "c", doc: docs[i])) })
            plain.append(
                try micros {
                    try raw.write { db in
                        try db.cachedStatement(sql: "INSERT INTO t(collection, id, body) VALUES (?, ?, ?)").execute(
                            arguments: ["c", ids[i], texts[i]])
                    }
                })
        }
        return [
            Result(name: "B_commit", unit: "µs", samples: plain, better: "lower", note: "raw SQLite, 1 row per fsync'd tx"),
            Result(
                name: "W1.commit", unit: "µs", samples: ours, better: "lower", baseline: "B_commit",
                note: "in process, 2 indexed fields", latencyRatio: true),
        ]
    }

    /// RSS: a daemon alone in a child process is loaded with `documents` documents through `tx.commit` (1,000 per
    /// request), then serves 1,000 random reads; reports its resident memory then and at its peak.
    static func residentMemory(dir: String, documents: Int) throws -> Result {
        let child = Process()
        child.executableURL = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        child.arguments = ["--serve-daemon", dir]
        try child.run()
        defer {
            child.terminate()
            child.waitUntilExit()
        }
        let socket = "\(dir)/rpc/blazed.sock"
        let deadline = Date().addingTimeInterval(60)
        var connection: BlazeConnection?
        while connection == nil {
            connection = try? BlazeConnection(socketPath: socket, timeoutSeconds: 600)
            if connection == nil {
                guard Date() < deadline, child.isRunning else { throw ClientError("RSS: the daemon did not start") }
                usleep(10_000)
            }
        }
        let c = connection!
        for start in stride(from: 0, to: documents, by: 1000) {
            let ops: [[String: JSONValue]] = (start..<min(documents, start + 1000)).map { i in
                ["op": "insert", "collection": "c", "doc": .object(documentValue(i))]
            }
            try c.perform(RPC.TxCommit(db: "default", ops: ops))
        }
        let held = try c.call(RPC.DbInfo(db: "default")).documents
        guard held == documents else { throw ClientError("RSS: the daemon holds \(held) documents") }
        var rng = SystemRandomNumberGenerator()
        for _ in 0..<1000 {
            let id = String(format: "doc-%08d", Int.random(in: 0..<documents, using: &rng))
            try c.perform(RPC.DocGet(db: "default", collection: "c", id: id))
        }
        let status = (try? String(contentsOfFile: "/proc/\(child.processIdentifier)/status", encoding: .utf8)) ?? ""
        func kib(_ field: String) -> Double {
            let line = status.split(separator: "\n").first { $0.hasPrefix(field + ":") } ?? ""
            return Double(line.split(separator: " ").dropFirst().first ?? "0") ?? 0
        }
        let rss = kib("VmRSS") / 1024
        return Result(
            name: "RSS.\(documents)", unit: "MiB", samples: [rss], better: "lower",
            note: String(format: "daemon resident memory with %d documents loaded and 1,000 reads served; peak %.0f MiB",
                documents, kib("VmHWM") / 1024))
    }

    /// Benchmark document `i` as a JSON object.
    static func documentValue(_ i: Int) -> [String: JSONValue] {
        try! JSONParser().parse(benchJSON(i)).objectValue!
    }

    /// A daemon served in process, for the RPC workloads.
    final class LocalDaemon: @unchecked Sendable {
        // @unchecked: `task` is set once in init and only cancelled afterwards.
        let socket: String
        let daemon: Daemon
        var task: Task<Void, any Error>?

        init(dir: String, syncListen: String? = nil, folderOptions: FolderOptions = FolderOptions()) async throws {
            socket = "\(dir)/rpc/blazed.sock"
            var logger = Logger(label: "blazebench.daemon")
            logger.logLevel = .critical
            var config = DaemonConfig(socketPath: socket, dataDirectory: "\(dir)/rpc-data")
            config.syncListen = syncListen
            config.folderOptions = folderOptions
            daemon = try Daemon(config: config, logger: logger)
            let daemon = self.daemon
            task = Task { try await daemon.run() }
            await daemon.waitUntilListening()
        }

        func stop() async {
            task?.cancel()
            _ = await task?.result
        }
    }

    static func params(_ i: Int, _ docs: [[String: JSONValue]]) -> RPC.DocInsert {
        RPC.DocInsert(db: "default", collection: "c", doc: docs[i])
    }

    /// W2 and W3: inserts and reads over the socket, single client and 8 clients.
    static func rpc(dir: String, n: Int, docs: [[String: JSONValue]]) async throws -> [Result] {
        let d = try await LocalDaemon(dir: dir)
        defer { Task { await d.stop() } }
        let socket = d.socket
        let setup: @Sendable (Int) throws -> Any = { _ in try BlazeConnection(socketPath: socket, timeoutSeconds: 60) }
        let prep = try BlazeConnection(socketPath: socket, timeoutSeconds: 60)
        try prep.perform(RPC.IndexCreate(db: "default", collection: "c", fields: ["email"]))
        try prep.perform(RPC.IndexCreate(db: "default", collection: "c", fields: ["age"]))
        let shared = docs
        var out: [Result] = []

        let single = try onThreads(1, count: n, setup: setup) { c, i in
            try (c as! BlazeConnection).perform(params(i, shared))
        }
        out.append(Result(name: "W2.insert.1client", unit: "µs", samples: single.latencies, better: "lower", baseline: "B_echo",
            target: "p50 ≤ B_echo + 30 µs", note: String(format: "%.0f docs/s", Double(n) / single.wall)))
        let eight = try onThreads(8, count: n, setup: setup) { c, i in
            try (c as! BlazeConnection).perform(params(n + i, shared))
        }
        out.append(Result(name: "W2.insert.8clients", unit: "docs/s", samples: [Double(eight.latencies.count) / eight.wall],
            better: "higher", baseline: "B_auto", target: "≥ 10,000 docs/s"))
        let batches = max(1, n / 500)
        let tx = try seconds {
            for b in 0..<batches {
                let ops: [[String: JSONValue]] = (0..<500).map { k in
                    ["op": "insert", "collection": "c", "doc": .object(shared[2 * n + b * 500 + k])]
                }
                try prep.perform(RPC.TxCommit(db: "default", ops: ops))
            }
        }
        out.append(Result(name: "W2.tx500", unit: "docs/s", samples: [Double(batches * 500) / tx], better: "higher",
            baseline: "B_ins", target: "≥ 0.5×"))

        let gets = try onThreads(1, count: n, setup: setup) { c, i in
            try (c as! BlazeConnection).perform(
                RPC.DocGet(db: "default", collection: "c", id: shared[(i * 7919) % n]["_id"]!.stringValue!))
        }
        out.append(Result(name: "W3.get.1client", unit: "µs", samples: gets.latencies, better: "lower", baseline: "B_echo",
            target: "p50 ≤ B_echo + 20 µs"))
        let finds = try onThreads(1, count: n, setup: setup) { c, i in
            let email = shared[(i * 7919) % n]["email"]!
            try (c as! BlazeConnection).perform(RPC.QueryFind(db: "default", collection: "c", where: ["email": email], limit: 10))
        }
        out.append(Result(name: "W3.find.1client", unit: "µs", samples: finds.latencies, better: "lower", baseline: "B_echo",
            target: "p50 ≤ B_echo + 20 µs", note: "indexed equality"))
        let parallel = try onThreads(8, count: n, setup: setup) { c, i in
            try (c as! BlazeConnection).perform(
                RPC.DocGet(db: "default", collection: "c", id: shared[(i * 7919) % n]["_id"]!.stringValue!))
        }
        out.append(Result(name: "W3.get.8clients", unit: "req/s", samples: [Double(parallel.latencies.count) / parallel.wall],
            better: "higher", target: "≥ 50,000 req/s"))
        prep.close()
        return out
    }

    /// W8: latency from issuing a write to its event arriving at each of `subscribers` subscriptions (one connection
    /// and one OS thread per subscriber), writes issued one at a time.
    static func fanOut(dir: String, writes: Int, subscribers: Int) async throws -> Result {
        let d = try await LocalDaemon(dir: dir)
        defer { Task { await d.stop() } }
        let socket = d.socket
        let ready = DispatchSemaphore(value: 0)
        let arrivals = Mutex<[[UInt64]]>([])
        let failures = Mutex<[String]>([])
        var threads: [Thread] = []
        for _ in 0..<subscribers {
            let t = Thread {
                var times = [UInt64](repeating: 0, count: writes)
                do {
                    let c = try BlazeConnection(socketPath: socket, timeoutSeconds: 60)
                    _ = try c.call(RPC.Subscribe(db: "default", collection: "fan"))
                    ready.signal()
                    var received = 0
                    while received < writes {
                        let n = try c.nextNotification(RPCNotification.Subscription.self)
                        let now = DispatchTime.now().uptimeNanoseconds
                        for e in n.events ?? [] {
                            if let i = e.doc?["i"]?.intValue { times[Int(i)] = now }
                            received += 1
                        }
                    }
                } catch {
                    failures.withLock { $0.append("\(error)") }
                    ready.signal()
                }
                arrivals.withLock { $0.append(times) }
            }
            t.stackSize = 1 << 20
            t.start()
            threads.append(t)
        }
        for _ in 0..<subscribers { ready.wait() }
        let writer = try BlazeConnection(socketPath: socket, timeoutSeconds: 60)
        var sent = [UInt64](repeating: 0, count: writes)
        for i in 0..<writes {
            sent[i] = DispatchTime.now().uptimeNanoseconds
            try writer.perform(RPC.DocPut(db: "default", collection: "fan", doc: ["i": .int(Int64(i))], id: "d\(i % 100)"))
        }
        while arrivals.withLock({ $0.count }) < subscribers { try writer.perform(RPC.DaemonInfo()) }
        if let failure = failures.withLock({ $0.first }) { throw ClientError("fan-out subscriber failed: \(failure)") }
        let latencies = arrivals.withLock { all in
            all.flatMap { times in zip(times, sent).map { Double($0 &- $1) / 1000 } }
        }
        return Result(
            name: "W8.fanout.\(subscribers)", unit: "µs", samples: latencies, better: "lower",
            note: "write issued → event at each of \(subscribers) subscribers (includes the commit)")
    }
}
