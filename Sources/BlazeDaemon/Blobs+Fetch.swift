import BlazeBlob
import BlazeProtocol
import BlazeStore
import BlazeSync
import NIOCore
import NIOPosix

/// Blobs this device lacks, fetched from the devices its database syncs with when they are read (ARCHITECTURE.md,
/// "Blobs"): the manifest first, then the chunks the read needs, a window at a time, each stored as it arrives.
extension Blobs {
    /// How long a read waits for each window of chunks it lacks.
    static let fetchTimeout: TimeAmount = .seconds(120)
    /// Chunks asked for at once (then the next window, so a wait is bounded per window, not per blob).
    static let fetchWindow = 32
    /// Windows a whole-blob read has asked for at once.
    static let windowsAhead = 2

    /// Runs `body` on the I/O pool once `db` holds blob `blob`'s manifest and the chunks `needed` picks out of it,
    /// fetching what it lacks from the devices the database syncs with; `done` gets the outcome. No thread waits
    /// meanwhile. With `inline` (a call inside a batch, on a pool thread that waits for it) nothing is fetched: it
    /// runs at once on what this device holds (`blob_not_held` for the rest).
    func whenHeld<T: Sendable>(
        db: BlazeDatabase, blob: String, sync: SyncEngine, inline: Bool,
        needed: @escaping @Sendable (BlobManifest) -> [ChunkID],
        _ body: @escaping @Sendable (ChunkID, BlobManifest, BlobReader) throws -> T,
        done: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        let id: ChunkID
        do { id = try Self.blobID(blob) } catch { return done(.failure(error)) }
        if inline {
            return done(Result {
                let reader = BlobReader(store: try store(for: db), maxSize: maxBlobBytes)
                guard let manifest = try Self.mapped({ try reader.manifest(id) }) else { throw Self.notHeld(id, db: db) }
                guard needed(manifest).allSatisfy(reader.store.contains) else { throw Self.notHeld(id, db: db) }
                return try body(id, manifest, reader)
            })
        }
        pool.submit { _ in
            self.whenHeld(db: db, id: id, sync: sync, fetchedManifest: false, needed: needed, body, done: done)
        }
    }

    private func whenHeld<T: Sendable>(
        db: BlazeDatabase, id: ChunkID, sync: SyncEngine, fetchedManifest: Bool,
        needed: @escaping @Sendable (BlobManifest) -> [ChunkID],
        _ body: @escaping @Sendable (ChunkID, BlobManifest, BlobReader) throws -> T,
        done: @escaping @Sendable (Result<T, any Error>) -> Void
    ) {
        let pool = self.pool
        do {
            let reader = BlobReader(store: try store(for: db), maxSize: maxBlobBytes)
            guard let manifest = try Self.mapped({ try reader.manifest(id) }) else {
                guard !fetchedManifest else { throw Self.notFound(id, db: db) }
                let events = self.events
                sync.fetchChunks(db: db, ids: [id], timeout: Self.fetchTimeout, waitForSource: false) { result in
                    switch result {
                    case .success:
                        pool.submit { _ in
                            self.whenHeld(db: db, id: id, sync: sync, fetchedManifest: true, needed: needed, body, done: done)
                        }
                    case .failure(let error):
                        let failure = Self.manifestFailure(error, id: id, db: db)
                        events.manifestFailed(db: db.name, id: id, error: failure)
                        done(.failure(failure))
                    }
                }
                return
            }
            var seen = Set<ChunkID>()
            let missing = needed(manifest).filter { seen.insert($0).inserted && !reader.store.contains($0) }
            guard !missing.isEmpty else {
                done(Result { try body(id, manifest, reader) })
                return
            }
            let progress = events.progress(db: db.name, id: id, manifest: manifest, store: reader.store, missing: missing)
            fetchWindows(db: db, missing: missing[...], sync: sync) { window, last in
                progress?.arrived(window, last: last)
            } done: { result in
                switch result {
                case .success:
                    progress?.ended()
                    pool.submit { _ in done(Result { try body(id, manifest, reader) }) }
                case .failure(let error):
                    progress?.ended(error)
                    done(.failure(error))
                }
            }
        } catch {
            done(.failure(Self.storeError(error)))
        }
    }

    /// Fetches `missing` a window at a time, calling `progress` with each window once it is held (and whether it was
    /// the last); `done` once all are held or one window failed.
    private func fetchWindows(
        db: BlazeDatabase, missing: ArraySlice<ChunkID>, sync: SyncEngine,
        progress: @escaping @Sendable ([ChunkID], Bool) -> Void,
        done: @escaping @Sendable (Result<Void, StoreError>) -> Void
    ) {
        guard !missing.isEmpty else { return done(.success(())) }
        let window = Array(missing.prefix(Self.fetchWindow))
        let rest = missing.dropFirst(Self.fetchWindow)
        sync.fetchChunks(db: db, ids: window, timeout: Self.fetchTimeout, waitForSource: true) { result in
            switch result {
            case .success:
                progress(window, rest.isEmpty)
                self.fetchWindows(db: db, missing: rest, sync: sync, progress: progress, done: done)
            case .failure(let error): done(.failure(error))
            }
        }
    }

