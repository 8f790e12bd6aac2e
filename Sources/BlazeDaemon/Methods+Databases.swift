import BlazeProtocol
import BlazeStore
import BlazeSync

/// Databases and collections.
extension Methods {
    static let dbCreate = MethodHandler(RPC.DbCreate.self) { p, ctx in
        _ = try ctx.store.create(p.db)
        return .init(db: p.db)
    }

    static let dbList = MethodHandler(RPC.DbList.self, inline: true) { _, ctx in
        .init(databases: try ctx.store.list().map { .init(name: $0, sizeBytes: ctx.store.fileBytes(of: $0)) })
    }

    static let dbInfo = MethodHandler(RPC.DbInfo.self) { p, ctx in
        let db = try ctx.database(p.db)
        let s = try db.summary()
        let blobs = try ctx.blobs.held(db: db)
        return .init(
            name: s.name, path: s.path, collections: s.collections, documents: s.documents, sizeBytes: Int(s.sizeBytes),
            nodeId: db.node.hex, stateHash: try db.stateHash(),
            versionVector: Dictionary(uniqueKeysWithValues: try db.versionVector().entries.map { ($0.key.hex, Int($0.value)) }),
            bytesByTable: try db.bytesByTable().mapValues { Int($0) },
            lastCompaction: try db.lastCompaction().map {
                .init(
                    finishedAtMs: Int($0.finishedAtMs), durationMs: Int($0.durationMs), changes: $0.changes, tombstones: $0.tombstones,
                    entries: $0.entries, heads: $0.heads, folded: $0.folded, pagesFreed: $0.pagesFreed)
            }, blobs: .init(chunks: blobs.chunks, bytes: blobs.bytes))
    }

    static let dbCheck = MethodHandler(RPC.DbCheck.self) { p, ctx in
        let c = try ctx.store.check(p.db)
        return .init(db: p.db, format: c.format, ok: c.problems.isEmpty, problems: c.problems)
    }

    static let dbDrop = MethodHandler(RPC.DbDrop.self) { p, ctx in
        let dropped = try? ctx.store.database(p.db)
        let space = try? dropped?.spaceID()
        try ctx.store.drop(p.db)
        if let dropped { ctx.blobs.forget(db: p.db, directory: ChunkStores.directory(of: dropped)) }
        ctx.sync.forget(db: p.db, spaceID: space ?? nil)
        return .init(db: p.db)
    }

    static let collectionList = MethodHandler(RPC.CollectionList.self, inline: true) { p, ctx in
        .init(collections: try ctx.database(p.db).collections().map { .init(name: $0.name, count: $0.count) })
    }

    static let collectionDrop = MethodHandler(RPC.CollectionDrop.self) { p, ctx in
        let r = try ctx.writableDatabase(p.db).dropCollection(p.collection)
        return .init(collection: p.collection, deleted: r.deleted, indexes: r.indexes, changes: r.changes)
    }
}
