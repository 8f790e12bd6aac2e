import NIOCore
import Synchronization

/// The live connections, for the connection limit and for closing inputs at shutdown.
final class ConnectionTable: Sendable {
    private let state = Mutex<(next: Int, channels: [Int: any Channel], closing: Bool)>((1, [:], false))
    /// Live subscriptions over all connections.
    let subscriptions = Atomic<Int>(0)

    /// Number of open connections.
    var count: Int { state.withLock { $0.channels.count } }

    func add(_ channel: any Channel, max: Int) -> Int? {
        state.withLock { s in
            guard !s.closing, s.channels.count < max else { return nil }
            let id = s.next
            s.next += 1
            s.channels[id] = channel
            return id
        }
    }

    func remove(_ id: Int) {
        _ = state.withLock { $0.channels.removeValue(forKey: id) }
    }

    /// Refuses new connections from now on and returns the live ones.
    func beginShutdown() -> [any Channel] {
        state.withLock { s in
            s.closing = true
            return Array(s.channels.values)
        }
    }
}
