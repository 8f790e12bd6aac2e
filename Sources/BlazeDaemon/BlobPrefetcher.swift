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
/// documents arrive or change, in the background, pinned ones first, `fetchesAtOnce` blobs of a database at a time.
///
/// What to fetch is worked out again from the database at each start and whenever a pin or the policy changes (one
/// refresh of a database at a time; what is no longer wanted leaves the queue), so a fetch cut by a restart or a kill
/// goes on from the chunks already stored. Documents come from other devices and may hold any number of references:
/// at most `maxQueued` blobs wait per database and `maxInbox` documents wait to be read; past either, the database
/// is read again once its queue is empty. A blob whose fetch fails (no device holding it is connected, a timeout, a
/// full disk) is tried again after `firstRetry`, doubling for that blob to `lastRetry`, and left until the next
/// refresh after `maxAttempts` failures in a row; one over `max-blob-bytes` is not tried again.
final class BlobPrefetcher: Sendable {
    /// The first and the longest wait before a failed blob is tried again.
    static let firstRetry: TimeAmount = .seconds(5), lastRetry: TimeAmount = .seconds(300)
    /// Failures in a row after which a blob waits for the next refresh.
    static let maxAttempts = 8
    /// Blobs of one database fetched at once.
    static let fetchesAtOnce = 2
    /// Blobs waiting per database, and documents waiting to be read for references.
    static let maxQueued = 10_000, maxInbox = 1_000

    private let blobs: Blobs
    private let sync: SyncEngine
    private let store: Store
    private let logger: Logger

    /// One database's fetching, for one handle of it (a database dropped and created again gets a new queue).
    private struct Queue {
        let db: BlazeDatabase
        var policy = BlobPolicy()
        var pins: Set<ChunkID> = []
        /// Waiting to be fetched, pinned ones first; `queued` holds both lists' ids.
        var pinned = FIFO(), eager = FIFO()
        var queued: Set<ChunkID> = []
        var running: Set<ChunkID> = []
        /// Failures in a row, and when each failed blob is tried again.
        var failures: [ChunkID: Int] = [:]
        var retryAt: [ChunkID: NIODeadline] = [:]
        var retry: Scheduled<Void>?
        var retryDeadline: NIODeadline?
        var feedToken: Int?
        /// Documents (collection, text) waiting to be read for references, and whether a task reads them.
        var inbox: [(String, String)] = []
        var reading = false
        /// Something was left out (a full queue or inbox): the database is read again once the queue is empty.
        var overflowed = false
        var refreshing = false, refreshAgain = false, resetAgain = false

        init(db: BlazeDatabase) { self.db = db }
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
                if let db = try? self.store.database(name) { self.refresh(db: db) }
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
        for queue in queues.values { Self.tearDown(queue) }
    }

    /// Reads `db`'s pins and policy again and queues what they want that is not held whole (on the calling thread,
    /// which may block); what they no longer want leaves the queue, and failed blobs they want are tried now. Calls
    /// for one database run one at a time: one made meanwhile runs again after.
    func refresh(db: BlazeDatabase) { refresh(db: db, reset: true) }

    /// `refresh`; without `reset` (a re-read after an overflow) blobs that failed keep their wait and attempts.
    private func refresh(db: BlazeDatabase, reset: Bool) {
        let (first, old) = state.withLock { s -> (Bool, Queue?) in
            guard !s.stopped else { return (false, nil) }
            if let queue = s.queues[db.name], queue.db === db {
                s.queues[db.name]!.refreshAgain = true
                if reset { s.queues[db.name]!.resetAgain = true }
                guard !queue.refreshing else { return (false, nil) }
                s.queues[db.name]!.refreshing = true
                return (true, nil)
            }
            // A queue of an older handle (the database was dropped and created again) goes.
            let old = s.queues.removeValue(forKey: db.name)
            var queue = Queue(db: db)
            (queue.refreshing, queue.refreshAgain, queue.resetAgain) = (true, true, reset)
            s.queues[db.name] = queue
            return (true, old)
        }
        // Outside the lock: the feed calls listeners (which take it) under its own.
        if let old { Self.tearDown(old) }
        guard first else { return }
        while let reset = state.withLock({ s -> Bool? in
            guard s.queues[db.name]?.db === db, s.queues[db.name]!.refreshAgain else {
                if s.queues[db.name]?.db === db { s.queues[db.name]!.refreshing = false }
                return nil
            }
            defer { (s.queues[db.name]!.refreshAgain, s.queues[db.name]!.resetAgain) = (false, false) }
            return s.queues[db.name]!.resetAgain
        }) {
            reread(db: db, reset: reset)
        }
        pump(db: db)
    }

