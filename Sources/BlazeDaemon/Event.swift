import Synchronization

/// A one-shot event that any number of tasks can wait for.
final class Event: Sendable {
    private let state = Mutex<(fired: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    func fire() {
        let waiters = state.withLock { s in
            s.fired = true
            defer { s.waiters = [] }
            return s.waiters
        }
        for w in waiters { w.resume() }
    }

    func wait() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let fired = state.withLock { s in
                if s.fired { return true }
                s.waiters.append(c)
                return false
            }
            if fired { c.resume() }
        }
    }
}
