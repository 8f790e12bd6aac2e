import BlazeCRDT
import BlazeProtocol
import BlazeStore
import Foundation
import GRDB

/// STORAGE: a database's size after compaction against the same documents in a plain SQLite table, same run.
enum StorageWorkloads {
    /// (a) `inserts` inserts (100 per transaction), (b) `updates` single-document updates over `docCount` documents,
    /// (c) half of (a)'s documents deleted; each compacted, each against a plain table of the documents it holds.
    /// (d) and (e) are what an outside client does through the socket (`tx.commit` of 500 patches, `db.compact`, then
    /// `db.info`'s `sizeBytes`, which counts the file and its write-ahead log as they are), with the benchmark's
    /// documents and with small ones.
    static func run(dir: String, inserts: Int, docCount: Int, updates: Int, texts: [String], docs: [[String: JSONValue]]) throws
        -> [Result]
    {
        var results: [Result] = []
        let store = try Store(directory: dir + "/storage", node: NodeID(bytes: [UInt8](repeating: 0x5A, count: 16)))
        defer { store.closeAll() }

        // (a) inserts.
        let a = try store.create("inserts")
        for chunk in stride(from: 0, to: inserts, by: 100) {
            _ = try a.commit((chunk..<min(chunk + 100, inserts)).map { i in
                .insert(collection: "c", doc: docs[i % docs.count].merging(["_id": .string(String(format: "doc-%08d", i))]) { $1 })
            })
        }
        results += try measure(a, dir: dir, label: "S_a.inserts", what: "\(inserts) inserts, 100 per transaction")

        // (b) updates, one change each (the W6 pattern).
        let b = try store.create("updates")
        for chunk in stride(from: 0, to: docCount, by: 1000) {
            _ = try b.commit((chunk..<min(chunk + 1000, docCount)).map { i in
                .insert(collection: "c", doc: docs[i % docs.count].merging(["_id": .string(String(format: "doc-%08d", i))]) { $1 })
            })
        }
        for i in 0..<updates {
            let id = String(format: "doc-%08d", (i &* 7919) % docCount)
            _ = try b.apply(.patch(collection: "c", id: id, set: ["score": .double(Double(i)), "name": .string("n-\(i)")]))
        }
        results += try measure(b, dir: dir, label: "S_b.updates", what: "\(updates) single-document updates over \(docCount) documents")

        // (c) half of (a) deleted.
        let before = try a.checkpointedFileBytes()
        for chunk in stride(from: 0, to: inserts, by: 200) {
            _ = try a.commit(stride(from: chunk, to: min(chunk + 200, inserts), by: 2).map { i in
                .delete(collection: "c", id: String(format: "doc-%08d", i))
            })
        }
        var c = try measure(a, dir: dir, label: "S_c.deletes", what: "half of S_a's documents deleted")
        c[0].note = (c[0].note ?? "") + String(format: "; file %.1f MB before the deletes", Double(before) / 1e6)
        results += c
        _ = texts

        // (d) and (e): patches in transactions of 500, sized as db.info reports it.
        let small: (Int) -> [String: JSONValue] = { i in ["n": .int(Int64(i)), "name": .string("item \(i)")] }
        for (label, shape, doc) in [
            ("S_d.patchTx", "benchmark documents (6 fields, ~250 B)", { docs[$0 % docs.count] }),
            ("S_e.patchTxSmall", "small documents (2 fields, ~40 B)", small),
        ] as [(String, String, (Int) -> [String: JSONValue])] {
            let db = try store.create(String(label.prefix(3)))
            for chunk in stride(from: 0, to: docCount, by: 500) {
                _ = try db.commit((chunk..<min(chunk + 500, docCount)).map { i in
                    .insert(collection: "c", doc: doc(i).merging(["_id": .string(String(format: "doc-%08d", i))]) { $1 })
                })
            }
            for chunk in stride(from: 0, to: updates, by: 500) {
                _ = try db.commit((chunk..<min(chunk + 500, updates)).map { i in
                    .patch(
                        collection: "c", id: String(format: "doc-%08d", (i &* 7919) % docCount),
                        set: ["score": .double(Double(i)), "name": .string("n-\(i)")])
                })
            }
            results += try measure(
                db, dir: dir, label: label, asInfo: true,
                what: "\(docCount) \(shape), then \(updates) two-field patches in transactions of 500, as db.info counts it")
        }
        return results
    }

    /// Compacts `db` as `db.compact` does and reports its file size before and after, against a plain table of its
    /// documents. The size is the file after a checkpoint, or with `asInfo` what `db.info` reports right after
    /// `db.compact` (the file and its write-ahead log as they are).
    static func measure(_ db: BlazeDatabase, dir: String, label: String, asInfo: Bool = false, what: String) throws -> [Result] {
        let uncompacted = asInfo ? try db.summary().sizeBytes : try db.checkpointedFileBytes()
        let report = try db.compact(stable: try db.versionVector(), defragment: true)
        let bytes = asInfo ? try db.summary().sizeBytes : try db.checkpointedFileBytes()
        let tables = try db.bytesByTable().sorted { $0.value > $1.value }.prefix(4)
            .map { String(format: "%@ %.1f", $0.key, Double($0.value) / 1e6) }.joined(separator: ", ")
        // The same documents, as they are now, in a plain table (1,000 rows per transaction).
        let rows = try db.read { d in try Row.fetchAll(d, sql: "SELECT collection, id, body FROM docs ORDER BY rowid") }
        let json = rows.reduce(0) { $0 + ($1[2] as String).utf8.count }
        let name = "\(label)-plain-\(UUID().uuidString.prefix(8))"
        let queue = try Baselines.rawDatabase(dir, name)
        for chunk in stride(from: 0, to: rows.count, by: 1000) {
            try queue.write { d in
                let st = try d.cachedStatement(sql: "INSERT INTO t(collection, id, body) VALUES (?, ?, ?)")
                for row in rows[chunk..<min(chunk + 1000, rows.count)] {
                    try st.execute(arguments: [row[0] as String, row[1] as String, row[2] as String])
                }
            }
        }
        try queue.writeWithoutTransaction { try $0.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)") }
        try queue.close()
        let plain = (try FileManager.default.attributesOfItem(atPath: "\(dir)/\(name).sqlite")[.size] as? NSNumber)?.int64Value ?? 0
        let perDoc = rows.isEmpty ? 0 : Double(bytes) / Double(rows.count)
        return [
            Result(
                name: label, unit: "MB", samples: [Double(bytes) / 1e6], better: "lower", baseline: label + ".plain",
                target: "≤ 1.5×",
                note: String(
                    format: "%@; %d docs, %.0f B/doc, %.2f B per JSON byte; %.1f MB before compaction (%d rows and %d pages removed in %lld ms); MB by table: %@",
                    what, rows.count, perDoc, json == 0 ? 0 : Double(bytes) / Double(json), Double(uncompacted) / 1e6,
                    report.rows, report.pagesFreed, report.durationMs, tables)),
            Result(
                name: label + ".plain", unit: "MB", samples: [Double(plain) / 1e6], better: "lower",
                note: "the same documents in a plain SQLite table (collection, id, body), same run"),
        ]
    }
}
