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
    try onThreads(threads, count: count, setup: setup, make: { $0 }, body)
}

/// What each of `onThreads`'s threads measured, or the error that stopped it.
private final class ThreadResults: @unchecked Sendable {
    // @unchecked: each thread writes only its own slot; read after all threads joined (group.wait).
    var latencies: [[Double]]
    var errors: [(any Error)?]
    init(_ n: Int) { latencies = Array(repeating: [], count: n); errors = Array(repeating: nil, count: n) }
}

/// `onThreads` with each operation's input (a request's bytes) made by `make` before the clock starts: each thread
/// connects (`setup`) and makes its inputs, then all start together, so only the operations are timed.
func onThreads<Input>(
    _ threads: Int, count: Int, setup: @escaping @Sendable (Int) throws -> Any, make: @escaping @Sendable (Int) -> Input,
    _ body: @escaping @Sendable (Any, Input) throws -> Void
) throws -> (latencies: [Double], wall: Double) {
    let box = ThreadResults(threads)
    let group = DispatchGroup()
    let ready = DispatchGroup()
    let go = DispatchSemaphore(value: 0)
    let perThread = count / threads
    for t in 0..<threads {
        group.enter()
        ready.enter()
        let thread = Thread {
            defer { group.leave() }
            var context: Any?
            var inputs: [Input] = []
            do {
                context = try setup(t)
                inputs = (0..<perThread).map { make(t * perThread + $0) }
            } catch {
                box.errors[t] = error
            }
            ready.leave()
            go.wait()
            guard let context else { return }
            do {
                var lat: [Double] = []
                lat.reserveCapacity(perThread)
                for input in inputs {
                    let s = DispatchTime.now().uptimeNanoseconds
                    try body(context, input)
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
    ready.wait()
    let start = DispatchTime.now().uptimeNanoseconds
    for _ in 0..<threads { go.signal() }
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

/// The document's canonical JSON text (keys sorted), with `_id` unless `id` is false.
func benchJSON(_ i: Int, id: Bool = true) -> String {
    let d = benchDocument(i)
    let members = ((id ? [("_id", "\"\(d.id)\"")] : []) + d.fields).sorted { $0.0.utf8.lexicographicallyPrecedes($1.0.utf8) }
    return "{" + members.map { "\"\($0.0)\":\($0.1)" }.joined(separator: ",") + "}"
}
