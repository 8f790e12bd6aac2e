import BlazeBlob
import BlazeProtocol
import BlazeStore
import BlazeSync
import Foundation
import Logging

/// Collecting chunks (ARCHITECTURE.md, "Blobs"): a database's chunk store keeps the chunks of every blob anything it
/// holds refers to, of uploads under way, and any written or put again within a grace period; the rest goes.
extension Blobs {
    /// How long a chunk written (or put again) stays whatever refers to it, unless a caller says otherwise: a blob put
    /// now and referred to by a document later is not lost in between.
    static let defaultGraceSeconds = 86_400

    /// What a sweep of one database's chunks did.
    struct Sweep: Sendable {
        var removedChunks = 0, removedBytes = 0, keptChunks = 0, keptBytes = 0
    }

    /// The chunks in-band uploads of database `name` under way have stored so far.
    func uploading(db name: String) -> Set<ChunkID> {
        let under = uploads.withLock { $0.values.filter { $0.db == name } }
        var out = Set<ChunkID>()
        for upload in under { upload.writer.withLock { if let writer = $0 { out.formUnion(writer.storedChunks) } } }
        return out
    }

    /// Removes `db`'s chunks that no blob it refers to uses, that no upload under way stored, and that were written
    /// (or put again) more than `graceSeconds` ago. The database's writer is held meanwhile, so no commit starts
    /// referring to a chunk between the look at the references and its removal.
    func collect(db: BlazeDatabase, graceSeconds: Int = Blobs.defaultGraceSeconds) throws -> Sweep {
        // A database that never held a blob has no store, and none is made for it here.
        guard FileManager.default.fileExists(atPath: ChunkStores.directory(of: db)) else { return Sweep() }
        let store = try stores.store(for: db)
        let reader = BlobReader(store: store, maxSize: maxBlobBytes)
        let uploading = uploading(db: db.name)
        let removed = try db.withReferencedBlobs { blobs -> (removed: Int, bytes: Int) in
            var keep = uploading
            for blob in blobs {
                keep.insert(blob)
                // A blob whose manifest is not held here (not fetched yet, or a hex string that names no blob) has no
                // chunks here to keep.
                guard let manifest = try? reader.manifest(blob) else { continue }
                for piece in manifest.pieces { keep.insert(piece.id) }
            }
            return store.sweep(keeping: keep, writtenBefore: Date().timeIntervalSince1970 - Double(graceSeconds))
        }
        var sweep = Sweep(removedChunks: removed.removed, removedBytes: removed.bytes)
        for id in store.all() {
            sweep.keptChunks += 1
            sweep.keptBytes += store.size(of: id) ?? 0
        }
        return sweep
    }
}

extension Methods {
    static let blobGc = MethodHandler(RPC.BlobGc.self) { p, ctx in
        let db = try ctx.database(p.db)
        let grace = p.graceSeconds ?? Blobs.defaultGraceSeconds
        guard (0...31_536_000).contains(grace) else {
            throw StoreError(.invalidArgument, kind: "invalid_argument", "graceSeconds must be between 0 and 31536000")
        }
        let sweep = try ctx.blobs.collect(db: db, graceSeconds: grace)
        ctx.logger.info(
            "Blob chunks collected",
            metadata: ["db": "\(db.name)", "removed": "\(sweep.removedChunks)", "bytes": "\(sweep.removedBytes)"])
        return .init(
            removedChunks: sweep.removedChunks, removedBytes: sweep.removedBytes, keptChunks: sweep.keptChunks,
            keptBytes: sweep.keptBytes)
    }.onTransferPool()
}
