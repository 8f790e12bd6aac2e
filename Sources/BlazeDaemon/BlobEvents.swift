import BlazeBlob
import BlazeProtocol
import Synchronization

/// Where blob fetch progress goes (ARCHITECTURE.md, "Blobs", "Fetching eagerly"): the subscriptions that asked for it
/// (`subscribe` with `blobs: true`), by database. Events are not part of the feed: a listener gets those posted while
/// it listens, on the poster's thread (it hands them to its event loop).
final class BlobEvents: Sendable {
    /// A listener of one database's events.
    typealias Sink = @Sendable (RPCSchema.BlobProgress) -> Void

    private let sinks = Mutex<[String: [Int: Sink]]>([:])
    private let next = Atomic<Int>(1)

    /// Starts passing `db`'s events to `sink`; returns the token `stop` takes.
    func listen(db: String, _ sink: @escaping Sink) -> Int {
        let token = next.add(1, ordering: .relaxed).oldValue
        sinks.withLock { $0[db, default: [:]][token] = sink }
        return token
    }

    /// Stops the listener `token` of `db`.
    func stop(_ token: Int, db: String) {
        sinks.withLock { s in
            s[db]?[token] = nil
            if s[db]?.isEmpty == true { s[db] = nil }
        }
    }

    /// Whether anyone listens to `db`'s events (the progress is only worked out when someone does).
    func listening(db: String) -> Bool { sinks.withLock { $0[db] != nil } }

    /// Passes `event` to every listener of `db`.
    func post(db: String, _ event: RPCSchema.BlobProgress) {
        for sink in sinks.withLock({ Array(($0[db] ?? [:]).values) }) { sink(event) }
    }

    /// Posts blob `id`'s progress (`manifest` against what `store` holds) in `state` to `db`'s listeners, if any.
    func post(
        db: String, id: ChunkID, manifest: BlobManifest, store: ChunkStore, state: RPCSchema.BlobProgress.State,
        error: (any Error)? = nil
    ) {
        guard listening(db: db) else { return }
        var held = 0
        var heldBytes = 0
        for piece in manifest.pieces where store.contains(piece.id) {
            held += 1
            heldBytes += piece.length
        }
        let failure = error.map { error -> RPCSchema.BlobProgress.Error in
            let storeError = Blobs.storeError(error)
            return .init(kind: storeError.kind, message: storeError.message)
        }
        post(db: db, RPCSchema.BlobProgress(
            blob: id.hex, state: state, size: manifest.size, chunks: manifest.pieces.count, heldChunks: held,
            heldBytes: heldBytes, error: failure))
    }
}
