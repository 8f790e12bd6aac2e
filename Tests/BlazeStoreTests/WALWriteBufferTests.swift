import Foundation
import GRDB
import Testing

@testable import BlazeStore

/// The WAL write buffer: what a buffered connection commits is in the file, for other connections and after reopen.
@Suite struct WALWriteBufferTests {
    /// A WAL database in a fresh directory whose writer keeps `synchronous = FULL`, a tiny page cache (so a large
    /// transaction spills pages to the log and writes some of them again) and, when `buffered`, buffering on.
    func open(_ dir: String, buffered: Bool) throws -> DatabasePool {
        WALWriteBuffer.install()
        let pool = try DatabasePool(path: dir + "/t.db")
        try pool.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA synchronous = FULL; PRAGMA cache_size = 16")
            try db.execute(sql: "CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v INTEGER NOT NULL, pad TEXT NOT NULL)")
        }
        if buffered {
            let enabled = pool.writeWithoutTransaction { db in WALWriteBuffer.enable(on: db.sqliteConnection!) }
            #expect(enabled)
        }
        return pool
    }

    @Test func bufferedCommitsAreInTheFileForOtherConnectionsAndAfterReopen() throws {
        let dir = NSTemporaryDirectory() + "walbuf-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let before = WALWriteBuffer.gathered.load(ordering: .relaxed)
        var expected: [Int64: Int64] = [:]
        do {
            let writer = try open(dir, buffered: true)
            // Another process's view: a connection of its own, not the pool's readers.
            let reader = try DatabaseQueue(path: dir + "/t.db")
            let pad = String(repeating: "p", count: 900)
            for i in Int64(1)...200 {
                try writer.write { db in try db.execute(sql: "INSERT INTO t(id, v, pad) VALUES (?, ?, ?)", arguments: [i, i, pad]) }
                expected[i] = i
                let seen = try reader.read { db in try Int64.fetchOne(db, sql: "SELECT sum(v) FROM t") }
                #expect(seen == expected.values.reduce(0, +), "commit \(i)")
            }
            // Larger than the buffer, and rewriting pages it already wrote to the log (the cache is 16 pages).
            try writer.write { db in
                for i in Int64(201)...4200 {
                    try db.execute(sql: "INSERT INTO t(id, v, pad) VALUES (?, ?, ?)", arguments: [i, i, pad])
                }
                for round in Int64(1)...2 {
                    for i in stride(from: Int64(1), through: 4200, by: 7) {
                        try db.execute(sql: "UPDATE t SET v = ? WHERE id = ?", arguments: [i * 10 + round, i])
                    }
                }
            }
            for i in Int64(201)...4200 { expected[i] = i }
            for i in stride(from: Int64(1), through: 4200, by: 7) { expected[i] = i * 10 + 2 }
            let rows = try reader.read { db in try Row.fetchAll(db, sql: "SELECT id, v FROM t ORDER BY id") }
            #expect(rows.count == 4200)
            #expect(rows.allSatisfy { expected[$0[0] as Int64] == $0[1] as Int64 })
            try reader.close()
            try writer.close()
        }
        #expect(WALWriteBuffer.gathered.load(ordering: .relaxed) > before)
        let reopened = try DatabaseQueue(path: dir + "/t.db")
        #expect(try reopened.read { db in try String.fetchOne(db, sql: "PRAGMA integrity_check") } == "ok")
        let rows = try reopened.read { db in try Row.fetchAll(db, sql: "SELECT id, v FROM t ORDER BY id") }
        #expect(rows.count == 4200)
        #expect(rows.allSatisfy { expected[$0[0] as Int64] == $0[1] as Int64 })
    }

    @Test func onlyAWALFileOfThisVFSCanBuffer() throws {
        let dir = NSTemporaryDirectory() + "walbuf-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        WALWriteBuffer.install()
        // A rollback-journal database has no WAL file to buffer.
        let queue = try DatabaseQueue(path: dir + "/j.db")
        try queue.write { db in try db.execute(sql: "CREATE TABLE t(x)") }
        #expect(queue.inDatabase { db in WALWriteBuffer.enable(on: db.sqliteConnection!) } == false)
    }
}
