import BlazeCRDT
import BlazeProtocol
import Foundation
import GRDB

/// Storing received batches: checking that they continue the log held here, refusing forks, applying their changes.
extension SyncLogStore {
    /// Stores verified entries of `origin` with the head that covers them and applies the changes that are new, in
    /// one transaction: the first entry must continue the log held here (`firstPrev` is the hash it links to), an
    /// entry held already must be the same (else `SyncLogConflict.fork`), and a quarantined origin stores nothing.
    public func recordEntries(
        origin: NodeID, _ entries: [SyncLogEntry], firstPrev: [UInt8], changes: [Change], texts: [[UInt8]]? = nil,
        head: (seq: UInt64, bytes: [UInt8])
    ) throws -> BatchOutcome {
        let batch = ReceivedBatch(origin: origin, entries: entries, firstPrev: firstPrev, changes: changes, texts: texts, head: head)
        return try database.connections.write { db in try record([batch], in: db)[0] }
    }

    /// Stores several batches as `recordEntries` does, in one transaction: a commit (with its fsync and the pages its
    /// batches share) per group rather than per batch. Nil, with nothing stored, when any batch is refused for a
    /// conflict (`SyncLogConflict`): the caller then stores them one by one, so each gets its own verdict. Once
    /// `yieldAfter` batches are stored it may stop early for another write, and once they hold `maxDocuments`
    /// documents it stops (`record`): the outcomes then cover the first batches only, and the caller stores the rest
    /// later.
    public func recordEntries(
        group: [ReceivedBatch], yieldAfter: Int = .max, maxDocuments: Int = maxGroupDocuments
    ) throws -> [BatchOutcome]? {
        do {
            return try database.connections.write { db in
                try record(group, in: db, yieldAfter: yieldAfter, maxDocuments: maxDocuments)
            }
        } catch is SyncLogConflict {
            return nil
        }
    }

    /// The documents a transaction storing a group of batches may hold before it takes no further batch (checked
    /// between batches, so one batch may take it past this): each is kept in memory until the commit, so this keeps a
    /// group whose changes touch many documents near a smaller group's memory (and such a group gains little from
    /// more batches, which pay when changes touch the same documents again).
    public static let maxGroupDocuments = 16_384

    /// `recordEntries` of `batches`, in order, inside the caller's write transaction. Their new changes are applied
    /// batch by batch into one storage and written together, so a document several of them change is read and
    /// written once; the outcome of the last batch carries what applying them did. It stops early, the outcomes then
    /// covering only the batches stored: once `yieldAfter` batches are stored, while another write waits for the
    /// database (`DatabaseConnections.writesWaiting`), so that write waits for a short transaction; and once the
    /// batches stored hold `maxDocuments` documents.
    func record(
        _ batches: [ReceivedBatch], in db: Database, yieldAfter: Int = .max, maxDocuments: Int = maxGroupDocuments
    ) throws -> [BatchOutcome] {
        var outcomes: [BatchOutcome] = []
        let changes = batches.reduce(0) { $0 + $1.changes.count }
        let receiving = database.startReceiving(in: db, documents: min(changes, maxDocuments))
        var applying = false
        for batch in batches {
            if outcomes.count >= yieldAfter, database.connections.writesWaiting.load(ordering: .relaxed) > 0 { break }
            if !outcomes.isEmpty, receiving.storage.documentsHeld >= maxDocuments { break }
            var fresh: [Change] = []
            var freshTexts: [ChangeID: [UInt8]] = [:]
            fresh.reserveCapacity(batch.changes.count)
            freshTexts.reserveCapacity(batch.changes.count)
            outcomes.append(try store(batch, in: db, fresh: &fresh, freshTexts: &freshTexts))
            guard !fresh.isEmpty else { continue }
            try receiving.apply(fresh, texts: freshTexts)
            applying = true
        }
        guard applying else { return outcomes }
        let report = try database.finish(receiving, db)
        outcomes[outcomes.count - 1].report = report
        // Changes waiting for dependencies are bounded per origin: past the limit the batch is refused whole (the
        // transaction rolls back), and comes again once what it waits for has arrived.
        if report.parked > 0 {
            let count = try db.cachedStatement(sql: "SELECT count(*) FROM parked WHERE origin = ?")
            for origin in Set(batches.prefix(outcomes.count).map(\.origin)) {
                let parked = try Int.fetchOne(count, arguments: [origin.hex]) ?? 0
                if parked > database.limits.maxParkedPerOrigin { throw SyncLogConflict.tooManyParked }
            }
        }
        return outcomes
    }

