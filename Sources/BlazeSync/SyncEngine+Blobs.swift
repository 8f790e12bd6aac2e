import BlazeBlob
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import Dispatch
import NIOCore
import Synchronization

/// Serializes choosing a database's blob keys against sharing it, so that a blob put while the database is shared is
/// named under the secret the new space keeps.
private let blobKeyChoice = Mutex(())
/// Blob keys derived lately, by space, with the secret they were derived from.
private let derivedBlobKeys = Mutex<[SpaceID: (genesis: [UInt8], keys: BlobKeys)]>([:])

extension SyncEngine {
    /// The keys `db`'s blobs are chunked and named with: derived from its space's epoch-1 secret, or for a database
    /// not shared yet from the secret its space will have (`PendingSpace`, chosen now if it has none).
    ///
    /// Throws `blob_keys_missing` while a joining database does not hold its space's epoch-1 secret yet.
    public func blobKeys(db: BlazeDatabase) throws -> BlobKeys {
        try blobKeyChoice.withLock { _ in
            if let space = try space(db: db) {
                let snapshot = space.snapshot
                let genesisID = snapshot.membership?.epochKeys.first { $0.epoch == 1 }
                guard let genesis = genesisID.flatMap({ snapshot.held[$0] }) ?? snapshot.stored?.secrets[1] else {
                    throw StoreError(
                        .syncFailure, kind: "blob_keys_missing",
                        "database \(db.name) does not hold its space's first key yet (it is still joining): blobs are named with keys derived from it")
                }
                return try Self.blobKeys(space: space.id, genesis: genesis)
            }
            // A dropped database's handle must not leave a secret behind for a later database of its name.
            guard store.isCurrent(db) else {
                throw StoreError(.notFound, kind: "database_not_found", "database \(db.name) was dropped")
            }
            let pending: PendingSpace
            if let held = try loadPending(db: db) {
                pending = held
            } else {
                pending = PendingSpace.generate()
                try pending.save(directory: keysDirectory, db: db.name)
            }
            return try Self.blobKeys(space: MembershipOp.spaceID(creator: identity.publicKeys, salt: pending.salt), genesis: pending.genesis)
        }
    }

    /// Fetches chunks `ids` that `db` lacks from the devices its sessions reach; `done` runs (on any thread) once all
    /// are stored, when one cannot be had (`blob_unavailable`), or after `timeout`. With `waitForSource`, chunks wait
    /// while no session is established (a link reconnecting); without, they fail at once. A database that is not
    /// shared has nowhere to fetch from: `blob_unavailable` at once.
    public func fetchChunks(
        db: BlazeDatabase, ids: [ChunkID], timeout: TimeAmount, waitForSource: Bool,
        done: @escaping @Sendable (Result<Void, StoreError>) -> Void
    ) {
        guard !ids.isEmpty else { return done(.success(())) }
        guard (try? space(db: db)) != nil else {
            return done(.failure(Self.notShared(db)))
        }
        chunks.fetch(db: db.name, ids: ids, timeout: timeout, waitForSource: waitForSource, done: done)
    }

    /// Fetches chunks `ids` that `db` lacks and waits for them (see `fetchChunks`), on a thread that may block.
    public func fetchChunksAndWait(db: BlazeDatabase, ids: [ChunkID], timeout: TimeAmount, waitForSource: Bool) throws {
        let outcome = Mutex<Result<Void, StoreError>?>(nil)
        let arrived = DispatchSemaphore(value: 0)
        fetchChunks(db: db, ids: ids, timeout: timeout, waitForSource: waitForSource) { result in
            outcome.withLock { $0 = result }
            arrived.signal()
        }
        arrived.wait()
        try outcome.withLock { $0! }.get()
    }

    /// `blob_unavailable` for a database that is not shared: it has nowhere to fetch from.
    static func notShared(_ db: BlazeDatabase) -> StoreError {
        StoreError(
                .notFound, kind: "blob_unavailable", "database \(db.name) is not shared: its blobs are only what this device holds")
    }

    /// A fetch started by `startFetch`: its caller waits for it, or cancels it.
    public final class PendingFetch: Sendable {
        private let outcome = Mutex<Result<Void, StoreError>?>(nil)
        private let arrived = DispatchSemaphore(value: 0)
        private let token = Mutex<(fetcher: ChunkFetcher, id: Int)?>(nil)

        fileprivate init() {}

        /// Records the outcome and wakes the waiter; only the first outcome counts.
        fileprivate func finish(_ result: Result<Void, StoreError>) {
            let first = outcome.withLock { o in
                guard o == nil else { return false }
                o = result
                return true
            }
            if first { arrived.signal() }
        }