    /// One refresh of `db` (see `refresh`).
    private func reread(db: BlazeDatabase, reset: Bool) {
        guard store.isCurrent(db), let policy = try? db.blobPolicy(), let pins = try? db.pinnedBlobs() else { return forget(db) }
        // Nothing wanted: no queue is kept for the database (unless a refresh asked for meanwhile may want one).
        guard !policy.eager.isEmpty || !pins.isEmpty else { return forget(db, unlessRefreshed: true) }
        // Listening first: a document committed while the snapshot is read is seen by one or the other.
        if policy.eager.isEmpty { stopListening(db) } else { listen(db) }
        var eager: [ChunkID] = []
        if !policy.eager.isEmpty {
            for (collection, reference) in (try? db.documentBlobReferences()) ?? []
            where policy.isEager(collection) && policy.admits(size: reference.size) {
                eager.append(reference.id)
            }
        }
        let wanted = pins.union(eager)
        // Only what is not held whole waits: a database of many blobs, most of them here, queues the few it lacks.
        let reader = (try? blobs.store(for: db)).map { BlobReader(store: $0, maxSize: .max) }
        let lacking = wanted.filter { id in
            guard let reader, let manifest = try? reader.manifest(id) else { return true }
            return !manifest.pieces.allSatisfy { reader.store.contains($0.id) }
        }
        state.withLock { s in
            guard var queue = s.queues[db.name], queue.db === db else { return }
            queue.policy = policy
            queue.pins = pins
            // What is no longer wanted leaves; what moved between pinned and eager moves lists.
            let waiting = queue.pinned.all + queue.eager.all
            queue.pinned = FIFO()
            queue.eager = FIFO()
            queue.queued = []
            for id in waiting where lacking.contains(id) { Self.add(id, to: &queue) }
            if reset {
                // Failed blobs still wanted are tried now; the others are forgotten.
                queue.failures = [:]
                queue.retryAt = [:]
                queue.retry?.cancel()
                (queue.retry, queue.retryDeadline) = (nil, nil)
            }
            queue.overflowed = false
            for id in pins.sorted(by: { $0.hex < $1.hex }) + eager where lacking.contains(id) { Self.add(id, to: &queue) }
            s.queues[db.name] = queue
        }
    }

    /// Queues `id` unless it is queued, being fetched or waiting for a retry, or the queue is full.
    private static func add(_ id: ChunkID, to queue: inout Queue) {
        guard !queue.queued.contains(id), !queue.running.contains(id), queue.retryAt[id] == nil,
            queue.failures[id, default: 0] < maxAttempts
        else { return }
        guard queue.queued.count < maxQueued else {
            queue.overflowed = true
            return
        }
        queue.queued.insert(id)
        if queue.pins.contains(id) { queue.pinned.push(id) } else { queue.eager.push(id) }
    }

