import BlazeBlob
import BlazeProtocol
import BlazeStore
import BlazeSync
import Logging
import NIOCore
import NIOPosix
import Synchronization

/// Fetching blobs before they are read (ARCHITECTURE.md, "Blobs", "Fetching eagerly"): the blobs pinned on this
/// device (`blob.pin`) and those the documents of a database's eager collections refer to (`blob.policy`), as the
/// documents arrive or change, in the background, one blob of a database at a time.
///
/// What to fetch is worked out again from the database at each start (and when a pin or the policy changes), so a
/// fetch cut by a restart or a kill goes on from the chunks already stored. A fetch that fails (no device holding
/// the blob is connected, a timeout, a full disk) is tried again after `firstRetry`, doubling to `lastRetry`.
final class BlobPrefetcher: Sendable {
    /// The first wait before failed fetches are tried again.
    static let firstRetry: TimeAmount = .seconds(5)
    /// The longest wait before failed fetches are tried again.
    static let lastRetry: TimeAmount = .seconds(300)

    private let blobs: Blobs
    private let sync: SyncEngine
    private let store: Store
    private let logger: Logger

    /// One database's fetching.
    private struct Queue {
        /// Blobs to fetch, in order, each once; `wanted` holds them and the one being fetched.
        var pending: [ChunkID] = []
        var wanted: Set<ChunkID> = []
        /// Pinned blobs: fetched whatever their size.
        var pinned: Set<ChunkID> = []
        var policy = BlobPolicy()
        var running = false
        /// The live feed listener while some collection is eager.
        var feedToken: Int?
        var feedOf: BlazeDatabase?
        /// Blobs whose fetch failed, waiting for the retry.
        var failed: Set<ChunkID> = []
        var retry: Scheduled<Void>?
        var backoff: TimeAmount = BlobPrefetcher.firstRetry
    }

    private struct State {
        var queues: [String: Queue] = [:]
        var stopped = false
    }

    private let state = Mutex(State())

    /// A prefetcher putting `blobs`' chunks of `store`'s databases, fetched through `sync`.
    init(blobs: Blobs, sync: SyncEngine, store: Store, logger: Logger) {
        self.blobs = blobs
        self.sync = sync
        self.store = store
        self.logger = logger
    }

    /// Looks at every database at start: those with pins or an eager policy start fetching what they lack.
    func start() {
        blobs.pool.submit { _ in
            for name in (try? self.store.list()) ?? [] {
                guard let db = try? self.store.database(name) else { continue }
                self.refresh(db: db)
            }
        }
    }

    /// Stops for good: nothing more is fetched or tried again, and feed listeners go.
    func shutdown() {
        let queues = state.withLock { s in
            s.stopped = true
            defer { s.queues = [:] }
            return s.queues
        }
        for queue in queues.values {
            queue.retry?.cancel()
            if let token = queue.feedToken { queue.feedOf?.feed.detach(token) }
        }
    }

    /// Reads `db`'s pins and policy again (on the calling thread, which may block) and queues every blob they want
    /// that this device does not hold whole; listens to its feed while some collection is eager.
    func refresh(db: BlazeDatabase) {
        guard let policy = try? db.blobPolicy(), let pins = try? db.pinnedBlobs() else { return }
        let references = policy.eager.isEmpty ? [] : ((try? db.documentBlobReferences()) ?? [])
        let eager = references.filter { policy.isEager($0.collection) && policy.admits(size: $0.reference.size) }.map(\.reference.id)
        let detach: (Int, BlazeDatabase)? = state.withLock { s in
            guard !s.stopped else { return nil }
            s.queues[db.name, default: Queue()].policy = policy
            s.queues[db.name]!.pinned = pins
            guard policy.eager.isEmpty, let token = s.queues[db.name]!.feedToken, let of = s.queues[db.name]!.feedOf else { return nil }
            s.queues[db.name]!.feedToken = nil
            return (token, of)
        }
        if let (token, of) = detach { of.feed.detach(token) }
        if !policy.eager.isEmpty { listen(db: db) }
        enqueue(db: db, ids: Array(pins).sorted { $0.hex < $1.hex } + eager)
    }

    /// Queues blobs `ids` of `db` (those held whole are skipped when their turn comes) and starts fetching.
    func enqueue(db: BlazeDatabase, ids: [ChunkID]) {
        guard !ids.isEmpty else { return }
        state.withLock { s in
            guard !s.stopped else { return }
            for id in ids where s.queues[db.name, default: Queue()].wanted.insert(id).inserted {
                s.queues[db.name]!.pending.append(id)
            }
        }
        next(db: db)
    }

