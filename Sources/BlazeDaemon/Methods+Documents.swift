import BlazeProtocol
import BlazeStore
import BlazeVector

/// Documents: reads by id, writes and transactions.
extension Methods {
    static let docInsert = MethodHandler(write: RPC.DocInsert.self) { p, ctx in
        (try ctx.writableDatabase(p.db), WriteOps.insert(p), { .init(id: $0.id) })
    }

    /// `doc.get` answers with the stored document's text as it is (no parse, no re-encoding) unless `fields` asks for
    /// a projection.
    /// `doc.get`: a point read on the event loop when it comes alone; with `at` or `atTime` (which walk the feed
    /// back) on the I/O pool.
    static let docGet = MethodHandler(text: RPC.DocGet.self, inline: false, budgeted: true) { p, ctx in
        let db = try ctx.database(p.db)
        if p.at != nil || p.atTime != nil {
            guard ctx.readBudget != .inline else { throw ReadBudgetExceeded() }
            guard p.at == nil || p.atTime == nil else { throw RPCError.invalidParams("give at or atTime, not both") }
            guard (p.at ?? 0) >= 0, (p.atTime ?? 0) >= 0 else { throw RPCError.invalidParams("at and atTime are ≥ 0") }
            let seq = try p.at.map(Int64.init) ?? db.feedSequence(atTime: Int64(p.atTime!))
            let doc = try db.get(collection: p.collection, id: p.id, at: seq, fields: try projection(p.fields))
            return RPC.DocGet.encode(.init(doc: try expandsVectors(p.vectors) ? VectorValue.expanded(doc) : doc)).jsonBytes
        }
        if try expandsVectors(p.vectors) {
            let doc = try db.get(collection: p.collection, id: p.id, fields: try projection(p.fields))
            return RPC.DocGet.encode(.init(doc: VectorValue.expanded(doc))).jsonBytes
        }
        if let fields = try projection(p.fields) {
            return RPC.DocGet.encode(.init(doc: try db.get(collection: p.collection, id: p.id, fields: fields))).jsonBytes
        }
        return Array("{\"doc\":".utf8) + (try db.getText(collection: p.collection, id: p.id)) + [UInt8(ascii: "}")]
    }

    static let docHistory = MethodHandler(RPC.DocHistory.self) { p, ctx in
        var after: Int64 = 0
        if let cursor = p.cursor {
            guard let seq = Int64(cursor), seq >= 0 else {
                throw RPCError(code: RPCErrorCode.invalidParams, kind: "invalid_cursor", message: "cursor is not one doc.history returned")
            }
            after = seq
        }
        let h = try ctx.database(p.db).history(collection: p.collection, id: p.id, after: after, limit: p.limit ?? 100)
        return .init(
            entries: h.entries.map { e in
                .init(
                    seq: Int(e.seq), type: .init(rawValue: e.type.rawValue)!, origin: e.origin.hex, change: e.change.map { Int($0) },
                    hlc: e.hlc.map { Int(Int64(bitPattern: $0.raw)) }, time: e.hlc.map { Int($0.milliseconds) },
                    appliedAt: e.appliedAt.map { Int($0) }, changed: e.changed)
            }, cursor: h.next.map(String.init), floor: Int(h.floor))
    }

    static let docGetMany = MethodHandler(RPC.DocGetMany.self, inline: true) { p, ctx in
        let expand = try expandsVectors(p.vectors)
        let docs = try ctx.database(p.db).getMany(collection: p.collection, ids: p.ids, fields: try projection(p.fields))
        return .init(docs: expand ? docs.map(VectorValue.expanded) : docs)
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