        /// Blocks until every chunk is stored; throws why one cannot be had.
        public func wait() throws {
            arrived.wait()
            try outcome.withLock { $0! }.get()
        }

        /// No caller waits any more: the chunks no other caller wants are not asked for, and a `wait` not yet
        /// answered throws `fetch_cancelled`.
        public func cancel() {
            if let (fetcher, id) = token.withLock({ $0 }) { fetcher.cancel(id) }
            finish(.failure(StoreError(.syncFailure, kind: "fetch_cancelled", "the fetch was cancelled")))
        }

        fileprivate func started(_ fetcher: ChunkFetcher, _ id: Int) { token.withLock { $0 = (fetcher, id) } }
    }

    /// Starts fetching chunks `ids` of `db` as `fetchChunks` does (waiting while no session is established), for a
    /// caller that waits for it later on a thread that may block.
    public func startFetch(db: BlazeDatabase, ids: [ChunkID], timeout: TimeAmount) -> PendingFetch {
        let pending = PendingFetch()
        guard !ids.isEmpty else {
            pending.finish(.success(()))
            return pending
        }
        guard (try? space(db: db)) != nil else {
            pending.finish(.failure(Self.notShared(db)))
            return pending
        }
        let id = chunks.fetch(db: db.name, ids: ids, timeout: timeout, waitForSource: true) { pending.finish($0) }
        pending.started(chunks, id)
        return pending
    }

    /// How many of `ids` (chunks of `db`) are being fetched from peers now.
    public func chunksBeingFetched(db: BlazeDatabase, among ids: [ChunkID]) -> Int { chunks.wanted(db: db.name, among: ids) }

    /// The salt and epoch-1 secret `share` creates `db`'s space with: its pending space's when blobs chose one.
    func spaceSecrets(db: BlazeDatabase) throws -> (salt: [UInt8], genesis: [UInt8]) {
        guard let pending = try loadPending(db: db) else {
            return (SpaceKey.randomBytes(16), SpaceKey.randomSecret())
        }
        return (pending.salt, pending.genesis)
    }

    /// The pending space of `db`; an unreadable file is named in the error, for a person to look at.
    private func loadPending(db: BlazeDatabase) throws -> PendingSpace? {
        do {
            return try PendingSpace.load(directory: keysDirectory, db: db.name)
        } catch {
            throw StoreError(
                .syncFailure, kind: "pending_space_unusable",
                "the secret database \(db.name)'s blobs are named with cannot be read (\(error)); it is in \(keysDirectory)")
        }
    }

    /// Removes the pending space of database `name` (dropped), with no blob keys being chosen meanwhile, and the blob
    /// keys derived from it.
    func forgetPendingSpace(db name: String) {
        blobKeyChoice.withLock { _ in
            if let pending = try? PendingSpace.load(directory: keysDirectory, db: name) {
                Self.forgetBlobKeys(space: MembershipOp.spaceID(creator: identity.publicKeys, salt: pending.salt))
            }
            PendingSpace.remove(directory: keysDirectory, db: name)
        }
    }

    /// Drops the blob keys derived for `space` (its database was dropped): no secret of it stays in memory.
    static func forgetBlobKeys(space: SpaceID) {
        _ = derivedBlobKeys.withLock { $0.removeValue(forKey: space) }
    }

    /// Whether blob keys derived for `space` are kept in memory (for tests).
    static func holdsBlobKeys(space: SpaceID) -> Bool { derivedBlobKeys.withLock { $0[space] != nil } }

    /// Runs `body` (a share) with blob keys not being chosen meanwhile.
    func choosingSpace<T>(_ body: () throws -> T) throws -> T {
        try blobKeyChoice.withLock { _ in try body() }
    }

    /// Blob keys from parts this device holds, as a store error.
    static func blobKeys(space: SpaceID, genesis: [UInt8]) throws -> BlobKeys {
        // Deriving them (two HKDFs and the chunker's table) would cost more than checking a small chunk's id.
        if let known = derivedBlobKeys.withLock({ $0[space] }), known.genesis == genesis { return known.keys }
        do {
            let keys = try BlobKeys(space: space, genesis: genesis)
            derivedBlobKeys.withLock { cache in
                if cache.count >= 256 { cache.removeAll() }
                cache[space] = (genesis, keys)
            }
            return keys
        } catch {
            throw StoreError(.internalFailure, kind: "internal", "blob keys: \(error.description)")
        }
    }
}
