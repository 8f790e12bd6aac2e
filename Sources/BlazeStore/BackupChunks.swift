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

    /// Hands a backup the chunks of `blobs` held here (manifests and the pieces they list, each once) through `write`,
    /// and returns how many of `blobs` are not held whole. Chunk files never change once written, and no sweep runs
    /// while a backup holds the database's sweep lock, so they can be read after the snapshot ended.
    public typealias Source = (_ blobs: Set<ChunkID>, _ write: (ChunkID, [UInt8]) throws -> Void) throws -> Int

    /// Where a restore puts the chunks of a backup, before the restored database appears: `put` takes each checked
    /// chunk once, `discard` removes what was put when the restore fails.
    public struct Sink {
        /// Stores one chunk (the largest a chunk can be is `maximum` bytes: a larger one refuses the restore).
        public let put: (ChunkID, [UInt8]) throws -> Void
        /// Removes every chunk put (the restore failed).
        public let discard: () -> Void
        /// The largest chunk content.
        public let maximum: Int

        /// A sink storing with `put`, undone by `discard`, taking chunks of up to `maximum` bytes.
        public init(maximum: Int, put: @escaping (ChunkID, [UInt8]) throws -> Void, discard: @escaping () -> Void) {
            self.maximum = maximum
            self.put = put
            self.discard = discard
        }
    }

    /// Writes the chunks `source` gives for `blobs` into the backup file at `target` (a table of its own).
    static func write(_ blobs: Set<ChunkID>, into target: DatabaseQueue, from source: Source) throws -> Report {
        var report = Report()
        guard !blobs.isEmpty else { return report }
        try target.writeWithoutTransaction { db in
            try db.execute(sql: createSQL)
            let insert = try db.makeStatement(sql: "INSERT INTO backup_chunks(id, sha256, content) VALUES (?, ?, ?)")
            var pending = 0
            try db.execute(sql: "BEGIN")
            do {
                report.blobsNotHeld = try source(blobs) { id, content in
                    try insert.execute(arguments: [Data(id.bytes), Data(SHA256.hash(data: content)), Data(content)])
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

    /// Reads the chunks of backup file `db` (a backup made before chunks were kept has none) and hands each to `sink`
    /// once it is checked: a 32-byte id seen once, 1 to `sink.maximum` bytes of content, and the SHA-256 stored with
    /// it. Throws `backup_invalid` at the first bad row, before handing it on.
    static func read(_ db: Database, path: String, into sink: Sink) throws -> Report {
        var report = Report()
        guard try db.tableExists("backup_chunks") else { return report }
        func invalid(_ what: String) -> StoreError {
            StoreError.invalid("backup_invalid", "\(path) holds a bad blob chunk (\(what)): refusing to restore it")
        }
        var seen = Set<ChunkID>()
        let rows = try Row.fetchCursor(db, sql: "SELECT id, sha256, content, length(content) FROM backup_chunks")
        while let row = try rows.next() {
            // Types and sizes before anything is copied out of the row.
            guard case .blob(let idBytes) = (row[0] as DatabaseValue).storage, let id = ChunkID(bytes: idBytes) else { throw invalid("an id of 32 bytes") }
            guard case .blob(let digest) = (row[1] as DatabaseValue).storage, digest.count == SHA256.byteCount else { throw invalid("chunk \(id)'s digest") }
            guard let length = row[3] as Int?, length >= 1, length <= sink.maximum else {
                throw invalid("chunk \(id) is not 1 to \(sink.maximum) bytes")
            }
            guard case .blob(let content) = (row[2] as DatabaseValue).storage else { throw invalid("chunk \(id)'s content") }
            guard seen.insert(id).inserted else { throw invalid("chunk \(id) twice") }
            guard Data(SHA256.hash(data: content)) == digest else { throw invalid("chunk \(id) does not match its digest") }
            try sink.put(id, Array(content))
            report.chunks += 1
            report.bytes += Int64(content.count)
        }
        return report
    }
}
