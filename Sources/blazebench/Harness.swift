import Foundation

/// One measured figure: its repeats' values, and optionally the baseline it is compared with.
struct Result {
    let name: String
    let unit: String
    /// Per-repeat values (throughputs), or per-operation latencies.
    let samples: [Double]
    /// "higher" when more is better (throughput), "lower" for latencies.
    let better: String
    var baseline: String?
    var ratio: Double?
    /// A second baseline to compare with (its ratio goes into the note and the JSON output).
    var secondBaseline: String?
    var secondRatio: Double?
    var target: String?
    var note: String?
    /// Per-repeat ratios to a baseline sampled just before each repeat, by baseline name: on a shared machine these
    /// pairs see the same conditions, and their median is the ratio reported instead of median over median.
    var paired: [String: [Double]] = [:]
    /// For a latency compared with a latency: report the ratio of the medians rather than their difference.
    var latencyRatio = false

    var median: Double { percentile(0.5) }
    var p99: Double { percentile(0.99) }

    func percentile(_ q: Double) -> Double {
        guard !samples.isEmpty else { return .nan }
        let sorted = samples.sorted()
        let index = min(sorted.count - 1, Int((Double(sorted.count - 1) * q).rounded()))
        return sorted[index]
    }
}

/// Wall-clock seconds of `body`.
func seconds(_ body: () throws -> Void) rethrows -> Double {
    let start = DispatchTime.now().uptimeNanoseconds
    try body()
    return Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
}

/// Async variant of `seconds`.
func seconds(_ body: () async throws -> Void) async rethrows -> Double {
    let start = DispatchTime.now().uptimeNanoseconds
    try await body()
    return Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
}

/// Runs `count` operations of `body` on `threads` OS threads (never on the Swift concurrency pool, since the
/// clients block), returning per-operation latencies in microseconds and the total wall time.
func onThreads(_ threads: Int, count: Int, setup: @escaping @Sendable (Int) throws -> Any, _ body: @escaping @Sendable (Any, Int) throws -> Void)
    throws -> (latencies: [Double], wall: Double)
{
    final class Box: @unchecked Sendable {
        // @unchecked: each thread writes only its own slot; read after all threads joined (group.wait).
        var latencies: [[Double]]
        var errors: [(any Error)?]
        init(_ n: Int) { latencies = Array(repeating: [], count: n); errors = Array(repeating: nil, count: n) }
    }
    let box = Box(threads)
    let group = DispatchGroup()
    let perThread = count / threads
    let start = DispatchTime.now().uptimeNanoseconds
    for t in 0..<threads {
        group.enter()
        let thread = Thread {
            defer { group.leave() }
            do {
                let context = try setup(t)
                var lat: [Double] = []
                lat.reserveCapacity(perThread)
                for i in 0..<perThread {
                    let s = DispatchTime.now().uptimeNanoseconds
                    try body(context, t * perThread + i)
                    lat.append(Double(DispatchTime.now().uptimeNanoseconds - s) / 1000)
                }
                box.latencies[t] = lat
            } catch {
                box.errors[t] = error
            }
        }
        thread.stackSize = 1 << 20
        thread.start()
    }
    group.wait()
    let wall = Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
    if let error = box.errors.compactMap({ $0 }).first { throw error }
    return (box.latencies.flatMap { $0 }, wall)
}

/// A benchmark document of about 250 bytes with 6 fields, 2 of which get indexed (`email`, `age`).
func benchDocument(_ i: Int) -> (id: String, fields: [(String, String)]) {
    (
        String(format: "doc-%08d", i),
        [
            ("name", "\"user number \(i) with a longer display name\""), ("email", "\"user\(i)@example.com\""),
            ("age", "\(i % 90)"), ("score", "\(Double(i) * 1.25)"), ("tags", "[\"alpha\",\"beta\",\"t\(i % 17)\"]"),
            ("bio", "\"" + String(repeating: "x", count: 70) + "\""),
        ]
    )
}

/// The document's canonical JSON text (keys sorted), `_id` included.
func benchJSON(_ i: Int) -> String {
    let d = benchDocument(i)
    let members = ([("_id", "\"\(d.id)\"")] + d.fields).sorted { $0.0.utf8.lexicographicallyPrecedes($1.0.utf8) }
    return "{" + members.map { "\"\($0.0)\":\($0.1)" }.joined(separator: ",") + "}"
}
