import BlazeProtocol
import Foundation
import Logging
import NIOCore
import PostgresNIO
import Synchronization

/// How relay processes sharing PostgreSQL learn what the others changed: `LISTEN` on one dedicated connection.
extension PostgresRelayStore {
    // MARK: Notifications

    public func watch(_ onChange: @escaping @Sendable (RelayChange) -> Void) async {
        var listenedBefore = false
        while !Task.isCancelled && !closed.load(ordering: .relaxed) {
            let listening = ListenState()
            // What others wrote while this process was not listening is caught up on.
            let resync = listenedBefore
            let attempt = Task(executorPreference: executor) { [client, logger] in
                defer { listening.end() }
                do {
                    try await client.withConnection { conn in
                        try await conn.listen(on: Self.channel) { notifications in
                            listening.begin()
                            if resync { onChange(.resync) }
                            for try await n in notifications {
                                if let change = self.change(from: n.payload) { onChange(change) }
                            }
                        }
                    }
                } catch {
                    if !Task.isCancelled && !listening.stopped && !self.closed.load(ordering: .relaxed) {
                        logger.warning("Relay lost its PostgreSQL notifications; reconnecting", metadata: ["error": "\(error)"])
                    }
                }
            }
            // A lease or LISTEN asked for while the server went away may never answer: one that has not begun within
            // `operationTimeout` is abandoned and asked for again.
            let deadline = ContinuousClock.now + operationTimeout
            while listening.waiting, ContinuousClock.now < deadline, !Task.isCancelled {
                try? await Task.sleep(for: .milliseconds(50))
            }
            if listening.began { listenedBefore = true }
            if listening.waiting && !Task.isCancelled && !closed.load(ordering: .relaxed) {
                logger.warning("Relay's PostgreSQL notifications did not start in time; asking again")
                attempt.cancel()
            } else {
                await withTaskCancellationHandler { await attempt.value } onCancel: {
                    listening.stop()
                    attempt.cancel()
                }
            }
            if Task.isCancelled {
                listening.stop()
                attempt.cancel()
                return
            }
            // Not a tight loop while the server is down.
            try? await Task.sleep(for: .milliseconds(500))
        }
    }

    /// The change a notification of another process announces; nil for this process's own or a malformed one.
    private func change(from payload: String) -> RelayChange? {
        let parts = payload.split(separator: " ")
        guard parts.count == 3, parts[0] != instance, let space = SpaceID(hex: String(parts[2])) else { return nil }
        switch parts[1] {
        case "e": return .entries(space: space)
        case "o": return .ops(space: space)
        case "a": return .acks(space: space)
        case "f": return .formats(space: space)
        case "s": return .spaces
        case "x": return .expired(space: space)
        case "j": return .joins(space: space)
        default: return nil
        }
    }
}

/// Where one attempt of `PostgresRelayStore.watch` to listen is: waiting for its connection, listening, or ended.
private final class ListenState: Sendable {
    private let state = Mutex<(began: Bool, ended: Bool)>((false, false))
    private let stopping = Atomic<Bool>(false)
    /// The watch is being stopped: the attempt's connection failing now is that, not a lost connection.
    func stop() { stopping.store(true, ordering: .sequentiallyConsistent) }
    /// Whether `stop()` was called.
    var stopped: Bool { stopping.load(ordering: .sequentiallyConsistent) }
    /// The LISTEN is in place.
    func begin() { state.withLock { $0.began = true } }
    /// The attempt ended (its connection failed or the task was cancelled).
    func end() { state.withLock { $0.ended = true } }
    /// Neither listening yet nor ended.
    var waiting: Bool { state.withLock { !$0.began && !$0.ended } }
    /// The LISTEN was in place at some point.
    var began: Bool { state.withLock { $0.began } }
}
