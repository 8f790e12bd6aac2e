import BlazeProtocol
import Crypto
import Foundation
import GRDB

/// The blob chunks a backup holds (README, "Backup and restore"): the chunks of every blob the snapshot may refer to
/// that this device holds, in a table of the backup file of their own, each with its SHA-256, so that a restore
/// tells a damaged copy and installs the chunks before the database appears.
public enum BackupChunks {
    /// The table, exactly as a backup creates it: a restore refuses a file holding any other definition of it.
    static let createSQL = "CREATE TABLE backup_chunks (id BLOB NOT NULL, sha256 BLOB NOT NULL, content BLOB NOT NULL)"
    /// Chunks written per transaction of the backup file.
    static let perTransaction = 64

    /// The chunks a backup holds (or a restore installed), their bytes, and the blobs referred to that this device
    /// did not hold whole (not in the backup).
    public struct Report: Sendable {
        /// Chunks, each counted once.
        public var chunks = 0
        /// Their content's bytes.
        public var bytes: Int64 = 0
        /// Blobs referred to whose manifest or some piece was not held (backup only).
        public var blobsNotHeld = 0
    }

    /// Where a backup reads a database's chunks (its chunk store), in two steps.
    public struct Source {
        /// Called with the blob ids the snapshot may refer to and those its live documents refer to, while no sweep
        /// of the chunk store can run (from before the snapshot): keeps every chunk of `blobs` held here (manifests
        /// and the pieces they list) from being collected until `copy` is done, and returns how many of `referred`
        /// are not held whole here.
        public let prepare: (_ blobs: Set<ChunkID>, _ referred: Set<ChunkID>) throws -> Int
        /// Hands each chunk `prepare` kept to `write`, once (sweeps run again meanwhile).
        public let copy: (_ write: (ChunkID, [UInt8]) throws -> Void) throws -> Void

        /// A source preparing with `prepare` and copying with `copy`.
        public init(
            prepare: @escaping (Set<ChunkID>, Set<ChunkID>) throws -> Int,
            copy: @escaping ((ChunkID, [UInt8]) throws -> Void) throws -> Void
        ) {
            self.prepare = prepare
            self.copy = copy
        }
    }

    /// Where a restore puts the chunks of a backup, before the restored database appears: `put` takes each checked
    /// chunk once, `finish` makes them the restored database's (right before its file appears), `discard` removes
    /// them when the restore fails.
    public struct Sink {
        /// Stores one chunk (the largest a chunk can be is `maximum` bytes: a larger one refuses the restore).
        public let put: (ChunkID, [UInt8]) throws -> Void
        /// Puts what was stored into place.
        public let finish: () throws -> Void
        /// Removes every chunk put (the restore failed).
        public let discard: () -> Void
        /// The largest chunk content.
        public let maximum: Int

        /// A sink storing with `put`, put in place by `finish`, undone by `discard`, taking chunks of up to `maximum`
        /// bytes.
        public init(
            maximum: Int, put: @escaping (ChunkID, [UInt8]) throws -> Void, finish: @escaping () throws -> Void,
            discard: @escaping () -> Void
        ) {
            self.maximum = maximum
            self.put = put
            self.finish = finish
            self.discard = discard
        }
    }

    /// Writes the chunks `source` prepared into the backup file at `target` (a table of its own, made only when there
    /// is a chunk).
    static func write(into target: DatabaseQueue, from source: Source) throws -> Report {
        var report = Report()
        try target.writeWithoutTransaction { db in
            var insert: Statement?
            var pending = 0
            try db.execute(sql: "BEGIN")
            do {
                try source.copy { id, content in
                    // The table is made with the first chunk: a backup without any stays restorable by earlier builds.
                    if insert == nil {
                        try db.execute(sql: createSQL)
                        insert = try db.makeStatement(sql: "INSERT INTO backup_chunks(id, sha256, content) VALUES (?, ?, ?)")
                    }
                    try insert!.execute(arguments: [Data(id.bytes), Data(SHA256.hash(data: content)), Data(content)])
                    report.chunks += 1
                    report.bytes += Int64(content.count)
                    pending += 1
                    if pending == perTransaction {
                        try db.execute(sql: "COMMIT")
                        try db.execute(sql: "BEGIN")
                        pending = 0
                    }
                }
                try db.execute(sql: "COMMIT")
            } catch {
                try? db.execute(sql: "ROLLBACK")
                throw error
            }
        }
        return report
    }

    /// The most chunks a backup may hold (at 1 MiB each, 16 TiB): a file with more is refused before any is read.
    static let maxChunks = 1 << 24

    /// Reads the chunks of backup file `db` (a backup made before chunks were kept has none) and hands each to `sink`
    /// once it is checked: a 32-byte id held by no other row, 1 to `sink.maximum` bytes of content, and the SHA-256
    /// stored with it. The ids, the count and every value's type and size are checked in SQL before a row is read,
    /// so no oversized value is ever loaded. Throws `backup_invalid` at the first bad row, before handing it on.
    static func read(_ db: Database, path: String, into sink: Sink) throws -> Report {
        var report = Report()
        guard try db.tableExists("backup_chunks") else { return report }
        func invalid(_ what: String) -> StoreError {
            StoreError.invalid("backup_invalid", "\(path) holds bad blob chunks (\(what)): refusing to restore it")
        }
        let badIDs = try Int.fetchOne(db, sql: "SELECT count(*) FROM backup_chunks WHERE typeof(id) != 'blob' OR length(id) != 32") ?? 0
        guard badIDs == 0 else { throw invalid("\(badIDs) without an id of 32 bytes") }
        let rows = try Int.fetchOne(db, sql: "SELECT count(*) FROM backup_chunks") ?? 0
        guard rows <= maxChunks else { throw invalid("\(rows) of them, over \(maxChunks)") }
        let distinct = try Int.fetchOne(db, sql: "SELECT count(DISTINCT id) FROM backup_chunks") ?? 0
        guard rows == distinct else { throw invalid("\(rows - distinct) ids held twice") }
        // A value of the wrong type or size reads as NULL: `length` and `typeof` of a column do not load it.
        let cursor = try Row.fetchCursor(
            db,
            sql: """
                SELECT id, CASE WHEN typeof(sha256) = 'blob' AND length(sha256) = 32 THEN sha256 END,
                    CASE WHEN typeof(content) = 'blob' AND length(content) BETWEEN 1 AND ? THEN content END
                FROM backup_chunks
                """, arguments: [sink.maximum])
        while let row = try cursor.next() {
            guard case .blob(let idBytes) = (row[0] as DatabaseValue).storage, let id = ChunkID(bytes: idBytes) else {
                throw invalid("an id of 32 bytes")
            }
            guard case .blob(let digest) = (row[1] as DatabaseValue).storage else { throw invalid("chunk \(id)'s digest") }
            guard case .blob(let content) = (row[2] as DatabaseValue).storage else {
                throw invalid("chunk \(id) is not 1 to \(sink.maximum) bytes")
            }
            guard Data(SHA256.hash(data: content)) == digest else { throw invalid("chunk \(id) does not match its digest") }
            try sink.put(id, Array(content))
            report.chunks += 1
            report.bytes += Int64(content.count)
        }
        return report
    }
}