    /// Blob `blob` of `db` with every chunk held, fetching what it lacks window by window; blocks (for the transfer
    /// pool, which the chunks it waits for never need: sessions store them on the engine's chunk pool).
    ///
    /// Two windows are asked for at once, so sources are never idle between them; `arrived` runs on this thread with
    /// each window's chunks once they are held, in order, while the next ones are being fetched (a caller writes what
    /// is held meanwhile).
    func fetchWhole(
        db: BlazeDatabase, blob: String, sync: SyncEngine, arrived: ((BlobManifest, BlobReader, [ChunkID]) throws -> Void)? = nil
    ) throws -> (ChunkID, BlobManifest, BlobReader) {
        let id = try Self.blobID(blob)
        let reader = BlobReader(store: try store(for: db), maxSize: maxBlobBytes)
        var manifest = try Self.mapped { try reader.manifest(id) }
        if manifest == nil {
            do {
                try sync.fetchChunksAndWait(db: db, ids: [id], timeout: Self.fetchTimeout, waitForSource: false)
            } catch {
                let failure = Self.manifestFailure(error, id: id, db: db)
                events.manifestFailed(db: db.name, id: id, error: failure)
                throw failure
            }
            manifest = try Self.mapped { try reader.manifest(id) }
        }
        guard let manifest else { throw Self.notFound(id, db: db) }
        let missing = reader.missing(manifest)
        let progress = missing.isEmpty
            ? nil : events.progress(db: db.name, id: id, manifest: manifest, store: reader.store, missing: missing)
        var asked: [(window: [ChunkID], last: Bool, fetch: SyncEngine.PendingFetch)] = []
        // Whatever ends the fetch early, the windows still asked for are not waited for.
        defer { for pending in asked { pending.fetch.cancel() } }
        do {
            var next = 0
            func ask() {
                while next < missing.count, asked.count < Self.windowsAhead {
                    let end = min(missing.count, next + Self.fetchWindow)
                    let window = Array(missing[next..<end])
                    // Sources serve the windows in turn: one asked behind others gets a window's time after each of
                    // theirs, so each still has `fetchTimeout` once its turn comes.
                    let timeout = Self.fetchTimeout * Int64(asked.count + 1)
                    asked.append((window, end == missing.count, sync.startFetch(db: db, ids: window, timeout: timeout)))
                    next = end
                }
            }
            ask()
            while !asked.isEmpty {
                let first = asked.removeFirst()
                try first.fetch.wait()
                ask()
                progress?.arrived(first.window, last: first.last)
                try arrived?(manifest, reader, first.window)
            }
        } catch {
            progress?.ended(error)
            throw error
        }
        progress?.ended()
        return (id, manifest, reader)
    }

    /// A blob id from its hex text, or `invalid_blob`.
    static func blobID(_ text: String) throws -> ChunkID {
        guard let id = ChunkID(hex: text) else {
            throw StoreError(.invalidArgument, kind: "invalid_blob", "a blob id is 64 lowercase hex digits, got \"\(text.prefix(80))\"")
        }
        return id
    }

    /// What a failed fetch of blob `id`'s manifest means: no connected device has it (`blob_not_found`), or the
    /// failure as it is (a timeout, a full disk, shutting down).
    static func manifestFailure(_ error: any Error, id: ChunkID, db: BlazeDatabase) -> any Error {
        guard let error = error as? StoreError, error.kind == "blob_unavailable" else { return error }
        return notFound(id, db: db)
    }

    /// `blob_not_found` for blob `id` of `db`.
    static func notFound(_ id: ChunkID, db: BlazeDatabase) -> StoreError {
        StoreError(.notFound, kind: "blob_not_found", "no blob \(id) in database \(db.name), here or on a device it syncs with now")
    }

    /// `blob_not_held`: inside a batch, a blob read uses only what this device holds.
    static func notHeld(_ id: ChunkID, db: BlazeDatabase) -> StoreError {
        StoreError(
            .notFound, kind: "blob_not_held",
            "this device does not hold all of blob \(id) of database \(db.name), and inside a batch a read does not fetch from peers: call it alone")
    }

    /// `body`'s chunk store failure as a store error.
    static func mapped<T>(_ body: () throws -> T) throws -> T {
        do { return try body() } catch { throw storeError(error) }
    }
}
