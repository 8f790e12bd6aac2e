import BlazeCRDT
import BlazeProtocol
import BlazeStore
import BlazeVector

/// Queries, indexes and conflicts.
extension Methods {
    /// A query from the members `query.find` and `query.explain` share.
    static func findQuery(
        collection: String, where filter: [String: JSONValue]?, sort: JSONValue?, limit: Int?, cursor: String? = nil,
        fields: [String]? = nil, ctx: RequestContext
    ) throws -> FindQuery {
        var q = FindQuery(
            collection: collection, filter: try Filter.parse(filter.map(JSONValue.object)), sort: try SortKey.parse(sort),
            limit: limit ?? ctx.config.storeLimits.defaultQueryLimit, fields: try projection(fields))
        if let cursor {
            q.cursor = try QueryCursor.decode(cursor, for: q)
        }
        return q
    }

    /// `query.find` splices the stored documents' texts into its response (no parse, no re-encoding) unless `fields`
    /// asks for a projection.
    static let queryFind = MethodHandler(text: RPC.QueryFind.self, inline: false, budgeted: true) { p, ctx in
        let q = try findQuery(
            collection: p.collection, where: p.where, sort: p.sort, limit: p.limit, cursor: p.cursor, fields: p.fields, ctx: ctx)
        if try expandsVectors(p.vectors) {
            let r = try ctx.database(p.db).find(q, budget: ctx.readBudget)
            return JSONValue.object([
                "docs": .array(r.docs.map(VectorValue.expanded)), "cursor": r.cursor.map(JSONValue.string) ?? .null,
            ]).jsonBytes
        }
        return try ctx.database(p.db).findResultText(q, budget: ctx.readBudget)
    }

    static let queryCount = MethodHandler(RPC.QueryCount.self, inline: false, budgeted: true) { p, ctx in
        let filter = try Filter.parse(p.where.map(JSONValue.object))
        return .init(count: try ctx.database(p.db).count(collection: p.collection, filter: filter, budget: ctx.readBudget))
    }

    static let queryExplain = MethodHandler(RPC.QueryExplain.self) { p, ctx in
        let q = try findQuery(collection: p.collection, where: p.where, sort: p.sort, limit: p.limit, ctx: ctx)
        let r = try ctx.database(p.db).explain(q)
        return .init(sql: r.sql, plan: r.plan, indexes: r.indexes)
    }

    static let queryAggregate = MethodHandler(RPC.QueryAggregate.self) { p, ctx in
        var aggregates: [(name: String, aggregate: Aggregate)] = []
        for name in p.aggregates.keys.sorted(by: utf8Less) {
            aggregates.append((name, try Aggregate.parse(name, .object(p.aggregates[name]!))))
        }
        let q = AggregateQuery(
            collection: p.collection, filter: try Filter.parse(p.where.map(JSONValue.object)),
            group: try (p.group ?? []).map { (f: String) throws(StoreError) -> FieldPath in try FieldPath(f) },
            aggregates: aggregates, limit: p.limit ?? 1000)
        let r = try ctx.database(p.db).aggregate(q)
        return .init(
            groups: r.groups.map { .init(key: .object($0.key), values: .object($0.values)) }, truncated: r.truncated)
    }

    // MARK: writes by filter

    static let queryUpdate = MethodHandler(RPC.QueryUpdate.self) { p, ctx in
        let edit = BulkEdit.patch(
            set: p.set ?? [:], unset: p.unset ?? [], incr: p.incr ?? [:], add: p.add ?? [:], remove: p.remove ?? [:])
        let ids = try ctx.writableDatabase(p.db).write(
            matching: try Filter.parse(.object(p.where)), in: p.collection, limit: p.limit, edit: edit)
        return .init(count: ids.count, ids: p.returnIds == true ? ids : nil)
    }

    static let queryDelete = MethodHandler(RPC.QueryDelete.self) { p, ctx in
        let ids = try ctx.writableDatabase(p.db).write(
            matching: try Filter.parse(.object(p.where)), in: p.collection, limit: p.limit, edit: .delete)
        return .init(count: ids.count, ids: p.returnIds == true ? ids : nil)
    }

    // MARK: indexes

    static func indexInfo(_ info: IndexInfo) -> RPCSchema.IndexInfo {
        .init(
            name: info.name, collection: info.collection, fields: info.fields,
            vector: info.vector.flatMap { v in
                RPCSchema.VectorIndexSpec.Metric(rawValue: v.metric).map { .init(dimensions: v.dimensions, metric: $0) }
            }, built: info.built ? nil : false)
    }

    static let indexCreate = MethodHandler(RPC.IndexCreate.self) { p, ctx in
        let vector = p.vector.map { IndexVector(dimensions: $0.dimensions, metric: $0.metric.rawValue) }
        let info = try ctx.database(p.db).write { tx in
            try tx.createIndex(collection: p.collection, fields: p.fields, name: p.name, vector: vector)
        }
        return indexInfo(info)
    }

    static let indexDrop = MethodHandler(RPC.IndexDrop.self) { p, ctx in
        try ctx.database(p.db).write { tx in try tx.dropIndex(name: p.name) }
        return .init(name: p.name)
    }

    static let indexList = MethodHandler(RPC.IndexList.self, inline: true) { p, ctx in
        .init(indexes: try ctx.database(p.db).indexes(collection: p.collection).map(indexInfo))
    }

    // MARK: conflicts

    static func write(_ w: FieldWrite) -> RPCSchema.Write {
        .init(
            value: w.value, unset: w.value == nil, origin: w.stamp.dot.origin.hex, seq: Int(w.stamp.dot.seq),
            hlc: Int(Int64(bitPattern: w.stamp.hlc.raw)), time: Int(w.stamp.hlc.milliseconds))
    }

    static let conflictList = MethodHandler(RPC.ConflictList.self, inline: true) { p, ctx in
        let limit = p.limit ?? 1000
        guard limit >= 1 && limit <= 10_000 else {
            throw RPCError(code: RPCErrorCode.limitExceeded, kind: "limit_out_of_range", message: "limit must be 1...10000")
        }
        let list = try ctx.database(p.db).conflicts(collection: p.collection, id: p.id, limit: limit)
        return .init(
            conflicts: list.map { c in
                .init(
                    collection: c.collection, id: c.id, field: c.field, value: c.value, present: c.value != nil,
                    winner: c.winner.map(write), losers: c.losers.map(write))
            })
    }

    static let conflictResolve = MethodHandler(RPC.ConflictResolve.self) { p, ctx in
        let db = try ctx.writableDatabase(p.db)
        let existing = try db.conflicts(collection: p.collection, id: p.id).first { $0.field == p.field }
        guard let conflict = existing else {
            throw RPCError(
                code: RPCErrorCode.notFound, kind: "conflict_not_found",
                message: "field \"\(p.field)\" of \(p.collection)/\(p.id) has no conflict")
        }
        let value = p.value ?? conflict.value
        let op: WriteOp =
            value.map { .patch(collection: p.collection, id: p.id, set: [p.field: $0]) }
            ?? .patch(collection: p.collection, id: p.id, unset: [p.field])
        _ = try db.apply(op)
        return .init(id: p.id, field: p.field, value: value ?? .null, present: value != nil)
    }
}