    /// Checks that `batch` continues the log held here and stores its entries and head; adds the changes of the
    /// entries not held before to `fresh` (their texts to `freshTexts`).
    func store(
        _ batch: ReceivedBatch, in db: Database, fresh: inout [Change], freshTexts: inout [ChangeID: [UInt8]]
    ) throws -> BatchOutcome {
        let (origin, entries, firstPrev, changes, texts, head) =
            (batch.origin, batch.entries, batch.firstPrev, batch.changes, batch.texts, batch.head)
        precondition(entries.count == changes.count && !entries.isEmpty, "one change per entry")
        precondition(texts.map { $0.count == changes.count } ?? true, "one text per change")
        let o = Data(origin.bytes)
        let firstSeq = entries[0].seq
        var outcome = BatchOutcome()
        guard try !Self.isQuarantined(o, db) else { throw SyncLogConflict.quarantined }
        let held = try db.cachedStatement(sql: "SELECT hash FROM sync_entries WHERE origin = ? AND seq = ?")
        // Statements per batch are cached: preparing them again cost about as much as storing a few entries.
        let pruned = try Row.fetchOne(
            db.cachedStatement(sql: "SELECT seq, hash FROM sync_pruned WHERE origin = ?"), arguments: [o])
            .map { PrunedHead(seq: UInt64(max(0, $0[0] as Int64)), hash: Array($0[1] as Data)) }
        if let pruned, pruned.seq >= firstSeq - 1 {
            // Entries up to `pruned.seq` are no longer held: the batch must agree with the chain head kept.
            let hashAtPruned = pruned.seq == firstSeq - 1 ? firstPrev : entries.first { $0.seq == pruned.seq }?.hash
            if let hashAtPruned, pruned.hash != PrunedHead.chainStart, hashAtPruned != pruned.hash {
                throw pruned.seq == firstSeq - 1 ? SyncLogConflict.brokenChain : SyncLogConflict.fork
            }
        } else if firstSeq > 1 {
            // A batch must continue the log held here: no gap, and linked to the entry before it.
            guard let before = try Data.fetchOne(held, arguments: [o, Int64(firstSeq - 1)]), Array(before) == firstPrev
            else { throw SyncLogConflict.brokenChain }
        }
        // One statement per entry: the insert is ignored when the entry is held already, and only then is the
        // held one read (the same entry, or evidence of a fork).
        let insert = try RawStatement(
            db, "INSERT INTO sync_entries(origin, seq, hash, bytes) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING")
        let originBlob = Blob(bytes: origin.bytes)
        for (i, (entry, change)) in zip(entries, changes).enumerated() {
            if let pruned, entry.seq <= pruned.seq {
                // Held once and pruned since: its change is applied.
                outcome.duplicates += 1
                continue
            }
            if try insert.run(originBlob, Int64(entry.seq), Blob(bytes: entry.hash), Blob(bytes: entry.bytes)) == 0 {
                guard let existing = try Data.fetchOne(held, arguments: [o, Int64(entry.seq)]),
                    Array(existing) == entry.hash
                else { throw SyncLogConflict.fork }
                outcome.duplicates += 1
                continue
            }
            outcome.stored += 1
            fresh.append(change)
            if let texts { freshTexts[ChangeID(change)] = texts[i] }
        }
        try db.cachedStatement(sql: "INSERT OR IGNORE INTO sync_heads(origin, seq, head) VALUES (?, ?, ?)")
            .execute(arguments: [o, Int64(head.seq), Data(head.bytes)])
        return outcome
    }

    static func isQuarantined(_ origin: Data, _ db: Database) throws -> Bool {
        try Bool.fetchOne(
            db.cachedStatement(sql: "SELECT EXISTS(SELECT 1 FROM sync_forks WHERE origin = ?)"), arguments: [origin]) ?? false
    }
}
