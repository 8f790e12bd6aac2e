#if canImport(Glibc)
import Glibc
#endif

/// Process-wide resource limits the daemon sets for itself at start.
public enum ProcessLimits {
    /// Raises the soft limit on open files to the hard limit; returns the limits in force afterwards.
    @discardableResult
    public static func raiseOpenFiles() -> (soft: UInt64, hard: UInt64) {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return (0, 0) }
        if limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = limit.rlim_max
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
        }
        return (UInt64(limit.rlim_cur), UInt64(limit.rlim_max))
    }
}