    /// Listens to `db`'s feed: each document of an eager collection written or arriving has its blobs queued.
    private func listen(db: BlazeDatabase) {
        let attach = state.withLock { s in !s.stopped && s.queues[db.name]?.feedToken == nil }
        guard attach else { return }
        let pool = blobs.pool
        while true {
            switch db.feed.attach(after: db.feed.lastSequence, { [self] signal in
                // On the writer's thread: the documents are parsed on the pool.
                switch signal {
                case .entries(let entries):
                    let texts = entries.flatMap { $0.events.compactMap { e in e.afterText.map { (e.collection, $0) } } }
                        .filter { $0.1.contains("$blob") }
                    guard !texts.isEmpty else { return }
                    pool.submit { _ in self.arrived(db: db, documents: texts) }
                case .reset:
                    pool.submit { _ in self.refresh(db: db) }
                case .ended:
                    pool.submit { _ in self.forget(db: db) }
                }
            }) {
            case .attached(let token):
                let extra = state.withLock { s -> Bool in
                    guard !s.stopped, s.queues[db.name] != nil, s.queues[db.name]!.feedToken == nil else { return true }
                    s.queues[db.name]!.feedToken = token
                    s.queues[db.name]!.feedOf = db
                    return false
                }
                if extra { db.feed.detach(token) }
            case .behind: continue
            case .ended: break
            }
            return
        }
    }

    /// Documents `documents` (collection, text) committed: the blobs of the eager collections' ones are queued.
    private func arrived(db: BlazeDatabase, documents: [(String, String)]) {
        guard let policy = state.withLock({ $0.queues[db.name]?.policy }) else { return }
        var ids: [ChunkID] = []
        for (collection, text) in documents where policy.isEager(collection) {
            ids += BlobReference.all(inDocument: text).filter { policy.admits(size: $0.size) }.map(\.id)
        }
        enqueue(db: db, ids: ids)
    }

    /// `db` was dropped or closed: its queue goes.
    private func forget(db: BlazeDatabase) {
        let queue = state.withLock { s -> Queue? in
            guard s.queues[db.name]?.feedOf === db || s.queues[db.name]?.feedOf == nil else { return nil }
            return s.queues.removeValue(forKey: db.name)
        }
        queue?.retry?.cancel()
    }

    /// Starts fetching `db`'s next queued blob unless one is being fetched.
    private func next(db: BlazeDatabase) {
        let taken: (ChunkID, Bool, BlobPolicy)? = state.withLock { s in
            guard !s.stopped, var queue = s.queues[db.name], !queue.running, !queue.pending.isEmpty else { return nil }
            let id = queue.pending.removeFirst()
            queue.running = true
            s.queues[db.name] = queue
            return (id, queue.pinned.contains(id), queue.policy)
        }
        guard let (id, pinned, policy) = taken else { return }
        // Everything of a pinned blob; of an eager one, nothing when its manifest says it is over the policy's size.
        blobs.whenHeld(
            db: db, blob: id.hex, sync: sync, inline: false,
            needed: { manifest in pinned || policy.admits(size: manifest.size) ? manifest.pieces.map(\.id) : [] },
            { _, _, _ in }
        ) { [self] result in
            if case .failure(let error) = result {
                logger.debug("A blob fetched eagerly is not here yet", metadata: ["db": "\(db.name)", "blob": "\(id)", "error": "\(error)"])
            }
            // A blob over the daemon's limit is not tried again: its manifest will not change.
            guard case .failure(let error) = result, Blobs.storeError(error).kind != "blob_too_large" else {
                return finished(db: db, id: id, failed: false)
            }
            finished(db: db, id: id, failed: true)
        }
    }

    /// The fetch of `id` ended: a failed one waits for the retry; the next blob starts.
    private func finished(db: BlazeDatabase, id: ChunkID, failed: Bool) {
        let schedule: TimeAmount? = state.withLock { s in
            guard !s.stopped, var queue = s.queues[db.name] else { return nil }
            queue.running = false
            var pause: TimeAmount?
            if failed {
                queue.failed.insert(id)
                if queue.retry == nil { pause = queue.backoff }
            } else {
                queue.wanted.remove(id)
                if queue.failed.isEmpty { queue.backoff = Self.firstRetry }
            }
            s.queues[db.name] = queue
            return pause
        }
        if let schedule { scheduleRetry(db: db, after: schedule) }
        next(db: db)
    }

    /// Queues `db`'s failed fetches again after `pause`, doubling the next wait.
    private func scheduleRetry(db: BlazeDatabase, after pause: TimeAmount) {
        let task = MultiThreadedEventLoopGroup.singleton.next().scheduleTask(in: pause) { [self] in
            let again: [ChunkID] = self.state.withLock { s in
                guard !s.stopped, var queue = s.queues[db.name] else { return [] }
                queue.retry = nil
                queue.backoff = min(Self.lastRetry, queue.backoff + queue.backoff)
                let again = queue.failed.sorted { $0.hex < $1.hex }
                queue.failed = []
                for id in again where !queue.pending.contains(id) { queue.pending.append(id) }
                s.queues[db.name] = queue
                return again
            }
            if !again.isEmpty { self.next(db: db) }
        }
        let keep = state.withLock { s -> Bool in
            guard !s.stopped, s.queues[db.name] != nil, s.queues[db.name]!.retry == nil else { return false }
            s.queues[db.name]!.retry = task
            return true
        }
        if !keep { task.cancel() }
    }

    /// Blobs of `db` queued or being fetched now (`db.info`, tests).
    func queued(db: String) -> Int { state.withLock { $0.queues[db]?.wanted.count ?? 0 } }
}
