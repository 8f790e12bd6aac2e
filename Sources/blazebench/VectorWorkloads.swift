import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import BlazeVector
import Foundation

/// VECTOR: nearest-neighbour search over the same vectors and queries in blazed and in the vector libraries users
/// compare it with (Benchmarks/vector_baselines.py: FAISS, sqlite-vec, hnswlib), one thread each, one query at a time.
///
/// The vectors are clustered, as embeddings are (`count / 100` centres, each vector a centre plus noise), L2, k = 10.
/// Rows: V0 loading the documents through the socket; V1 the exact search of the engine alone (`VectorMatrix`,
/// in this process) and V2 through the socket (`query.nearest`, the documents fetched and projected); V3 the vector
/// index's build and its first search (the rows read into memory); V4 a filter admitting a tenth of the documents;
/// V5 the index's memory against the raw vectors; V7 the first search after the daemon restarts (its graph read back
/// from the file written when it stopped). The baselines' rows are `VB.*`.
enum VectorWorkloads {
    static func run(dir: String, count: Int, dimensions d: Int, queries q: Int, k: Int) async throws -> [Result] {
        let work = dir + "/vector"
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: work) }
        let (vectors, queries) = makeVectors(count: count, dimensions: d, queries: q)
        try write(vectors.joined(), to: work + "/vectors.f32")
        try write(queries.joined(), to: work + "/queries.f32")
        try Data((0..<count).map { UInt8($0 % 10 == 0 ? 1 : 0) }).write(to: URL(fileURLWithPath: work + "/filter.u8"))
        var out: [Result] = []
        let baselines = try runBaselines(work, count: count, dimensions: d, queries: q, k: k)

        // V1: the engine alone.
        var matrix = VectorMatrix(dimensions: d)
        let build = seconds {
            matrix.reserve(count)
            for (i, v) in vectors.enumerated() { matrix.set(Int64(i), v) }
        }
        var answers: [[Int64]] = []
        var engine: [Double] = []
        for query in queries {
            var hits: [VectorHit] = []
            engine.append(seconds { hits = matrix.nearest(to: query, k: k, metric: .l2) } * 1e6)
            answers.append(hits.map(\.id))
        }
        let agreement = baselines.ids.map { recall(answers.map { $0.map(Int.init) }, $0, k: k) }
        out.append(Result(
            name: "V1.exact.engine", unit: "µs", samples: engine, better: "lower",
            baseline: baselines.has("VB.faiss.flat") ? "VB.faiss.flat" : nil,
            secondBaseline: baselines.has("VB.sqlitevec.knn") ? "VB.sqlitevec.knn" : nil, target: "≤ 1.5× FAISS IndexFlat",
            note: "\(count) × \(d) float32, L2, k=\(k), one thread; built in \(String(format: "%.2f", build)) s"
                + (agreement.map { String(format: "; top-\(k) equal to FAISS's: %.4f", $0) } ?? ""),
            latencyRatio: true))
        // V6: the approximate index (HNSW, M = 16, efConstruction = 200), at the smallest efSearch whose recall@k
        // against the exact answers is ≥ 0.95.
        var graph = HNSWGraph(for: matrix, metric: .l2)
        let graphBuild = seconds { graph.extend(to: matrix.slotCount, in: matrix) }
        for ef in [16, 32, 48, 64, 96, 128, 192, 256, 384, 512] {
            var latencies: [Double] = [], found = 0
            for (i, query) in queries.enumerated() {
                var hits: [VectorHit] = []
                latencies.append(seconds { hits = graph.nearest(to: query, k: k, ef: ef, in: matrix) } * 1e6)
                found += Set(hits.map(\.id)).intersection(answers[i]).count
            }
            let r = Double(found) / Double(k * queries.count)
            guard r >= 0.95 || ef == 512 else { continue }
            out.append(Result(
                name: "V6.hnsw.engine", unit: "µs", samples: latencies, better: "lower",
                baseline: baselines.has("VB.hnswlib") ? "VB.hnswlib" : nil,
                secondBaseline: baselines.has("VB.faiss.hnsw") ? "VB.faiss.hnsw" : nil, target: "≤ 2× hnswlib (≥ 0.5× its queries/s)",
                note: String(format: "recall@\(k) %.3f at efSearch %d; built in %.1f s (one thread); index %.2f× raw (links %.2f×)", r, ef,
                    graphBuild, Double(matrix.bytes + graph.bytes) / Double(count * d * 4), Double(graph.bytes) / Double(count * d * 4)),
                latencyRatio: true))
            break
        }
        out.append(Result(
            name: "V5.indexMemory", unit: "× raw", samples: [Double(matrix.bytes) / Double(count * d * 4)], better: "lower",
            target: "≤ 1.5×", note: "the in-memory index (rows, norms, ids; loaded with its count known) over the raw float32 bytes; the row id map not counted"))
        matrix = VectorMatrix(dimensions: d)

        // V0, V2–V4: through a daemon.
        var daemon = try await Workloads.LocalDaemon(dir: work)
        defer {
            let last = daemon
            Task { await last.stop() }
        }
        var c = try BlazeConnection(socketPath: daemon.socket, timeoutSeconds: 600)
        let load = try seconds {
            for start in stride(from: 0, to: count, by: 500) {
                let ops: [JSONValue] = (start..<min(count, start + 500)).map { i in
                    [
                        "op": "put", "collection": "v", "id": .string("d\(i)"),
                        "doc": ["e": ["$vector": .string(VectorValue.encode(vectors[i]))], "b": .int(Int64(i % 10)), "i": .int(Int64(i))],
                    ]
                }
                _ = try c.call("tx.commit", ["db": "default", "ops": .array(ops)])
            }
        }
        out.append(Result(
            name: "V0.load", unit: "docs/s", samples: [Double(count) / load], better: "higher",
            note: String(format: "tx.commit of 500 documents with a %d-d vector (base64), %.1f MB/s of vectors", d,
                Double(count * d * 4) / load / 1e6)))
        let indexBuild = try seconds {
            _ = try c.call("index.create", ["db": "default", "collection": "v", "fields": ["e"], "vector": ["dimensions": .int(Int64(d)), "metric": "l2"]])
        }
        _ = try c.call("index.create", ["db": "default", "collection": "v", "fields": ["b"]])
        func search(_ query: [Float], where filter: JSONValue? = nil) throws -> JSONValue {
            var p: [String: JSONValue] = [
                "db": "default", "collection": "v", "field": "e", "vector": .string(VectorValue.encode(query)), "k": .int(Int64(k)),
                "fields": ["i"],
            ]
            if let filter { p["where"] = filter }
            return try c.call("query.nearest", p)
        }
        func nearest(_ query: [Float], where filter: JSONValue? = nil) throws -> [Int] {
            try search(query, where: filter)["results"]?.arrayValue?.compactMap { $0["doc"]?["i"]?.intValue.map(Int.init) } ?? []
        }
        let first = try seconds { _ = try nearest(queries[0]) }
        out.append(Result(
            name: "V3.build", unit: "s", samples: [indexBuild], better: "lower",
            note: String(format: "index.create over %d documents (each vector decoded into vector_rows); the first search then "
                + "read them into memory in %.2f s", count, first)))
        var rpc: [Double] = [], rpcAnswers: [[Int]] = []
        for query in queries {
            var ids: [Int] = []
            rpc.append(try seconds { ids = try nearest(query) } * 1e6)
            rpcAnswers.append(ids)
        }
        guard rpcAnswers == answers.map({ $0.map(Int.init) }) else { throw BenchFailure("VECTOR: query.nearest answered otherwise than the engine") }
        out.append(Result(
            name: "V2.exact.rpc", unit: "µs", samples: rpc, better: "lower", baseline: baselines.has("VB.faiss.flat") ? "VB.faiss.flat" : nil,
            note: "query.nearest through the socket (base64 query, the \(k) documents fetched and projected to one field)",
            latencyRatio: true))
        var filtered: [Double] = []
        var filteredAnswers: [[Int]] = []
        for query in queries {
            var ids: [Int] = []
            filtered.append(try seconds { ids = try nearest(query, where: ["b": 0]) } * 1e6)
            filteredAnswers.append(ids)
        }
        guard filteredAnswers.allSatisfy({ $0.count == k && $0.allSatisfy { $0 % 10 == 0 } }) else {
            throw BenchFailure("VECTOR: a filtered search returned documents outside the filter or fewer than k")
        }
        let filteredAgreement = baselines.filteredIDs.map { recall(filteredAnswers, $0, k: k) }
        out.append(Result(
            name: "V4.filtered.rpc", unit: "µs", samples: filtered, better: "lower",
            baseline: baselines.has("VB.faiss.flat.filtered") ? "VB.faiss.flat.filtered" : nil,
            note: "where {b: 0} (a tenth, b indexed), pre-filtered exact search: recall 1 by construction"
                + (filteredAgreement.map { String(format: "; top-\(k) equal to FAISS's: %.4f", $0) } ?? ""),
            latencyRatio: true))

        // V7: the daemon's graph (built on its own thread since the first search) is written to a file when the
        // daemon stops; the next daemon's first search answers from it instead of building it again. Only an index of
        // 10,000 rows or more gets a graph (the store's `VectorIndexes.approximateFrom`): `--quick` has fewer.
        guard count >= 10_000 else { return baselines.rows + out }
        let built = Date()
        while try search(queries[0])["approximate"] != true {
            guard Date().timeIntervalSince(built) < 900 else { throw BenchFailure("VECTOR: the daemon built no graph in 15 minutes") }
            try await Task.sleep(for: .milliseconds(200))
        }
        let waited = Date().timeIntervalSince(built)
        let stopping = Date()
        await daemon.stop()
        let stopped = Date().timeIntervalSince(stopping)
        let files = try FileManager.default.contentsOfDirectory(atPath: work + "/rpc-data/databases").filter { $0.contains(".vx-") }
        let fileBytes = try files.reduce(0) { sum, name in
            sum + ((try FileManager.default.attributesOfItem(atPath: work + "/rpc-data/databases/" + name)[.size] as? Int) ?? 0)
        }
        daemon = try await Workloads.LocalDaemon(dir: work)
        c = try BlazeConnection(socketPath: daemon.socket, timeoutSeconds: 600)
        var restarted: JSONValue = .null
        let firstAfter = try seconds { restarted = try search(queries[0]) }
        guard restarted["approximate"] == true else { throw BenchFailure("VECTOR: the first search after a restart did not use the saved graph") }
        out.append(Result(
            name: "V7.restart.firstSearch", unit: "s", samples: [firstAfter], better: "lower",
            note: String(format: "the first query.nearest after a restart, answered from the graph read back from its file "
                + "(%.0f MB; written in the %.1f s the daemon took to stop); without the file a daemon builds the graph again "
                + "on a thread of its own, which took %.0f s here from the first search to the first approximate answer "
                + "(exact answers meanwhile)", Double(fileBytes) / 1e6, stopped, waited)))
        return baselines.rows + out
    }

    /// `count` clustered vectors and `queries` query vectors (near the same centres), from a fixed seed.
    static func makeVectors(count: Int, dimensions d: Int, queries q: Int) -> (vectors: [[Float]], queries: [[Float]]) {
        var rng = SeededRandom(seed: 52)
        func uniform() -> Float { Float(rng.next() >> 40) / Float(1 << 24) * 2 - 1 }
        let centres = (0..<max(1, count / 100)).map { _ in (0..<d).map { _ in uniform() } }
        func near(_ c: [Float]) -> [Float] { c.map { $0 + 0.3 * uniform() } }
        let vectors = (0..<count).map { _ in near(centres[Int(rng.next() % UInt64(centres.count))]) }
        let queries = (0..<q).map { _ in near(centres[Int(rng.next() % UInt64(centres.count))]) }
        return (vectors, queries)
    }

    static func write(_ floats: some Sequence<Float>, to path: String) throws {
        var bytes = [UInt8]()
        for f in floats { withUnsafeBytes(of: f.bitPattern.littleEndian) { bytes.append(contentsOf: $0) } }
        try Data(bytes).write(to: URL(fileURLWithPath: path))
    }

    /// The fraction of `exact`'s top-k that `answers` found, over the queries both have.
    static func recall(_ answers: [[Int]], _ exact: [[Int]], k: Int) -> Double {
        let pairs = zip(answers, exact)
        let hits = pairs.reduce(0) { $0 + Set($1.0.prefix(k)).intersection($1.1.prefix(k)).count }
        return Double(hits) / Double(max(1, k * min(answers.count, exact.count)))
    }

    struct Baselines {
        var rows: [Result] = []
        /// FAISS IndexFlat's answers to the first queries, and its filtered ones.
        var ids: [[Int]]?
        var filteredIDs: [[Int]]?
        func has(_ name: String) -> Bool { rows.contains { $0.name == name } }
    }

    /// Runs Benchmarks/vector_baselines.py with the Python in `BLAZEBENCH_VECTOR_PYTHON` or `.build/vector-venv`
    /// (made by `make bench-vectors`); none: no baseline rows, and a row saying so.
    static func runBaselines(_ work: String, count: Int, dimensions d: Int, queries q: Int, k: Int) throws -> Baselines {
        let python = ProcessInfo.processInfo.environment["BLAZEBENCH_VECTOR_PYTHON"] ?? ".build/vector-venv/bin/python"
        var b = Baselines()
        guard FileManager.default.isExecutableFile(atPath: python), FileManager.default.fileExists(atPath: "Benchmarks/vector_baselines.py") else {
            b.rows.append(Result(
                name: "VB.missing", unit: "-", samples: [0], better: "lower",
                note: "no baselines: run `make bench-vectors` (a venv with numpy, faiss-cpu, hnswlib, sqlite-vec)"))
            return b
        }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: python)
        process.arguments = ["Benchmarks/vector_baselines.py", work, "\(count)", "\(d)", "\(q)", "\(k)"]
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let output = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        for line in String(decoding: output, as: UTF8.self).split(separator: "\n") {
            guard case .object(let row) = try JSONParser().parse(String(line)), let name = row["name"]?.stringValue else { continue }
            if let missing = row["missing"]?.stringValue {
                b.rows.append(Result(name: "VB.\(name)", unit: "-", samples: [0], better: "lower", note: "not installed: \(missing)"))
                continue
            }
            let samples = row["latencies_us"]?.arrayValue?.compactMap(number) ?? []
            let ids = row["ids"]?.arrayValue?.map { $0.arrayValue?.compactMap { $0.intValue.map(Int.init) } ?? [] }
            if name == "faiss.flat" { b.ids = ids }
            if name == "faiss.flat.filtered" { b.filteredIDs = ids }
            var notes: [String] = []
            if let r = row["recall"].flatMap(number) { notes.append(String(format: "recall@\(k) %.3f", r)) }
            if let ef = row["ef"]?.intValue { notes.append("efSearch \(ef)") }
            if let s = row["build_s"].flatMap(number) { notes.append(String(format: "built in %.2f s", s)) }
            if let m = row["memory_bytes"].flatMap(number), m > 0 { notes.append(String(format: "%.2f× raw", m / Double(count * d * 4))) }
            b.rows.append(Result(name: "VB.\(name)", unit: "µs", samples: samples, better: "lower", note: notes.joined(separator: "; ")))
        }
        return b
    }

    static func number(_ v: JSONValue) -> Double? {
        switch v {
        case .int(let i): return Double(i)
        case .double(let d): return d
        default: return nil
        }
    }
}
