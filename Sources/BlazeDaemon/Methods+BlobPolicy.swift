import BlazeBlob
import BlazeProtocol
import BlazeStore

/// Which blobs this device holds ahead of reads (ARCHITECTURE.md, "Blobs", "Fetching eagerly"), and the list of them.
extension Methods {
    /// Most collections an eager policy names.
    static let maxEagerCollections = 256

    static let blobPin = MethodHandler(RPC.BlobPin.self) { p, ctx in
        let db = try ctx.database(p.db)
        let id = try Blobs.blobID(p.blob)
        let added = try db.pinBlob(id)
        // Queued even when pinned before: a pin whose fetch waits for a retry is tried now.
        ctx.prefetcher?.refresh(db: db)
        return .init(blob: id.hex, pinned: true, already: !added)
    }

    static let blobUnpin = MethodHandler(RPC.BlobUnpin.self) { p, ctx in
        let db = try ctx.database(p.db)
        let id = try Blobs.blobID(p.blob)
        let was = try db.unpinBlob(id)
        ctx.prefetcher?.refresh(db: db)
        return .init(blob: id.hex, pinned: false, was: was)
    }

    static let blobPolicy = MethodHandler(RPC.BlobPolicy.self) { p, ctx in
        let db = try ctx.database(p.db)
        guard p.eager != nil || p.maxBytes != nil else {
            let policy = try db.blobPolicy()
            return .init(eager: policy.eager, maxBytes: policy.maxBytes)
        }
        let eager = p.eager ?? []
        guard eager.count <= maxEagerCollections else {
            throw StoreError(.limitExceeded, kind: "too_large", "an eager policy names at most \(maxEagerCollections) collections")
        }
        for name in eager where name != "*" { try Names.validateCollection(name) }
        if let maxBytes = p.maxBytes, maxBytes < 0 {
            throw StoreError(.invalidArgument, kind: "invalid_argument", "maxBytes must not be negative, got \(maxBytes)")
        }
        var names: [String] = []
        for name in eager where !names.contains(name) { names.append(name) }
        let policy = BlobPolicy(eager: names, maxBytes: p.maxBytes)
        try db.setBlobPolicy(policy)
        ctx.prefetcher?.refresh(db: db)
        return .init(eager: policy.eager, maxBytes: policy.maxBytes)
    }.onTransferPool()

    static let blobList = MethodHandler(RPC.BlobList.self) { p, ctx in
        let db = try ctx.database(p.db)
        let limit = p.limit ?? 100
        guard (1...1000).contains(limit) else {
            throw StoreError(.invalidArgument, kind: "invalid_argument", "limit must be between 1 and 1000, got \(limit)")
        }
        let after = try p.after.map(Blobs.blobID)
        // Each blob once: its first reference's claims, and how many live documents refer to it.
        var found: [ChunkID: (size: Int, type: String?, references: Int)] = [:]
        for (_, reference) in try db.documentBlobReferences() {
            found[reference.id, default: (reference.size, reference.type, 0)].references += 1
        }
        let pins = try db.pinnedBlobs()
        for id in pins where found[id] == nil { found[id] = (0, nil, 0) }
        let ids = found.keys.filter { after == nil || $0.hex > after!.hex }.sorted { $0.hex < $1.hex }
        let page = ids.prefix(limit)
        let reader = BlobReader(store: try ctx.blobs.store(for: db), maxSize: .max)
        let blobs = page.map { id -> RPC.BlobList.Result.Blob in
            let claim = found[id]!
            // A manifest that is not held (or is not one: a damaged file) leaves chunks null.
            let manifest = try? Blobs.mapped { try reader.manifest(id) }
            var held = 0
            var heldBytes = 0
            for piece in manifest?.pieces ?? [] where reader.store.contains(piece.id) {
                held += 1
                heldBytes += piece.length
            }
            return .init(
                id: id.hex, size: manifest?.size ?? claim.size, type: claim.type, references: claim.references,
                pinned: pins.contains(id), chunks: manifest?.pieces.count, heldChunks: held, heldBytes: heldBytes)
        }
        return .init(blobs: blobs, next: ids.count > limit ? page.last?.hex : nil)
    }.onTransferPool()
}
