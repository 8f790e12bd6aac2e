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
    /// Blobs: each database's chunks and the uploads in progress.
    let blobs: Blobs
    /// Fetches pinned blobs and those of eager collections before they are read (nil in a test without a daemon).
    var prefetcher: BlobPrefetcher?
    /// What the daemon counts for Prometheus (nil in a test without a daemon).
    var metrics: DaemonMetrics?
    /// The connection the request came on (set per call).
    var connection: ConnectionHandle?
    /// How much a budgeted read may do (`MethodHandler.budgeted`): `.inline` on an event loop.
    var readBudget: ReadBudget = .unbounded
    /// True when a deferred method runs inside a batch, on a pool thread that waits for its reply: it must do its work
    /// on that thread (handing it to the pool could leave every pool thread waiting for work none of them runs).
    var answersInline = false

    /// The id of the connection the request came on (0 outside one: a test calling a handler directly).
    var connectionID: Int { connection?.id ?? 0 }

    /// The open database named `name`, or `not_found`.
    func database(_ name: String) throws -> BlazeDatabase {
        try store.database(name)
    }

    /// The open database named `name` for a local write, or `read_only` when its space's members would refuse what
    /// this device writes (a reader, a removed member, a device still joining).
    func writableDatabase(_ name: String) throws -> BlazeDatabase {
        let db = try store.database(name)
        if let refusal = sync.writeRefusal(db: db.name) {
            throw RPCError(code: RPCErrorCode.syncError, kind: "read_only", message: refusal)
        }
        return db
    }
}
