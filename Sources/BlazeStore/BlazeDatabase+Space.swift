// Emptying the write-ahead log, trimming the feed, and where a database's bytes are. Compaction (and the vacuum it
// ends with) is `Compactor`'s: Compactor.swift, Compactor+Space.swift.

import Foundation
import GRDB

/// The write-ahead log emptied and the feed trimmed, as compaction and admin calls need.
extension BlazeDatabase {
    /// Copies the whole write-ahead log into the file and empties it, which is when the file shrinks to its pages
    /// (after `VACUUM` or incremental vacuum in WAL mode). The background checkpointer may be copying at that moment
    /// (SQLite then reports the checkpoint busy): retried for up to a second. Returns whether it completed.
    ///
    /// A read connection nobody is using may still hold the snapshot of its last read (`ReadConnections`): each
    /// attempt ends those first, as the background checkpointer does. Otherwise the checkpoint waits for that idle
    /// snapshot through the writer's whole busy timeout on every attempt (a `db.compact` right after a `doc.get`
    /// hung for minutes). A read running at that moment can still make an attempt wait up to that timeout.
    @discardableResult
    func truncateLog() throws -> Bool {
        for attempt in 0..<200 {
            let busy = try connections.writeWithoutTransaction { db in
                // Right before the checkpoint: a read that began since ended its snapshot only if it is done.
                connections.readers.releaseIdle()
                return try Int.fetchOne(db, sql: "PRAGMA wal_checkpoint(TRUNCATE)") ?? 0
            }
            if busy == 0 { return true }
            if attempt < 199 { usleep(5_000) }
        }
        return false
    }

    /// Prunes the durable feed to exactly its retention (`FeedPruner.trim`).
    func trimFeed() throws { try feedPruner.trim(connections) }
}

/// Where a database's bytes are.
extension BlazeDatabase {
    /// Bytes of each table, its indexes included, as SQLite's `dbstat` counts pages (reads every page: an admin
    /// call, not a hot path).
    public func bytesByTable() throws -> [String: Int64] {
        try read { db in
            var out: [String: Int64] = [:]
            for row in try Row.fetchAll(
                db,
                sql: """
                    SELECT coalesce(m.tbl_name, s.name), sum(s.pgsize) FROM dbstat AS s
                    LEFT JOIN sqlite_master AS m ON m.name = s.name GROUP BY 1
                    """)
            {
                out[row[0]] = row[1]
            }
            return out
        }
    }

    /// Checkpoints the write-ahead log into the file and truncates it; returns the file's size in bytes.
    public func checkpointedFileBytes() throws -> Int64 {
        try truncateLog()
        let attrs = try FileManager.default.attributesOfItem(atPath: path)
        return (attrs[.size] as? NSNumber)?.int64Value ?? 0
    }
}
