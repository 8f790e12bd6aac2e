import Synchronization

/// Counts the live connections for the connection limit, and stops admitting them once the daemon shuts down.
final class ConnectionTable: Sendable {
    /// What `admit` decided.
    enum Admission: Equatable {
        /// Admitted, with this connection id.
        case admitted(Int)
        /// Refused: `max` connections are already open.
        case full
        /// Refused: the daemon is shutting down.
        case closing
    }

    private let state = Mutex<(next: Int, open: Set<Int>, closing: Bool)>((1, [], false))
    /// Live subscriptions over all connections.
    let subscriptions = Atomic<Int>(0)

    /// Number of open connections.
    var count: Int { state.withLock { $0.open.count } }

    /// Admits one more connection unless `max` are open or the daemon is shutting down.
    func admit(max: Int) -> Admission {
        state.withLock { s in
            if s.closing { return .closing }
            guard s.open.count < max else { return .full }
            let id = s.next
            s.next += 1
            s.open.insert(id)
            return .admitted(id)
        }
    }

    /// Forgets a closed connection.
    func remove(_ id: Int) {
        _ = state.withLock { $0.open.remove(id) }
    }

    /// Whether connection `id` is open.
    func isOpen(_ id: Int) -> Bool {
        state.withLock { $0.open.contains(id) }
    }

    /// Refuses new connections from now on (those already open are quiesced by `ServerQuiescingHelper`).
    func beginShutdown() {
        state.withLock { $0.closing = true }
    }
}
