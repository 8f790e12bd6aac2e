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

    /// Removes `db`'s chunks that no blob it refers to uses, that no put or upload under way holds (`ChunkPins`), and
    /// that were written (or put again) more than `graceSeconds` ago. The database's writer is held while the
    /// references are read and the chunks removed, so no commit starts referring to a chunk in between. A manifest
    /// that cannot be read (an I/O error) ends the sweep before anything is removed.
    func collect(db: BlazeDatabase, graceSeconds: Int = Blobs.defaultGraceSeconds) throws -> Sweep {
        // A database that never held a blob has no store, and none is made for it here.
        guard FileManager.default.fileExists(atPath: ChunkStores.directory(of: db)) else { return Sweep() }
        let store = try stores.store(for: db)
        // Any size: a manifest held here is expanded whatever `max-blob-bytes` says now.
        let reader = BlobReader(store: store, maxSize: .max)
        let removed = try db.withReferencedBlobs { blobs -> (removed: Int, bytes: Int) in
            var keep = Set<ChunkID>()
            for blob in blobs {
                keep.insert(blob)
                do {
                    // Not held here (not fetched yet, or a hex string that names no blob): nothing of it to keep.
                    guard let manifest = try reader.manifest(blob) else { continue }
                    for piece in manifest.pieces { keep.insert(piece.id) }
                } catch let error as ChunkStoreError where error.reason == .invalid {
                    // Held but not a manifest (a content chunk's id written in a document): kept itself, nothing more.
                    // One that starts as a manifest but does not decode (a damaged file) stops the sweep: its chunks
                    // are not known, so none may go.
                    if try store.read(blob, offset: 0, length: 4) == Array("BZB1".utf8) { throw error }
                    continue
                }
            }
            return try store.sweep(keeping: keep, writtenBefore: Date().timeIntervalSince1970 - Double(graceSeconds))
        }
        let kept = try held(db: db)
        return Sweep(removedChunks: removed.removed, removedBytes: removed.bytes, keptChunks: kept.chunks, keptBytes: kept.bytes)
    }

    /// The chunks `db`'s store holds and their bytes (none when it has no store: none is made for it here).
    func held(db: BlazeDatabase) throws -> (chunks: Int, bytes: Int) {
        guard FileManager.default.fileExists(atPath: ChunkStores.directory(of: db)) else { return (0, 0) }
        let store = try stores.store(for: db)
        return store.all().reduce(into: (0, 0)) { total, id in total = (total.0 + 1, total.1 + (store.size(of: id) ?? 0)) }
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
