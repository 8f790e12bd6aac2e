import BlazeProtocol
import BlazeStore

/// Documents: reads by id, writes and transactions.
extension Methods {
    static let docInsert = MethodHandler(RPC.DocInsert.self) { p, ctx in
        .init(id: try ctx.writableDatabase(p.db).apply(WriteOps.insert(p)).id)
    }

    static let docGet = MethodHandler(RPC.DocGet.self, inline: true) { p, ctx in
        .init(doc: try ctx.database(p.db).get(collection: p.collection, id: p.id, fields: try projection(p.fields)))
    }

    static let docGetMany = MethodHandler(RPC.DocGetMany.self, inline: true) { p, ctx in
        .init(docs: try ctx.database(p.db).getMany(collection: p.collection, ids: p.ids, fields: try projection(p.fields)))
    }

    static let docPut = MethodHandler(RPC.DocPut.self) { p, ctx in
        let r = try ctx.writableDatabase(p.db).apply(try WriteOps.put(p))
        return .init(id: r.id, created: r.created ?? false)
    }

    static let docPatch = MethodHandler(RPC.DocPatch.self) { p, ctx in
        .init(id: try ctx.writableDatabase(p.db).apply(WriteOps.patch(p)).id)
    }

    static let docDelete = MethodHandler(RPC.DocDelete.self) { p, ctx in
        .init(id: try ctx.writableDatabase(p.db).apply(WriteOps.delete(p)).id)
    }

    static let txCommit = MethodHandler(RPC.TxCommit.self) { p, ctx in
        let ops = try p.ops.enumerated().map { i, o in try WriteOps.transactionOp(o, index: i, db: p.db) }
        let results = try ctx.writableDatabase(p.db).commit(ops)
        return .init(results: results.map { .init(id: $0.id, created: $0.created) })
    }

    /// The projection paths of a `fields` parameter.
    static func projection(_ fields: [String]?) throws -> [FieldPath]? {
        try fields?.map { try FieldPath($0) }
    }
}
