import BlazeProtocol
import GRDB

/// What a bulk write does to each matching document.
public enum BulkEdit: Sendable, Equatable {
    /// Patches it, with the members of `WriteOp.patch`.
    case patch(
        set: [String: JSONValue] = [:], unset: [String] = [], incr: [String: JSONValue] = [:],
        add: [String: [JSONValue]] = [:], remove: [String: [JSONValue]] = [:])
    /// Deletes it.
    case delete
}

/// Writes by filter: `query.update` and `query.delete`.
extension BlazeDatabase {
    /// Applies `edit` to every document of `collection` matching `filter` (at most `limit` of them, in `_id` order) in
    /// one transaction, which is one replicated change; returns the ids written, in `_id` order.
    ///
    /// Without a limit, more matches than a transaction may hold (`maxTransactionOps`) is `too_many_matches` and
    /// nothing is written. A document the edit cannot apply to fails the whole call (`details.id` names it).
    public func write(matching filter: Filter, in collection: String, limit: Int?, edit: BulkEdit) throws -> [String] {
        try Names.validateCollection(collection)
        let maxOps = limits.maxTransactionOps
        if let limit, limit < 1 || limit > maxOps {
            throw StoreError(
                .limitExceeded, kind: "limit_out_of_range", "limit must be between 1 and \(maxOps), got \(limit)")
        }
        return try write { tx in
            if case .patch(let set, let unset, let incr, let add, let remove) = edit {
                // Checked once, so a filter that matches nothing still refuses a bad patch.
                try tx.validatePatch(set: set, unset: unset, incr: incr, add: add, remove: remove)
            }
            let cap = limit ?? maxOps + 1
            let compiled = QueryCompiler.find(FindQuery(collection: collection, filter: filter, limit: cap), limit: cap)
            // The ids first, in full: the writes below change the rows the query reads.
            var ids: [String] = []
            let rows = try Row.fetchCursor(tx.db, sql: compiled.sql, arguments: compiled.arguments)
            while let row = try rows.next() { ids.append(row[0]) }
            if limit == nil && ids.count > maxOps {
                throw StoreError(
                    .limitExceeded, kind: "too_many_matches",
                    "the filter matches more than \(maxOps) documents, the most one transaction may write; narrow it or pass a limit",
                    details: ["limit": .int(Int64(maxOps))])
            }
            tx.storage.reserve(documents: ids.count)
            for (i, id) in ids.enumerated() {
                let op: WriteOp
                switch edit {
                case .patch(let set, let unset, let incr, let add, let remove):
                    op = .patch(collection: collection, id: id, set: set, unset: unset, incr: incr, add: add, remove: remove)
                case .delete:
                    op = .delete(collection: collection, id: id)
                }
                do {
                    _ = try tx.apply(op)
                } catch var error as StoreError {
                    error.details["id"] = .string(id)
                    error.details["op"] = .int(Int64(i))
                    error.message = "document \(Names.quoted(id)): " + error.message
                    throw error
                }
            }
            return ids
        }
    }
}

/// What `collection.drop` did.
public struct DropReport: Sendable, Equatable {
    /// Documents deleted.
    public var deleted: Int
    /// Indexes dropped.
    public var indexes: Int
    /// Replicated changes written (one per `maxTransactionOps` deletes; all in one local transaction).
    public var changes: Int
}

extension BlazeDatabase {
    /// Drops a collection: deletes every document it holds and drops its indexes, replicated as ordinary deletes and
    /// index drops (Protocol/SYNC.md, "Collections"), so a document another device inserts concurrently survives.
    ///
    /// One local transaction; the deletes go in changes of at most `maxTransactionOps` each (the first also drops
    /// the indexes), which other devices apply one by one. `collection_not_found` when the collection holds
    /// neither documents nor indexes.
    public func dropCollection(_ collection: String) throws -> DropReport {
        try Names.validateCollection(collection)
        return try connections.writeWithoutTransaction { db in
            var afterCommit: [@Sendable () -> Void] = []
            var report = DropReport(deleted: 0, indexes: 0, changes: 0)
            try Self.inWriteTransaction(db, commitTimer: metrics?.commitDuration) {
                let ids = try String.fetchAll(
                    db, sql: "SELECT id FROM docs WHERE collection = ? ORDER BY id", arguments: [collection])
                // Those kept past the limits (valid names only: an invalid one was never built) first, so that dropping
                // the built ones builds none of them, then the built ones.
                let indexes = try SQLStorage.keptDefinitions(collection: collection, db).filter { (try? Names.validateIndex($0)) != nil }
                    + String.fetchAll(db, sql: "SELECT name FROM indexes WHERE collection = ? ORDER BY name", arguments: [collection])
                guard !ids.isEmpty || !indexes.isEmpty else {
                    throw StoreError(
                        .notFound, kind: "collection_not_found",
                        "collection \(Names.quoted(collection)) holds no documents or indexes")
                }
                var chain = try ChangeChain(self, db)
                let chunk = limits.maxTransactionOps
                var start = 0
                repeat {
                    let part = ids[start..<min(ids.count, start + chunk)]
                    let storage = chain.nextStorage(self, db)
                    try localChange(storage) { tx in
                        if start == 0 { for name in indexes { try tx.dropIndex(name: name) } }
                        tx.storage.reserve(documents: part.count)
                        for id in part { _ = try tx.apply(.delete(collection: collection, id: id)) }
                    }
                    try chain.keep(storage)
                    report.changes += 1
                    start += chunk
                } while start < ids.count
                afterCommit = chain.afterCommit
                report.deleted = ids.count
                report.indexes = indexes.count
            }
            for action in afterCommit { action() }
            return report
        }
    }
}
