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
    /// that were written (or put again) more than `graceSeconds` ago.
    ///
    /// In two steps (`BlazeDatabase.withReferencedBlobs`): the references as of a snapshot, the manifests they name
    /// and the chunks left over are read without holding the database's writer; the writer is then held only while
    /// the references written since are read, their manifests expanded, and what is still left over removed. So no
    /// commit starts referring to a chunk that goes, and writes wait only for what changed meanwhile. A manifest that
    /// cannot be read (an I/O error) ends the sweep before anything is removed.
    func collect(db: BlazeDatabase, graceSeconds: Int = Blobs.defaultGraceSeconds) throws -> Sweep {
        // A database that never held a blob has no store, and none is made for it here.
        guard FileManager.default.fileExists(atPath: ChunkStores.directory(of: db)) else { return Sweep() }
        let store = try stores.store(for: db)
        // Any size: a manifest held here is expanded whatever `max-blob-bytes` says now.
        let reader = BlobReader(store: store, maxSize: .max)
        let cutoff = Date().timeIntervalSince1970 - Double(graceSeconds)
        let removed = try db.withReferencedBlobs(
            plan: { (blobs: Set<ChunkID>) throws -> (unkept: [ChunkID], unread: Set<ChunkID>) in
                try Self.unkept(blobs, reader: reader, store: store, cutoff: cutoff)
            },
            finish: { (planned: (unkept: [ChunkID], unread: Set<ChunkID>), added: Set<ChunkID>) throws -> (removed: Int, bytes: Int) in
                // A manifest not held at the first step may have been fetched since (its pieces held already are
                // neither pinned nor renewed by that fetch): those blobs are looked at again with the new references.
                try Self.sweep(planned.unkept, sparing: added.union(planned.unread), reader: reader, store: store, cutoff: cutoff)
            })
        let kept = try held(db: db)
        return Sweep(removedChunks: removed.removed, removedBytes: removed.bytes, keptChunks: kept.chunks, keptBytes: kept.bytes)
    }

    /// The chunks of `store` that none of `blobs` uses, written (or put again) before `cutoff`, and the blobs among
    /// `blobs` whose manifest is not held here.
    static func unkept(
        _ blobs: Set<ChunkID>, reader: BlobReader, store: ChunkStore, cutoff: Double
    ) throws -> (unkept: [ChunkID], unread: Set<ChunkID>) {
        var unread = Set<ChunkID>()
        let keep = try chunks(of: blobs, reader: reader, store: store, unread: &unread)
        return (try store.unkept(keeping: keep, writtenBefore: cutoff), unread)
    }

    /// Removes those of `unkept` that none of `added` uses (and that are still unpinned and old enough).
    static func sweep(
        _ unkept: [ChunkID], sparing added: Set<ChunkID>, reader: BlobReader, store: ChunkStore, cutoff: Double
    ) throws -> (removed: Int, bytes: Int) {
        var unread = Set<ChunkID>()
        let keep = try chunks(of: added, reader: reader, store: store, unread: &unread)
        return store.sweep(unkept.filter { !keep.contains($0) }, writtenBefore: cutoff)
    }

    /// The chunks `blobs` use: each blob's own (manifest) chunk and, where its manifest is held here, every piece it
    /// lists. A blob not held here (not fetched yet, or a hex string that names no blob) adds only itself; a held
    /// chunk that is not a manifest (a content chunk's id written in a document) only itself. One that starts as a
    /// manifest but does not decode (a damaged file) throws: its chunks are not known, so none may go. The blobs whose
    /// manifest is not held are added to `unread`.
    static func chunks(of blobs: Set<ChunkID>, reader: BlobReader, store: ChunkStore, unread: inout Set<ChunkID>) throws -> Set<ChunkID> {
        var keep = Set<ChunkID>()
        for blob in blobs {
            keep.insert(blob)
            guard let pieces = try pieces(of: blob, reader: reader, store: store) else {
                unread.insert(blob)
                continue
            }
            for piece in pieces { keep.insert(piece) }
        }
        return keep
    }

    /// The pieces the manifest `blob` lists: nil when it is not held here, none when it is not a manifest (see
    /// `chunks(of:)`).
    private static func pieces(of blob: ChunkID, reader: BlobReader, store: ChunkStore) throws -> [ChunkID]? {
        switch Result(catching: { () throws(ChunkStoreError) -> BlobManifest? in try reader.manifest(blob) }) {
        case .success(let manifest):
            return manifest?.pieces.map(\.id)
        case .failure(let error):
            guard error.reason == .invalid, try store.read(blob, offset: 0, length: 4) != Array("BZB1".utf8) else { throw error }
            return []
        }
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
