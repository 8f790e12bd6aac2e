import BlazeBlob
import BlazeProtocol
import BlazeStore
import BlazeSync
import NIOCore
import NIOPosix

/// Blobs this device lacks, fetched from the devices its database syncs with when they are read (ARCHITECTURE.md,
/// "Blobs"): the manifest first, then the chunks the read needs, each stored as it arrives.
extension Blobs {
    /// How long a read waits for the chunks it lacks, and a get for each window of them.
    static let fetchTimeout: TimeAmount = .seconds(120)
    /// Chunks a get asks for at once (then the next window, so its wait is bounded per window, not per blob).
    static let fetchWindow = 32

    /// Runs `body` on the I/O pool once `db` holds blob `blob`'s manifest and the chunks `needed` picks out of it,
    /// fetching what it lacks from the devices the database syncs with; `done` gets the outcome. No thread waits
    /// meanwhile, unless `inline`: then all of it runs on the calling thread, which waits for the chunks.
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
                let (_, manifest, reader) = try fetch(db: db, id: id, sync: sync, needed: needed)
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
            guard let manifest = try reader.manifest(id) else {
                guard !fetchedManifest else { throw Self.notFound(id, db: db) }
                sync.fetchChunks(db: db, ids: [id], timeout: Self.fetchTimeout, waitForSource: false) { result in
                    switch result {
                    case .success:
                        pool.submit { _ in
                            self.whenHeld(db: db, id: id, sync: sync, fetchedManifest: true, needed: needed, body, done: done)
                        }
                    case .failure(let error) where error.kind == "blob_unavailable":
                        done(.failure(Self.notFound(id, db: db)))
                    case .failure(let error):
                        done(.failure(error))
                    }
                }
                return
            }
            var seen = Set<ChunkID>()
            let missing = needed(manifest).filter { seen.insert($0).inserted && !reader.store.contains($0) }
            guard !missing.isEmpty else { return done(Result { try body(id, manifest, reader) }) }
            sync.fetchChunks(db: db, ids: missing, timeout: Self.fetchTimeout, waitForSource: true) { result in
                switch result {
                case .success: pool.submit { _ in done(Result { try body(id, manifest, reader) }) }
                case .failure(let error): done(.failure(error))
                }
            }
        } catch {
            done(.failure(Self.storeError(error)))
        }
    }

    /// Blob `blob` of `db` with every chunk held, fetching what it lacks window by window; blocks (for the transfer
    /// pool).
    func fetchWhole(db: BlazeDatabase, blob: String, sync: SyncEngine) throws -> (ChunkID, BlobManifest, BlobReader) {
        try fetch(db: db, id: try Self.blobID(blob), sync: sync) { $0.pieces.map(\.id) }
    }

    /// Blob `id` of `db` with its manifest and the chunks `needed` picks held, fetching what it lacks window by window;
    /// blocks.
    private func fetch(
        db: BlazeDatabase, id: ChunkID, sync: SyncEngine, needed: (BlobManifest) -> [ChunkID]
    ) throws -> (ChunkID, BlobManifest, BlobReader) {
        let reader = BlobReader(store: try store(for: db), maxSize: maxBlobBytes)
        var manifest = try Self.mapped { try reader.manifest(id) }
        if manifest == nil {
            do {
                try sync.fetchChunksAndWait(db: db, ids: [id], timeout: Self.fetchTimeout, waitForSource: false)
            } catch let error as StoreError where error.kind == "blob_unavailable" {
                throw Self.notFound(id, db: db)
            }
            manifest = try Self.mapped { try reader.manifest(id) }
        }
        guard let manifest else { throw Self.notFound(id, db: db) }
        var seen = Set<ChunkID>()
        let missing = needed(manifest).filter { seen.insert($0).inserted && !reader.store.contains($0) }
        for start in stride(from: 0, to: missing.count, by: Self.fetchWindow) {
            let window = Array(missing[start..<min(missing.count, start + Self.fetchWindow)])
            try sync.fetchChunksAndWait(db: db, ids: window, timeout: Self.fetchTimeout, waitForSource: true)
        }
        return (id, manifest, reader)
    }

    /// A blob id from its hex text, or `invalid_blob`.
    static func blobID(_ text: String) throws -> ChunkID {
        guard let id = ChunkID(hex: text) else {
            throw StoreError(.invalidArgument, kind: "invalid_blob", "a blob id is 64 lowercase hex digits, got \"\(text.prefix(80))\"")
        }
        return id
    }

    /// `blob_not_found` for blob `id` of `db`.
    static func notFound(_ id: ChunkID, db: BlazeDatabase) -> StoreError {
        StoreError(.notFound, kind: "blob_not_found", "no blob \(id) in database \(db.name), here or on a device it syncs with now")
    }

    /// `body`'s chunk store failure as a store error.
    static func mapped<T>(_ body: () throws -> T) throws -> T {
        do { return try body() } catch { throw storeError(error) }
    }
}
