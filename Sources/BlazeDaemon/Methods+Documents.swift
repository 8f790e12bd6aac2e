import BlazeProtocol
import BlazeStore

/// Documents: reads by id, writes and transactions.
extension Methods {
    static let docInsert = MethodHandler(write: RPC.DocInsert.self) { p, ctx in
        (try ctx.writableDatabase(p.db), WriteOps.insert(p), { .init(id: $0.id) })
    }

    /// `doc.get` answers with the stored document's text as it is (no parse, no re-encoding) unless `fields` asks for
    /// a projection.
    static let docGet = MethodHandler(text: RPC.DocGet.self, inline: true) { p, ctx in
        let db = try ctx.database(p.db)
        if let fields = try projection(p.fields) {
            return RPC.DocGet.encode(.init(doc: try db.get(collection: p.collection, id: p.id, fields: fields))).jsonBytes
        }
        return Array("{\"doc\":".utf8) + (try db.getText(collection: p.collection, id: p.id)) + [UInt8(ascii: "}")]
    }

    static let docGetMany = MethodHandler(RPC.DocGetMany.self, inline: true) { p, ctx in
        .init(docs: try ctx.database(p.db).getMany(collection: p.collection, ids: p.ids, fields: try projection(p.fields)))
    }

    static let docPut = MethodHandler(write: RPC.DocPut.self) { p, ctx in
        (try ctx.writableDatabase(p.db), try WriteOps.put(p), { .init(id: $0.id, created: $0.created ?? false) })
    }

    static let docPatch = MethodHandler(write: RPC.DocPatch.self) { p, ctx in
        (try ctx.writableDatabase(p.db), WriteOps.patch(p), { .init(id: $0.id) })
    }

    static let docDelete = MethodHandler(write: RPC.DocDelete.self) { p, ctx in
        (try ctx.writableDatabase(p.db), WriteOps.delete(p), { .init(id: $0.id) })
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
