// Giving space back: the file-level steps compaction ends with (incremental vacuum, a rewrite of a fragmented file,
// emptying the write-ahead log, trimming the feed), and where a database's bytes are. Compaction itself is in
// Compaction.swift.

import Foundation
import GRDB

/// Returning free space to the file system once compaction removed rows.
extension BlazeDatabase {
    /// Rewrites the file when more than a quarter of it, and over 1 MiB, is unused space inside pages; returns the
    /// pages that gave back.
    func rewriteIfFragmented() throws -> Int {
        let (unused, total) = try read { db in
            let row = try Row.fetchOne(db, sql: "SELECT coalesce(sum(unused), 0), coalesce(sum(pgsize), 0) FROM dbstat")
            return (row?[0] as Int64? ?? 0, row?[1] as Int64? ?? 0)
        }
        guard total > 0, unused > 1 << 20, unused * 4 > total else { return 0 }
        let freed = try pool.writeWithoutTransaction { db in
            let before = try Int.fetchOne(db, sql: "PRAGMA page_count") ?? 0
            try db.execute(sql: "VACUUM")
            return max(0, before - (try Int.fetchOne(db, sql: "PRAGMA page_count") ?? 0))
        }
        try truncateLog()
        return freed
    }

    /// Copies the whole write-ahead log into the file and empties it, which is when the file shrinks to its pages
    /// (after `VACUUM` or incremental vacuum in WAL mode). The background checkpointer may be copying at that moment
    /// (SQLite then reports the checkpoint busy): retried for up to a second. Returns whether it completed.
    @discardableResult
    func truncateLog() throws -> Bool {
        for attempt in 0..<200 {
            let busy = try pool.writeWithoutTransaction { db in
                try Int.fetchOne(db, sql: "PRAGMA wal_checkpoint(TRUNCATE)") ?? 0
            }
            if busy == 0 { return true }
            if attempt < 199 { usleep(5_000) }
        }
        return false
    }

    /// Prunes the durable feed to exactly its retention (`FeedPruner.trim`).
    func trimFeed() throws { try feedPruner.trim(pool) }

    /// Returns free pages to the file system, `stepPages` per transaction.
    func vacuumFreePages(stepPages: Int) throws -> Int {
        var freed = 0
        while true {
            let n = try pool.writeWithoutTransaction { db -> Int in
                let free = try Int.fetchOne(db, sql: "PRAGMA freelist_count") ?? 0
                guard free > 0 else { return 0 }
                try db.execute(sql: "PRAGMA incremental_vacuum(\(min(free, stepPages)))")
                return free - (try Int.fetchOne(db, sql: "PRAGMA freelist_count") ?? 0)
            }
            freed += n
            if n <= 0 {
                if freed > 0 { try truncateLog() }
                return freed
            }
        }
    }
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
