import BlazeCRDT
import BlazeProtocol
import Crypto
import Foundation
import GRDB
import Synchronization

/// Replication: receiving other replicas' changes, version vectors, the state hash, conflicts.
extension BlazeDatabase {
    /// Applies changes from other replicas in any order, with duplicates; returns what happened to them.
    ///
    /// Changes whose dependencies are missing are parked until those arrive. A malformed change rejects the batch.
    public func receive(_ changes: [Change]) throws -> ReceiveReport {
        for change in changes { try validate(change) }
        return try connections.write { db in try self.receive(changes, in: db) }
    }

    /// `receive` inside the caller's write transaction (the changes are validated). `texts` holds, for changes that
    /// arrived as text (a sync entry's payload), that text: the op log keeps it as it came instead of encoding the
    /// change again (every reader of the op log parses what it reads).
    func receive(_ changes: [Change], in db: Database, texts: [ChangeID: [UInt8]] = [:]) throws -> ReceiveReport {
        let receiving = startReceiving(in: db, documents: changes.reduce(0) { $0 + $1.ops.count })
        try receiving.apply(changes, texts: texts)
        return try finish(receiving, db)
    }

    /// Starts applying received changes, in one or several parts, inside the caller's write transaction, sized for
    /// about `documents` documents (`Receiving`).
    func startReceiving(in db: Database, documents: Int) -> Receiving {
        let storage = makeStorage(db)
        storage.reserve(documents: documents)
        return Receiving(storage: storage, clock: clock.withLock { $0 }, now: Self.nowMilliseconds())
    }

    /// Writes what `receiving` applied (documents, versions, the feed) in its transaction `db`; returns what
    /// happened to the changes of all its parts.
    func finish(_ receiving: Receiving, _ db: Database) throws -> ReceiveReport {
        try receiving.storage.flush()
        let last = receiving.clock.last
        clock.withLock { _ = $0.observe(last, now: receiving.now) }
        var report = receiving.report
        // A later part may have applied what an earlier one parked: the count is the table's.
        if report.parked > 0 { report.parked = try receiving.storage.parkedCount() }
        try noteChanges(report.applied, db)
        try finishFeed(receiving.storage, db)
        return report
    }

    /// Checks what a remote change may contain before any of it is applied: the bounds of a real history
    /// (`ChangeBounds`), names (they end up in SQL and file paths) and, when its text is larger than a document may
    /// be (`size` bytes, if known), each operation's size.
    func validate(_ change: Change, size: Int? = nil) throws {
        try Self.validate(change, size: size, limits: limits)
    }

    /// `validate(_:size:)` under `limits`.
    static func validate(_ change: Change, size: Int?, limits: StoreLimits) throws {
        do throws(StoreError) {
            do {
                try ChangeBounds.check(change)
            } catch {
                throw StoreError.invalid("invalid_change", error.description)
            }
            let checkSizes = size.map { $0 > limits.maxDocumentBytes } ?? true
            for op in change.ops {
                if checkSizes {
                    var text: [UInt8] = []
                    Change.writeOp(op, to: &text)
                    guard text.count <= limits.maxDocumentBytes + 4096 else {
                        throw StoreError.invalid(
                            "invalid_change", "an operation of \(text.count) bytes is larger than a document may be")
                    }
                }
                switch op {
                case .doc(let d):
                    // Field edits apply to a live incarnation (odd causal length), deletes make an even one.
                    guard d.cl > 0, d.cl % 2 == 1 else {
                        throw StoreError.invalid("invalid_change", "a doc op needs an odd causal length, got \(d.cl)")
                    }
                    try Names.validateCollection(d.key.collection)
                    try Names.validateID(d.key.id)
                    let names = Array(d.set.keys) + d.unset + Array(d.incr.keys) + Array(d.add.keys) + Array(d.remove.keys)
                    for f in names { try Names.validateFieldPath(f) }
                case .delete(let key, let cl):
                    guard cl > 0, cl % 2 == 0 else {
                        throw StoreError.invalid("invalid_change", "a delete needs an even causal length, got \(cl)")
                    }
                    try Names.validateCollection(key.collection)
                    try Names.validateID(key.id)
                case .index(let name, let collection, _, _):
                    try Names.validateIndex(name)
                    try Names.validateCollection(collection)
                }
            }
        } catch {
            throw StoreError(
                .invalidArgument, kind: "invalid_change",
                "change \(change.seq) from \(change.origin) is invalid: \(error.message)")
        }
    }

    /// Per origin, the highest seq that parked changes depend on and this replica does not hold: entries that changes
    /// it received show to exist (each change's `deps`, sealed and signed by its author, is what that author held),
    /// which no peer has delivered yet. Empty when nothing is parked.
    public func missingDependencies() throws -> [NodeID: UInt64] {
        try read { db in
            guard try Bool.fetchOne(db, sql: "SELECT EXISTS(SELECT 1 FROM parked)") == true else { return [:] }
            let held = try self.makeStorage(db).versionVector()
            var out: [NodeID: UInt64] = [:]
            for row in try Row.fetchAll(
                db, sql: "SELECT j.key, max(j.value) FROM parked, json_each(parked.body, '$.d') AS j GROUP BY j.key")
            {
                guard let hex = row[0] as String?, let origin = NodeID(hex: hex), let seq = row[1] as Int64?, seq > 0,
                    UInt64(seq) > held[origin]
                else { continue }
                out[origin] = UInt64(seq)
            }
            return out
        }
    }