    /// Listens to `db`'s feed: the documents of eager collections written or arriving wait in its inbox, read on
    /// the I/O pool by one task at a time.
    private func listen(_ db: BlazeDatabase) {
        guard state.withLock({ $0.queues[db.name]?.db === db && $0.queues[db.name]!.feedToken == nil }) else { return }
        while true {
            switch db.feed.attach(after: db.feed.lastSequence, { [self] signal in
                switch signal {
                case .entries(let entries): arrived(db, entries)
                case .reset: blobs.pool.submit { _ in self.refresh(db: db) }
                case .ended: blobs.pool.submit { _ in self.forget(db) }
                }
            }) {
            case .attached(let token):
                let kept = state.withLock { s -> Bool in
                    guard !s.stopped, s.queues[db.name]?.db === db, s.queues[db.name]!.feedToken == nil else { return false }
                    s.queues[db.name]!.feedToken = token
                    return true
                }
                if !kept { db.feed.detach(token) }
            case .behind: continue
            case .ended: break
            }
            return
        }
    }

    /// On the writer's thread: keeps the documents of eager collections that mention a blob, for the pool to read.
    private func arrived(_ db: BlazeDatabase, _ entries: [FeedEntry]) {
        guard let policy = state.withLock({ s in s.queues[db.name].flatMap { $0.db === db ? $0.policy : nil } }),
            !policy.eager.isEmpty
        else { return }
        var documents: [(String, String)] = []
        for entry in entries {
            for e in entry.events where policy.isEager(e.collection) {
                if let text = e.afterText, text.contains("$blob") { documents.append((e.collection, text)) }
            }
        }
        guard !documents.isEmpty else { return }
        let start = state.withLock { s -> Bool in
            guard var queue = s.queues[db.name], queue.db === db else { return false }
            let room = max(0, Self.maxInbox - queue.inbox.count)
            if documents.count > room { queue.overflowed = true }
            queue.inbox += documents.prefix(room)
            let start = !queue.reading && !queue.inbox.isEmpty
            if start { queue.reading = true }
            s.queues[db.name] = queue
            return start
        }
        if start { blobs.pool.submit { _ in self.read(db) } }
    }

    /// Reads the documents waiting in `db`'s inbox for references and queues their blobs.
    private func read(_ db: BlazeDatabase) {
        while true {
            guard let (documents, policy) = state.withLock({ s -> ([(String, String)], BlobPolicy)? in
                guard var queue = s.queues[db.name], queue.db === db else { return nil }
                let documents = queue.inbox
                queue.inbox = []
                if documents.isEmpty { queue.reading = false }
                s.queues[db.name] = queue
                return documents.isEmpty ? nil : (documents, queue.policy)
            }) else { break }
            var ids: [ChunkID] = []
            for (collection, text) in documents where policy.isEager(collection) {
                ids += BlobReference.all(inDocument: text).filter { policy.admits(size: $0.size) }.map(\.id)
            }
            state.withLock { s in
                guard var queue = s.queues[db.name], queue.db === db else { return }
                for id in ids { Self.add(id, to: &queue) }
                s.queues[db.name] = queue
            }
        }
        pump(db: db)
    }

    /// Starts fetching `db`'s next queued blobs, pinned first, while fewer than `fetchesAtOnce` are being fetched; once
    /// nothing is left and something was left out, reads the database again.
    private func pump(db: BlazeDatabase) {
        guard store.isCurrent(db) else { return forget(db) }
        var again = false
        let started: [(ChunkID, Bool, BlobPolicy)] = state.withLock { s in
            guard !s.stopped, var queue = s.queues[db.name], queue.db === db else { return [] }
            var started: [(ChunkID, Bool, BlobPolicy)] = []
            while queue.running.count < Self.fetchesAtOnce, let id = queue.pinned.pop() ?? queue.eager.pop() {
                queue.queued.remove(id)
                queue.running.insert(id)
                started.append((id, queue.pins.contains(id), queue.policy))
            }
            if queue.running.isEmpty, queue.queued.isEmpty, queue.overflowed, !queue.refreshing {
                queue.overflowed = false
                again = true
            }
            s.queues[db.name] = queue
            return started
        }
        for (id, pinned, policy) in started { fetch(id, of: db, pinned: pinned, policy: policy) }
        if again { blobs.pool.submit { _ in self.refresh(db: db, reset: false) } }
    }

