// Giving space back: the file-level steps compaction ends with (incremental vacuum, a rewrite of a fragmented file).
// Compaction itself is in Compactor.swift.

import Foundation
import GRDB

/// Returning free space to the file system once compaction removed rows.
extension Compactor {
    /// Rewrites the file when more than a quarter of it, and over 256 KiB, is unused space inside pages; returns the
    /// pages that gave back.
    func rewriteIfFragmented() throws -> Int {
        let (unused, total) = try database.read { db in
            let row = try Row.fetchOne(db, sql: "SELECT coalesce(sum(unused), 0), coalesce(sum(pgsize), 0) FROM dbstat")
            return (row?[0] as Int64? ?? 0, row?[1] as Int64? ?? 0)
        }
        guard total > 0, unused > 1 << 18, unused * 4 > total else { return 0 }
        let freed = try database.connections.writeWithoutTransaction { db in
            let before = try Int.fetchOne(db, sql: "PRAGMA page_count") ?? 0
            try database.connections.vacuum(db)
            return max(0, before - (try Int.fetchOne(db, sql: "PRAGMA page_count") ?? 0))
        }
        try database.truncateLog()
        return freed
    }

    /// Returns free pages to the file system, `stepPages` per transaction.
    func vacuumFreePages(stepPages: Int) throws -> Int {
        var freed = 0
        while true {
            let n = try database.connections.writeWithoutTransaction { db -> Int in
                let free = try Int.fetchOne(db, sql: "PRAGMA freelist_count") ?? 0
                guard free > 0 else { return 0 }
                try db.execute(sql: "PRAGMA incremental_vacuum(\(min(free, stepPages)))")
                return free - (try Int.fetchOne(db, sql: "PRAGMA freelist_count") ?? 0)
            }
            freed += n
            if n <= 0 {
                if freed > 0 { try database.truncateLog() }
                return freed
            }
        }
    }
}
