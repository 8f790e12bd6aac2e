import BlazeBlob
import BlazeProtocol
import BlazeStore
import BlazeSync
import Foundation

/// Blobs in backups (README, "Backup and restore"): a backup holds the chunks this device holds of every blob its
/// snapshot refers to, and a restore puts them into the restored database's chunk store before the database appears.
extension Blobs {
    /// The chunks a backup of `db` copies (`BackupChunks.Source`): of the blobs the snapshot may refer to, each
    /// manifest held here and the pieces it lists that are held, each once; nil when `db` never held a blob. Counts
    /// the blobs its live documents refer to that are not held whole here (their missing chunks are not in the
    /// backup: a device that fetches lazily holds only what it read).
    func backupSource(db: BlazeDatabase) -> BackupChunks.Source? {
        guard FileManager.default.fileExists(atPath: ChunkStores.directory(of: db)) else { return nil }
        let stores = self.stores
        return { blobs, write in
            let store = try stores.store(for: db)
            let reader = BlobReader(store: store, maxSize: .max)
            var written = Set<ChunkID>(), whole = Set<ChunkID>()
            // The ids are every one a row that mentions a blob holds (more than the references): those that name no
            // manifest held here are passed over.
            for blob in blobs.sorted(by: { $0.hex < $1.hex }) {
                guard let manifest = try? reader.manifest(blob), let bytes = try store.read(blob) else { continue }
                try write(blob, bytes)
                written.insert(blob)
                var complete = true
                for piece in manifest.pieces where !written.contains(piece.id) {
                    guard let content = try store.read(piece.id) else {
                        complete = false
                        continue
                    }
                    try write(piece.id, content)
                    written.insert(piece.id)
                }
                if complete { whole.insert(blob) }
            }
            let referred = Set(try db.documentBlobReferences().map(\.reference.id))
            return referred.subtracting(whole).count
        }
    }

    /// Where a restore of a database named `name` (whose file will be `path`) puts its backup's chunks: the chunk
    /// store that database will have, made on the first chunk and removed again if the restore fails (unless it was
    /// there before).
    static func restoreSink(path: String) -> BackupChunks.Sink {
        let directory = ChunkStores.directory(ofDatabaseAt: path)
        let existed = FileManager.default.fileExists(atPath: directory)
        var store: ChunkStore?
        return BackupChunks.Sink(
            maximum: Chunker.Sizes.standard.maximum,
            put: { id, content in
                let opened = try store ?? ChunkStore(directory: directory)
                store = opened
                _ = try opened.put(id, content)
            },
            discard: { if !existed { try? FileManager.default.removeItem(atPath: directory) } })
    }
}
