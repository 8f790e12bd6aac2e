import BlazeProtocol
import BlazeStore

/// Operations: backup and restore (DESIGN §9).
extension Methods {
    static let dbBackup = MethodHandler(RPC.DbBackup.self) { p, ctx in
        let db = try ctx.database(p.db)
        let report = try db.backup(to: p.path)
        ctx.logger.info("Backup written", metadata: ["db": "\(db.name)", "path": "\(report.path)", "bytes": "\(report.bytes)"])
        return .init(
            db: db.name, path: report.path, bytes: Int(report.bytes), documents: report.documents, stateHash: report.stateHash)
    }

    static let dbRestore = MethodHandler(RPC.DbRestore.self) { p, ctx in
        let db = try ctx.store.restore(from: p.path, as: p.db)
        let summary = try db.summary()
        ctx.logger.info("Database restored", metadata: ["db": "\(db.name)", "path": "\(p.path)"])
        return .init(db: db.name, documents: summary.documents, stateHash: try db.stateHash())
    }
}
