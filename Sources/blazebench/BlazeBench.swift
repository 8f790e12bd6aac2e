import ArgumentParser
import BlazeProtocol
import Foundation

@main
struct BlazeBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "blazebench",
        abstract: "Measures BlazeDB workloads against baselines taken in the same run (see Benchmarks/README.md).")

    @Flag(help: "A small version of every workload, in seconds (a smoke test; its figures mean little).")
    var quick = false

    @Flag(help: "Print machine-readable results.")
    var json = false

    @Option(help: "Documents per workload (default 20,000; 1,000 with --quick).")
    var count: Int?

    @Option(help: "Repeats of the throughput measurements (default 3; 1 with --quick).")
    var repeats: Int?

    @Option(help: "Photos in the BLOB group's library (B7: 3 MB each; default 1,000; 20 with --quick).")
    var photos: Int?

    @Option(help: "Only these groups, comma-separated: baselines, W1, RPC (W2 and W3), W4 (with W5 and W7), RELAY, FOLDER, W6 (or only its one-thread part, W6.store), STORAGE, JOIN, W8, M1, M2, M3, RSS, ABUSE (hostile devices against a relay and a daemon), BLOB (chunked files against cp, and fetched by a peer against rsync; or one part: BLOB.local, BLOB.peer, BLOB.relay, BLOB.edit, BLOB.photos, BLOB.memory, BLOB.gc); PEERS (blazed against PostgreSQL and Redis, only when named: `make bench-peers`); CATCHUP (a device back online takes 1,000,000 changes from a relay, only when named: `make bench-catchup`); VECTOR (nearest-neighbour search against FAISS, sqlite-vec and hnswlib: `make bench-vectors`).")
    var only: String?

    @Option(help: "PEERS rows to run, comma-separated prefixes (get, trivial, insert, find, tx500); all by default.")
    var peerRows: String?

    @Option(help: .hidden) var serveDaemon: String?

    func wants(_ group: String) -> Bool {
        guard let only else { return true }
        return only.lowercased().split(separator: ",").contains { $0.trimmingCharacters(in: .whitespaces) == group.lowercased() }
    }

    func run() async throws {
        if let serveDaemon {
            // The child process of the RSS workload: a daemon alone in its process, until it is terminated.
            let daemon = try await Workloads.LocalDaemon(dir: serveDaemon)
            _ = await daemon.task?.result
            return
        }
        let n = count ?? (quick ? 1000 : 20_000)
        let reps = repeats ?? (quick ? 1 : 3)
        let dir = NSTemporaryDirectory() + "blazebench-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { if ProcessInfo.processInfo.environment["BLAZEBENCH_KEEP"] == nil { try? FileManager.default.removeItem(atPath: dir) } }
        let total = 3 * n + 1000
        let texts = (0..<total).map { benchJSON($0) }
        let docs = try texts.map { text -> [String: JSONValue] in try JSONParser().parse(text).objectValue! }

        // The documents W1.update writes: `score` set to the document's number.
        let updated = docs.prefix(n).enumerated().map { i, doc in
            var d = doc
            d["score"] = .double(Double(i))
            return JSONValue.object(d).jsonText
        }
        var results: [Result] = []
        if wants("baselines") {
            results.append(try Baselines.inserts(dir: dir, n: n, repeats: reps, texts: texts))
            results.append(try Baselines.inserts(dir: dir, n: n, repeats: reps, texts: texts, indexedFields: ["email", "age"]))
            results.append(
                try Baselines.updates(
                    dir: dir, n: n, repeats: reps, texts: texts, updated: updated, indexedFields: ["email", "age"]))
            results.append(try Baselines.autocommit(dir: dir, n: max(200, n / 10), repeats: reps, texts: texts))
            results.append(try Baselines.pointReads(dir: dir, n: n, texts: texts))
            results.append(try await Baselines.echo(dir: dir, n: n))
            results.append(try await Baselines.asyncEcho(dir: dir, n: n))
            results += try Baselines.crypto(n: max(100, n / 10))
        }
        if wants("W1") {
            results += try Workloads.store(dir: dir, n: n, repeats: reps, docs: docs, texts: texts, updated: updated)
            results += try Workloads.singleCommits(dir: dir, count: quick ? 100 : 2000, docs: docs, texts: texts)
        }
        if wants("RPC") { results += try await Workloads.rpc(dir: dir, n: n, docs: docs) }
        if wants("W4") || wants("W5") {
            results += try await SyncWorkloads.run(dir: dir, n: quick ? 1000 : 5 * n, docs: docs, latencyWrites: quick ? 20 : 500)
        }
        if wants("RELAY") {
            results += try await RelayWorkloads.run(dir: dir, n: quick ? 1000 : 5 * n, docs: docs, latencyWrites: quick ? 20 : 500)
            for backend in ["sqlite", "postgres"] {
                results += try await RelayLoad.run(
                    devices: quick ? 100 : 1000, spaces: quick ? 10 : 100, entriesPerDevice: quick ? 10 : 100, backend: backend)
            }
        }
        if wants("FOLDER") {
            results += try await FolderWorkloads.run(
                dir: dir, n: quick ? 1000 : 5 * n, docs: docs, latencyWrites: quick ? 20 : 500, pollWrites: quick ? 3 : 30)
        }
        if wants("W6") {
            results += try await SyncWorkloads.offlineMerge(
                dir: dir, docCount: quick ? 200 : 10_000, updates: quick ? 1000 : 50_000, docs: docs)
        }
        if wants("W6") || wants("W6.store") {
            results += try MergeWorkloads.run(dir: dir, docCount: quick ? 200 : 10_000, updates: quick ? 1000 : 50_000, docs: docs)
        }
        if wants("STORAGE") {
            results += try StorageWorkloads.run(
                dir: dir, inserts: quick ? 2000 : 100_000, docCount: quick ? 500 : 10_000, updates: quick ? 2000 : 100_000,
                texts: texts, docs: docs)
        }
        if wants("JOIN") {
            results += try await JoinWorkloads.run(
                dir: dir, docCount: quick ? 2000 : 100_000, updates: quick ? 20_000 : 1_000_000, docs: docs)
        }
        if only != nil, wants("PEERS") {
            results += try PeerWorkloads.run(
                dir: dir, preload: n, operations: max(200, n / 4), repeats: reps,
                rows: peerRows.map { $0.split(separator: ",").map { String($0) } })
        }
        if only != nil, wants("CATCHUP") {
            results += try await CatchupWorkloads.run(
                dir: dir, docCount: quick ? 1000 : 100_000, changes: quick ? 20_000 : 1_000_000, docs: docs)
        }
        if wants("ABUSE") {
            results += try await AbuseWorkloads.run(dir: dir, quick: quick)
        }
        if wants("RSS") {
            results.append(try Workloads.residentMemory(dir: dir + "/rss", documents: quick ? 10_000 : 1_000_000))
        }
        // BLOB runs all seven parts; `BLOB.local` (B1–B3), `BLOB.peer` (B4), `BLOB.relay` (B5), `BLOB.edit` (B6),
        // `BLOB.photos` (B7), `BLOB.memory` (B8) and `BLOB.gc` (B9) one each.
        let blob = wants("BLOB")
        if blob || wants("BLOB.local") {
            results += try BlobWorkloads.run(dir: dir, megabytes: quick ? 16 : 512, repeats: reps)
        }
        if blob || wants("BLOB.peer") {
            results += try await BlobPeerWorkloads.run(dir: dir, megabytes: quick ? 16 : 512, repeats: reps)
        }
        if blob || wants("BLOB.relay") {
            results += try await BlobRelayWorkloads.run(dir: dir, megabytes: quick ? 16 : 512, repeats: reps)
        }
        if blob || wants("BLOB.edit") { results += try await BlobSetWorkloads.edit(dir: dir, megabytes: quick ? 64 : 1024) }
        if blob || wants("BLOB.photos") {
            results += try await BlobSetWorkloads.photos(dir: dir, photos: photos ?? (quick ? 20 : 1000))
        }
        if blob || wants("BLOB.memory") { results += try BlobMemoryWorkloads.run(dir: dir, megabytes: quick ? 32 : 1024) }
        if blob || wants("BLOB.gc") { results += try await BlobGCWorkloads.run(dir: dir, documents: quick ? 10_000 : 500_000) }
        if wants("VECTOR") {
            // BLAZEBENCH_VECTOR_COUNT: fewer vectors, for profiling.
            let count = ProcessInfo.processInfo.environment["BLAZEBENCH_VECTOR_COUNT"].flatMap { Int($0) }
            results += try await VectorWorkloads.run(
                dir: dir, count: count ?? (quick ? 2000 : 100_000), dimensions: quick ? 64 : 768, queries: quick ? 10 : 100, k: 10)
        }
        if wants("VECTOR") || wants("VECTOR.sync") {
            results += try await PhotoBrainWorkloads.run(dir: dir, count: quick ? 1000 : 10_000, dimensions: 768)
        }
        if wants("M1") { results += try MembershipWorkloads.revocation(members: 50, repeats: quick ? 1 : 5) }
        if wants("M2") { results += try MembershipWorkloads.merge(sizes: quick ? [200] : [1_000, 10_000], repeats: quick ? 1 : 3) }
        if wants("M3") { results += try MembershipWorkloads.take(sizes: quick ? [200] : [1_000, 10_000], merges: quick ? 3 : 20) }
        if wants("W8") {
            let writes = quick ? 50 : 1000
            results.append(try await Workloads.fanOut(dir: dir + "/w8-1", writes: writes, subscribers: 1))
            results.append(try await Workloads.fanOut(dir: dir + "/w8-100", writes: writes, subscribers: 100))
        }

        let byName = Dictionary(uniqueKeysWithValues: results.map { ($0.name, $0) })
        for i in results.indices {
            // A paired ratio needs no baseline result; otherwise median over the baseline's median, same unit.
            func ratio(_ to: String) -> Double? {
                if let pairs = results[i].paired[to], !pairs.isEmpty { return pairs.sorted()[pairs.count / 2] }
                guard let base = byName[to], base.unit == results[i].unit else { return nil }
                return results[i].median / base.median
            }
            if let s = results[i].secondBaseline, let r = ratio(s) {
                results[i].secondRatio = r
                results[i].note = [results[i].note, String(format: "%.2f× %@", r, s)].compactMap { $0 }.joined(separator: "; ")
            }
            guard let b = results[i].baseline else { continue }
            results[i].ratio = ratio(b)
            if let base = byName[b], results[i].unit == "µs", base.unit == "µs", !results[i].latencyRatio {
                results[i].note = [results[i].note, String(format: "p50 − %@ = %+.1f µs", b, results[i].median - base.median)]
                    .compactMap { $0 }.joined(separator: "; ")
                results[i].ratio = nil
            }
        }
        if json { printJSON(results, n: n, reps: reps) } else { printTable(results, n: n, reps: reps) }
    }

    func printTable(_ results: [Result], n: Int, reps: Int) {
        print("blazebench: \(n) documents, \(reps) repeat(s)\(quick ? ", quick (smoke test, figures not meaningful)" : "")")
        let header = ["NAME", "MEDIAN", "P99", "UNIT", "RATIO", "TARGET", "NOTE"]
        let rows = results.map { r in
            [
                r.name, figure(r.median), r.samples.count > reps ? figure(r.p99) : "-", r.unit,
                r.ratio.map { String(format: "%.2f× %@", $0, r.baseline ?? "") } ?? "", r.target ?? "", r.note ?? "",
            ]
        }
        var widths = header.map(\.count)
        for row in rows { for (i, cell) in row.enumerated() { widths[i] = max(widths[i], cell.count) } }
        for row in [header] + rows {
            print(row.enumerated().map { i, c in c.padding(toLength: widths[i], withPad: " ", startingAt: 0) }
                .joined(separator: "  "))
        }
    }

    func printJSON(_ results: [Result], n: Int, reps: Int) {
        let items: [JSONValue] = results.map { r in
            var o: [String: JSONValue] = [
                "name": .string(r.name), "unit": .string(r.unit), "median": .double(r.median), "p99": .double(r.p99),
                "samples": .int(Int64(r.samples.count)), "better": .string(r.better),
            ]
            if let b = r.baseline { o["baseline"] = .string(b) }
            if let x = r.ratio { o["ratio"] = .double(x) }
            if let s = r.secondBaseline, let x = r.secondRatio {
                o["secondBaseline"] = .string(s)
                o["secondRatio"] = .double(x)
            }
            if let t = r.target { o["target"] = .string(t) }
            if let note = r.note { o["note"] = .string(note) }
            return .object(o)
        }
        let doc: JSONValue = ["documents": .int(Int64(n)), "repeats": .int(Int64(reps)), "quick": .bool(quick), "results": .array(items)]
        print(doc.jsonText)
    }
}

/// A figure for the table: three significant digits below 10, one decimal above.
func figure(_ value: Double) -> String {
    String(format: abs(value) < 10 ? "%.3g" : "%.1f", value)
}
