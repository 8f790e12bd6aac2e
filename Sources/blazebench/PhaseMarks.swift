import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// With `BLAZEBENCH_MARKS` set, timed phases print `MARK <phase> start|end <CLOCK_MONOTONIC seconds>` to stderr, so a
/// profile recorded with `perf record --clockid monotonic` can be cut to one phase (`perf report --time START,END`;
/// Benchmarks/README.md, "Profiling a phase").
enum PhaseMarks {
    /// True when `BLAZEBENCH_MARKS` is set.
    static let enabled = ProcessInfo.processInfo.environment["BLAZEBENCH_MARKS"] != nil

    /// Prints `what` with the monotonic clock's reading, when enabled.
    static func mark(_ what: String) {
        guard enabled else { return }
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        FileHandle.standardError.write(Data("MARK \(what) \(ts.tv_sec).\(String(format: "%09d", ts.tv_nsec))\n".utf8))
    }
}
