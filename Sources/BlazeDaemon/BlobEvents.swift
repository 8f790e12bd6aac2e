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

    /// A fetch's progress for `db`'s listeners, when there are any when it starts (nil: nobody listens, nothing is
    /// worked out or posted for it).
    func progress(db: String, id: ChunkID, manifest: BlobManifest, store: ChunkStore, missing: [ChunkID]) -> FetchProgress? {
        guard listening(db: db) else { return nil }
        return FetchProgress(events: self, db: db, id: id, manifest: manifest, store: store, missing: missing)
    }

    /// Tells `db`'s listeners that blob `id`'s manifest could not be had (nothing of it is known: sizes 0).
    func manifestFailed(db: String, id: ChunkID, error: any Error) {
        guard listening(db: db) else { return }
        post(db: db, RPCSchema.BlobProgress(
            blob: id.hex, state: .failed, size: 0, chunks: 0, heldChunks: 0, heldBytes: 0, error: Self.failure(error)))
    }

    /// `error` as a progress event tells it.
    static func failure(_ error: any Error) -> RPCSchema.BlobProgress.Error {
        let storeError = Blobs.storeError(error)
        return .init(kind: storeError.kind, message: storeError.message)
    }
}

/// How much of one blob is held as a fetch goes, for progress events: worked out once when the fetch starts (one look
/// at each chunk the fetch does not bring), then moved along as each window of the chunks it fetches arrives, never
/// by looking at every chunk again.
final class FetchProgress: Sendable {
    private let events: BlobEvents
    private let db: String
    private let id: ChunkID
    private let size: Int
    private let chunks: Int
    /// Of the chunks being fetched: how many pieces of the manifest each is, and their bytes.
    private let pieces: [ChunkID: (count: Int, bytes: Int)]
    private let held: Mutex<(chunks: Int, bytes: Int)>

    init(events: BlobEvents, db: String, id: ChunkID, manifest: BlobManifest, store: ChunkStore, missing: [ChunkID]) {
        (self.events, self.db, self.id, self.size, self.chunks) = (events, db, id, manifest.size, manifest.pieces.count)
        let fetched = Set(missing)
        var pieces: [ChunkID: (count: Int, bytes: Int)] = [:]
        var held = (chunks: 0, bytes: 0)
        for piece in manifest.pieces {
            if fetched.contains(piece.id) {
                pieces[piece.id, default: (0, 0)].count += 1
                pieces[piece.id]!.bytes += piece.length
            } else if store.contains(piece.id) {
                held = (held.chunks + 1, held.bytes + piece.length)
            }
        }
        self.pieces = pieces
        self.held = Mutex(held)
    }

    /// Chunks `window` arrived: posts `fetching` (unless `last`) with the counts moved along.
    func arrived(_ window: [ChunkID], last: Bool) {
        let now = held.withLock { h in
            for id in window { if let p = pieces[id] { h = (h.chunks + p.count, h.bytes + p.bytes) } }
            return h
        }
        if !last { post(.fetching, now) }
    }

    /// The fetch ended: `held` when every chunk of the blob is here, else `partial`; or `failed` with `error`.
    func ended(_ error: (any Error)? = nil) {
        let now = held.withLock { $0 }
        if let error {
            post(.failed, now, error: BlobEvents.failure(error))
        } else {
            post(now.chunks == chunks ? .held : .partial, now)
        }
    }

    private func post(_ state: RPCSchema.BlobProgress.State, _ now: (chunks: Int, bytes: Int), error: RPCSchema.BlobProgress.Error? = nil) {
        events.post(db: db, RPCSchema.BlobProgress(
            blob: id.hex, state: state, size: size, chunks: chunks, heldChunks: now.chunks, heldBytes: now.bytes, error: error))
    }
}
