import BlazeProtocol
import BlazeStore

extension Methods {
    /// Operations: effective configuration, backup and restore (DESIGN §9).
    static let adminMethods: [MethodSpec] = [
        MethodSpec(inline: true, name: "daemon.config", summary: "The daemon's effective settings and where each came from.",
            params: []) { _, ctx in
            ctx.config.settings ?? ["file": .null, "settings": []]
        },
        MethodSpec(name: "db.backup",
            summary: "Writes a consistent snapshot of a database to a new file while writes go on (SQLite online backup).",
            params: [.db, .required("path", .string, "Absolute path of the backup file to create; it must not exist.")]) { p, ctx in
            let db = try ctx.database(p)
            let report = try db.backup(to: p.string("path"))
            ctx.logger.info("Backup written", metadata: ["db": "\(db.name)", "path": "\(report.path)", "bytes": "\(report.bytes)"])
            return [
                "db": .string(db.name), "path": .string(report.path), "bytes": .int(report.bytes),
                "documents": .int(Int64(report.documents)), "stateHash": .string(report.stateHash),
            ]
        },
        MethodSpec(name: "db.restore",
            summary: "Creates a new database from a backup file; the copy is local (detached from sync) until shared anew.",
            params: [
                .required("path", .string, "Absolute path of a file written by db.backup."),
                .required("db", .string, "Name of the new database; it must not exist."),
            ]) { p, ctx in
            let db = try ctx.store.restore(from: p.string("path"), as: p.string("db"))
            let summary = try db.summary()
            ctx.logger.info("Database restored", metadata: ["db": "\(db.name)", "path": "\(p.string("path"))"])
            return [
                "db": .string(db.name), "documents": .int(Int64(summary.documents)), "stateHash": .string(try db.stateHash()),
            ]
        },
    ]
}
