#if canImport(Glibc)
import Glibc
#endif

/// Re-checks `condition` every `interval` until it holds or `timeout` has passed; returns whether it held. The one
/// polling helper of the test suites: every wait on another process or thread is bounded by a deadline.
public func eventually(
    timeout: Duration = .seconds(30), interval: Duration = .milliseconds(20), _ condition: () throws -> Bool
) rethrows -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try condition() { return true }
        let micros = interval.components.seconds * 1_000_000 + interval.components.attoseconds / 1_000_000_000_000
        usleep(UInt32(max(1_000, micros)))
    }
    return try condition()
}

/// `eventually` for async tests: waits with `Task.sleep`, so the wait holds no thread of the cooperative pool — which
/// code under test in the same process (an in-process relay's storage tasks) may need to make `condition` true.
public func waitUntil(
    timeout: Duration = .seconds(30), interval: Duration = .milliseconds(20), _ condition: () throws -> Bool
) async rethrows -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try condition() { return true }
        try? await Task.sleep(for: interval)
    }
    return try condition()
}
