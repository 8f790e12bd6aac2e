import BlazeProtocol
import BlazeStore
import BlazeSync
import Logging

/// Facts a handler may use.
struct RequestContext: Sendable {
    let store: Store
    let config: DaemonConfig
    let logger: Logger
    let startedAt: ContinuousClock.Instant
    /// The daemon's open connections.
    let connections: ConnectionTable
    /// Sync: sharing, peers, status.
    let sync: SyncEngine
    /// The connection the request came on (set per call).
    var connection: ConnectionHandle?

    /// The open database named `name`, or `not_found`.
    func database(_ name: String) throws -> BlazeDatabase {
        try store.database(name)
    }
}