    /// This replica's version vector: the highest sequence applied per origin.
    public func versionVector() throws -> VersionVector {
        try read { db in try self.makeStorage(db).versionVector() }
    }

    /// Every change this replica has that a replica at `other` lacks, per origin in sequence order.
    public func changes(since other: VersionVector) throws -> [Change] {
        try read { db in
            var out: [Change] = []
            let origins = try String.fetchAll(db, sql: "SELECT origin FROM versions ORDER BY origin")
            for originHex in origins {
                guard let origin = NodeID(hex: originHex) else { continue }
                let bodies = try String.fetchAll(
                    db, sql: "SELECT body FROM changes WHERE origin = ? AND seq > ? ORDER BY seq",
                    arguments: [originHex, Int64(other[origin])])
                for b in bodies { out.append(try Change(json: try JSONParser(maxDepth: 10_000).parse(b))) }
            }
            return out
        }
    }

    /// SHA-256 (hex) over every live document in (collection, id) order: equal on two replicas exactly when they
    /// hold the same documents. Reads the whole database.
    public func stateHash() throws -> String {
        try read { db in try Self.stateHash(db) }
    }

    /// `stateHash()` as seen by the transaction of `db`.
    static func stateHash(_ db: Database) throws -> String {
        var hasher = SHA256()
        let rows = try Row.fetchCursor(db, sql: "SELECT collection, id, body FROM docs ORDER BY collection, id")
        while let row = try rows.next() {
            for (i, column) in [0, 1, 2].enumerated() {
                let text: String = row[column]
                hasher.update(data: Data(text.utf8))
                hasher.update(data: [i == 2 ? 0x0A : 0x00])
            }
        }
        return hasher.finalize().map { String(format: "%02x", $0) }.joined()
    }

    /// Fields whose concurrent writes lost, with the current value and the losing writes.
    public func conflicts(collection: String? = nil, id: String? = nil, limit: Int = 1000) throws -> [ConflictInfo] {
        if let collection { try Names.validateCollection(collection) }
        return try read { db in
            let rows = try Row.fetchAll(
                db,
                sql: "SELECT collection, id, state, body FROM docs WHERE conflicted = 1 "
                    + "AND (?1 IS NULL OR collection = ?1) AND (?2 IS NULL OR id = ?2) ORDER BY collection, id LIMIT ?3",
                arguments: [collection, id, limit])
            var out: [ConflictInfo] = []
            for row in rows {
                let state = try SQLStorage.decode(state: row[2], body: row[3], coding)
                for name in state.fields.keys.sorted(by: utf8Less) {
                    let f = state.fields[name]!
                    guard !f.losers.isEmpty else { continue }
                    out.append(ConflictInfo(collection: row[0], id: row[1], field: name, value: f.value, winner: f.winner, losers: f.losers))
                }
            }
            return out
        }
    }
}

/// A field whose concurrent writes lost: what clients see now, the winning write, and the losers.
public struct ConflictInfo: Sendable {
    /// Collection of the document.
    public var collection: String
    /// Document id.
    public var id: String
    /// Field name, or the dotted path of a nested field.
    public var field: String
    /// The field's current value (nil: absent).
    public var value: JSONValue?
    /// The winning LWW write.
    public var winner: FieldWrite?
    /// Concurrent writes that lost, oldest first.
    public var losers: [FieldWrite]
}

/// Received changes being applied in one write transaction, part by part (a sync group, batch by batch): the parts
/// share one storage, so a document several parts change is read, merged and written once, at `finish`.
final class Receiving {
    let storage: SQLStorage
    fileprivate(set) var clock: HybridClock
    let now: UInt64
    /// What happened to the changes of the parts so far (`parked` is above 0 when a part left changes parked, each
    /// part giving the table's count then; `finish` reads the count once more, after the last part).
    fileprivate(set) var report = ReceiveReport()

    init(storage: SQLStorage, clock: HybridClock, now: UInt64) {
        self.storage = storage
        self.clock = clock
        self.now = now
    }

    /// Applies one part: validated `changes`, with the texts they arrived as (`BlazeDatabase.receive(_:in:texts:)`).
    func apply(_ changes: [Change], texts: [ChangeID: [UInt8]]) throws {
        // Texts of changes an earlier part parked stay until those are applied.
        storage.receivedTexts.merge(texts) { _, new in new }
        let part = try Replica.receive(changes, into: storage, clock: &clock, now: now)
        report.applied += part.applied
        report.duplicates += part.duplicates
        report.parked += part.parked
        report.skewedClocks += part.skewedClocks
    }
}