    /// Fetches blob `id` of `db` whole (the same path as a read); an eager one whose manifest is over the policy's
    /// size stops at the manifest.
    private func fetch(_ id: ChunkID, of db: BlazeDatabase, pinned: Bool, policy: BlobPolicy) {
        blobs.whenHeld(
            db: db, blob: id.hex, sync: sync, inline: false,
            needed: { manifest in pinned || policy.admits(size: manifest.size) ? manifest.pieces.map(\.id) : [] },
            { _, _, _ in }
        ) { [self] result in
            guard case .failure(let error) = result else { return finished(id, of: db, failed: false) }
            let kind = Blobs.storeError(error).kind
            logger.debug("A blob fetched ahead of reads is not here yet", metadata: ["db": "\(db.name)", "blob": "\(id)", "error": "\(kind)"])
            // A blob over the daemon's limit is not tried again: its manifest will not change.
            finished(id, of: db, failed: kind != "blob_too_large")
        }
    }

    /// The fetch of `id` ended: a failed one waits for its retry (or the next refresh); the next blobs start.
    private func finished(_ id: ChunkID, of db: BlazeDatabase, failed: Bool) {
        state.withLock { s in
            guard !s.stopped, var queue = s.queues[db.name], queue.db === db else { return }
            queue.running.remove(id)
            guard failed else {
                queue.failures[id] = nil
                s.queues[db.name] = queue
                return
            }
            let failures = (queue.failures[id] ?? 0) + 1
            queue.failures[id] = failures
            if failures < Self.maxAttempts {
                let pause = TimeAmount.nanoseconds(
                    min(Self.lastRetry.nanoseconds, Self.firstRetry.nanoseconds << Int64(min(failures - 1, 16))))
                queue.retryAt[id] = NIODeadline.now() + pause
                scheduleRetry(&queue)
            }
            s.queues[db.name] = queue
        }
        pump(db: db)
    }

    /// Makes sure `queue`'s retry task runs at its soonest retry (under the lock: the task takes it before it looks).
    private func scheduleRetry(_ queue: inout Queue) {
        guard let soonest = queue.retryAt.values.min() else { return }
        if let deadline = queue.retryDeadline, queue.retry != nil, deadline <= soonest { return }
        queue.retry?.cancel()
        let db = queue.db
        queue.retryDeadline = soonest
        queue.retry = MultiThreadedEventLoopGroup.singleton.next().scheduleTask(deadline: soonest) { [self] in
            state.withLock { s in
                guard !s.stopped, var queue = s.queues[db.name], queue.db === db, queue.retryDeadline == soonest else { return }
                (queue.retry, queue.retryDeadline) = (nil, nil)
                let now = NIODeadline.now()
                for (id, due) in queue.retryAt where due <= now {
                    queue.retryAt[id] = nil
                    Self.add(id, to: &queue)
                }
                scheduleRetry(&queue)
                s.queues[db.name] = queue
            }
            pump(db: db)
        }
    }

    /// Stops listening to `db`'s feed (no collection is eager).
    private func stopListening(_ db: BlazeDatabase) {
        let token = state.withLock { s -> Int? in
            guard s.queues[db.name]?.db === db else { return nil }
            defer { s.queues[db.name]!.feedToken = nil }
            return s.queues[db.name]!.feedToken
        }
        if let token { db.feed.detach(token) }
    }

    /// `db` was dropped or closed (or, `unlessRefreshed`, has nothing to fetch and no refresh was asked for since):
    /// its queue goes.
    private func forget(_ db: BlazeDatabase, unlessRefreshed: Bool = false) {
        let queue = state.withLock { s -> Queue? in
            guard let queue = s.queues[db.name], queue.db === db, !(unlessRefreshed && queue.refreshAgain) else { return nil }
            return s.queues.removeValue(forKey: db.name)
        }
        if let queue { Self.tearDown(queue) }
    }

    /// Cancels a queue's retry and detaches its feed listener.
    private static func tearDown(_ queue: Queue) {
        queue.retry?.cancel()
        if let token = queue.feedToken { queue.db.feed.detach(token) }
    }
}
