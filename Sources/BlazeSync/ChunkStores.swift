import BlazeBlob
import BlazeStore
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Every database's chunk store (`<name>.blobs` beside its file), opened on first use: shared by the methods that put
/// and read blobs and by the sessions that serve and fetch chunks (ARCHITECTURE.md, "Blobs").
public final class ChunkStores: Sendable {
    /// Chunk stores by database name, with the database they were opened for.
    private let stores = Mutex<[String: (db: ObjectIdentifier, store: ChunkStore)]>([:])
    /// Whether a database handle is still the open one under its name (a dropped one gets no chunk store).
    private let isCurrent: @Sendable (BlazeDatabase) -> Bool

    /// The chunk stores of the databases `isCurrent` says are open.
    init(isCurrent: @escaping @Sendable (BlazeDatabase) -> Bool) {
        self.isCurrent = isCurrent
    }

    /// The directory of `db`'s chunks.
    public static func directory(of db: BlazeDatabase) -> String { directory(ofDatabaseAt: db.path) }

    /// The directory of the chunks of the database whose file is `path`.
    public static func directory(ofDatabaseAt path: String) -> String {
        (path.hasSuffix(Store.fileSuffix) ? String(path.dropLast(Store.fileSuffix.count)) : path) + ".blobs"
    }

    /// The chunk store of `db`, opened (and created) on first use.
    ///
    /// Made under the lock, once per database: opening a store removes the temporary files a crashed put left, which
    /// must never be those of a put running now. A database dropped meanwhile gets none (its directory is gone).
    public func store(for db: BlazeDatabase) throws -> ChunkStore {
        let key = ObjectIdentifier(db)
        return try stores.withLock { stores in
            if let held = stores[db.name], held.db == key { return held.store }
            guard isCurrent(db) else {
                throw StoreError(.notFound, kind: "database_not_found", "database \(db.name) was dropped")
            }
            let store: ChunkStore
            do { store = try ChunkStore(directory: Self.directory(of: db)) } catch { throw Self.storeError(error) }
            stores[db.name] = (key, store)
            return store
        }
    }

    /// The chunk store of `db` when it was opened already; nil otherwise (none is made).
    public func opened(for db: BlazeDatabase) -> ChunkStore? {
        stores.withLock { stores in stores[db.name].flatMap { $0.db == ObjectIdentifier(db) ? $0.store : nil } }
    }

    /// Forgets database `name` and removes its chunks in `directory` (it was dropped).
    public func forget(db name: String, directory: String) {
        stores.withLock { stores in
            stores[name] = nil
            // Under the lock: no store is made for the dropped handle meanwhile (`store(for:)` checks it is current).
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    /// A chunk store failure as a store error: a full disk says so.
    public static func storeError(_ error: any Error) -> StoreError {
        if let error = error as? StoreError { return error }
        guard let error = error as? ChunkStoreError else { return StoreError(.internalFailure, kind: "internal", "\(error)") }
        switch error.reason {
        case .system(let code) where code == ENOSPC || code == EDQUOT:
            return StoreError(.limitExceeded, kind: "disk_full", error.description)
        case .limit: return StoreError(.limitExceeded, kind: "blob_too_large", error.description)
        case .missing: return StoreError(.notFound, kind: "chunk_not_held", error.description)
        case .invalid, .system: return StoreError(.internalFailure, kind: "internal", error.description)
        }
    }
}
