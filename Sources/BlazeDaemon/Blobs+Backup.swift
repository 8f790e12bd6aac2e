import BlazeBlob
import BlazeProtocol
import BlazeStore
import BlazeSync
import Foundation

/// Blobs in backups (README, "Backup and restore"): a backup holds the chunks this device holds of every blob its
/// snapshot refers to, and a restore puts them into the restored database's chunk store before the database appears.
extension Blobs {
    /// The chunks a backup of `db` copies (`BackupChunks.Source`): of the blobs the snapshot may refer to, each
    /// manifest held here and the pieces it lists that are held, each once, pinned in the chunk store from `prepare`
    /// until the copy is done. Counts the blobs its live documents refer to that are not held whole here (their
    /// missing chunks are not in the backup: a device that fetches lazily holds only what it read).
    func backupSource(db: BlazeDatabase) -> BackupChunks.Source {
        /// What `prepare` kept for `copy`: used by one backup, on its thread, one step after the other.
        final class Kept: @unchecked Sendable {
            var store: ChunkStore?
            var pins: ChunkPins?
            var ids: [ChunkID] = []
        }
        let (stores, kept) = (self.stores, Kept())
        return BackupChunks.Source(
            prepare: { blobs, referred in
                // A database that never held a blob has no store, and none is made for it here.
                guard FileManager.default.fileExists(atPath: ChunkStores.directory(of: db)) else { return referred.count }
                let store = try stores.store(for: db)
                let (reader, pins) = (BlobReader(store: store, maxSize: .max), ChunkPins(store: store))
                var listed = Set<ChunkID>(), whole = Set<ChunkID>()
                // The ids are every one a row that mentions a blob holds (more than the references): those that name
                // no manifest held here are passed over. A chunk used twice (a piece of one blob may be another's
                // manifest) is kept once.
                for blob in blobs {
                    guard let manifest = try? reader.manifest(blob) else { continue }
                    var complete = true
                    for id in [blob] + manifest.pieces.map(\.id) where !listed.contains(id) {
                        guard store.pin(id, into: pins) else {
                            complete = false
                            continue
                        }
                        listed.insert(id)
                        kept.ids.append(id)
                    }
                    if complete { whole.insert(blob) }
                }
                (kept.store, kept.pins) = (store, pins)
                return referred.subtracting(whole).count
            },
            copy: { write in
                defer { (kept.store, kept.pins, kept.ids) = (nil, nil, []) }
                guard let store = kept.store else { return }
                for id in kept.ids {
                    let content: [UInt8]?
                    do {
                        content = try store.read(id)
                    } catch {
                        throw ChunkStores.storeError(error)
                    }
                    // Pinned since `prepare`: a chunk gone meanwhile was removed by hand, and the backup would lack it.
                    guard let content else {
                        throw StoreError(.internalFailure, kind: "io_error", "chunk \(id) disappeared from the chunk store during the backup")
                    }
                    try write(id, content)
                }
            })
    }

    /// Where a restore of the database whose file will be `path` puts its backup's chunks: a directory beside it that
    /// no database name can give (`.restoring-UUID`: names never start with a dot), made on the first chunk and moved
    /// into place as that database's chunk store by `finish`, right before the database file is linked; `discard`
    /// removes whichever of the two this restore made. A chunk store already there belongs to no database (the name
    /// is reserved and free): it is removed.
    static func restoreSink(path: String) -> BackupChunks.Sink {
        let directory = ChunkStores.directory(ofDatabaseAt: path)
        let parent = (path as NSString).deletingLastPathComponent
        let staging = parent + "/" + restoringPrefix + UUID().uuidString
        var store: ChunkStore?
        var moved = false
        return BackupChunks.Sink(
            maximum: Chunker.Sizes.standard.maximum,
            put: { id, content in
                do {
                    let opened = try store ?? ChunkStore(directory: staging)
                    store = opened
                    _ = try opened.put(id, content)
                } catch {
                    throw ChunkStores.storeError(error)
                }
            },
            finish: {
                try? FileManager.default.removeItem(atPath: directory)
                guard store != nil else { return }
                // The staging directory's entries (its shard directories) are durable before it takes its name, and
                // the name before the database file is linked: a crash never leaves the file without its chunks.
                try syncDirectory(staging)
                guard rename(staging, directory) == 0 else {
                    throw StoreError(
                        .internalFailure, kind: "io_error", "cannot move \(staging) to \(directory): \(String(cString: strerror(errno)))")
                }
                moved = true
                try syncDirectory(parent)
            },
            discard: { try? FileManager.default.removeItem(atPath: moved ? directory : staging) })
    }

    /// fsync of directory `path`, as a store error.
    private static func syncDirectory(_ path: String) throws {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0, fsync(fd) == 0 else {
            let code = errno
            if fd >= 0 { close(fd) }
            throw StoreError(.internalFailure, kind: "io_error", "cannot sync \(path): \(String(cString: strerror(code)))")
        }
        close(fd)
    }

    /// How the name of a restore's chunk directory starts until it is moved into place.
    static let restoringPrefix = ".restoring-"

    /// Removes the chunk directories of restores that never finished (a daemon stopped midway) from `databases`:
    /// directories named `.restoring-` and a UUID, which no database's files can be.
    static func removeUnfinishedRestores(in databases: String) {
        for name in (try? FileManager.default.contentsOfDirectory(atPath: databases)) ?? []
        where name.hasPrefix(restoringPrefix) && UUID(uuidString: String(name.dropFirst(restoringPrefix.count))) != nil {
            var info = stat()
            guard lstat(databases + "/" + name, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR else { continue }
            try? FileManager.default.removeItem(atPath: databases + "/" + name)
        }
    }
}
