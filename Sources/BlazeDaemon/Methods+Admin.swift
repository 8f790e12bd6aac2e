import BlazeProtocol
import BlazeStore

/// Operations: backup, restore and compaction (ARCHITECTURE.md, "Operations").
extension Methods {
    static let dbCompact = MethodHandler(RPC.DbCompact.self) { p, ctx in
        let db = try ctx.database(p.db)
        let outcome = try ctx.sync.compact(db: db, horizonMs: UInt64(ctx.config.compactionHorizonMs), defragment: true)
        // What compaction dropped may have been the last reference to a blob: its chunks go (after the grace period).
        let sweep = try ctx.blobs.collect(db: db)
        let r = outcome.report
        ctx.logger.info(
            "Database compacted",
            metadata: [
                "db": "\(db.name)", "rows": "\(r.rows)", "pages": "\(r.pagesFreed)", "ms": "\(r.durationMs)",
                "chunksRemoved": "\(sweep.removedChunks)",
            ])
        return .init(
            db: db.name, changes: r.changes, tombstones: r.tombstones, entries: r.entries, heads: r.heads, folded: r.folded,
            pagesFreed: r.pagesFreed, durationMs: Int(r.durationMs), sizeBytes: Int(try db.summary().sizeBytes),
            stableVector: Dictionary(uniqueKeysWithValues: outcome.stable.entries.map { ($0.key.hex, Int($0.value)) }),
            silentMembers: outcome.silentMembers)
    }

    static let dbBackup = MethodHandler(RPC.DbBackup.self) { p, ctx in
        let db = try ctx.database(p.db)
        let report = try db.backup(to: p.path, chunks: ctx.blobs.backupSource(db: db))
        ctx.logger.info(
            "Backup written",
            metadata: [
                "db": "\(db.name)", "path": "\(report.path)", "bytes": "\(report.bytes)", "chunks": "\(report.chunks.chunks)",
                "blobsNotHeld": "\(report.chunks.blobsNotHeld)",
            ])
        return .init(
            db: db.name, path: report.path, bytes: Int(report.bytes), documents: report.documents, stateHash: report.stateHash,
            chunks: report.chunks.chunks, chunkBytes: Int(report.chunks.bytes), blobsNotHeld: report.chunks.blobsNotHeld)
    }

    static let dbRestore = MethodHandler(RPC.DbRestore.self) { p, ctx in
        let (db, chunks) = try ctx.store.restore(from: p.path, as: p.db, chunks: Blobs.restoreSink(path: ctx.store.path(p.db)))
        let summary = try db.summary()
        ctx.logger.info("Database restored", metadata: ["db": "\(db.name)", "path": "\(p.path)", "chunks": "\(chunks.chunks)"])
        return .init(
            db: db.name, documents: summary.documents, stateHash: try db.stateHash(), chunks: chunks.chunks,
            chunkBytes: Int(chunks.bytes))
    }
}
