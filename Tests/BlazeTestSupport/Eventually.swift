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

/// `eventually` for a state a loaded machine may take long to reach (several devices converging while every core is
/// busy): `probe` returns what it observed and whether that is the awaited state; the wait gives up once what it
/// observes has not changed for `quiet` (stuck, not slow), or after `limit` in all.
public func eventually<State: Equatable>(
    quiet: Duration, limit: Duration, interval: Duration = .milliseconds(50), _ probe: () throws -> (State, holds: Bool)
) rethrows -> Bool {
    let start = ContinuousClock.now
    var (last, holds) = try probe()
    var changed = start
    while !holds {
        let now = ContinuousClock.now
        if now - changed >= quiet || now - start >= limit { return false }
        let micros = interval.components.seconds * 1_000_000 + interval.components.attoseconds / 1_000_000_000_000
        usleep(UInt32(max(1_000, micros)))
        let (state, done) = try probe()
        if state != last { (last, changed) = (state, ContinuousClock.now) }
        holds = done
    }
    return true
}
