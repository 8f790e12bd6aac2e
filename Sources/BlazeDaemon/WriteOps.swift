import BlazeProtocol
import BlazeStore

/// Store writes built from the typed params of `doc.insert`, `doc.put`, `doc.patch` and `doc.delete`; each op of
/// `tx.commit` is one of them, validated by the same generated params type (without `db`).
enum WriteOps {
    static func insert(_ p: RPC.DocInsert) -> WriteOp {
        .insert(collection: p.collection, doc: p.doc)
    }

    static func put(_ p: RPC.DocPut) throws -> WriteOp {
        guard let id = p.id ?? p.doc["_id"]?.stringValue else {
            throw RPCError.invalidParams("doc.put needs an id: pass \"id\" or a string doc._id")
        }
        return .put(collection: p.collection, id: id, doc: p.doc)
    }

    static func patch(_ p: RPC.DocPatch) -> WriteOp {
        .patch(
            collection: p.collection, id: p.id, set: p.set ?? [:], unset: p.unset ?? [], incr: p.incr ?? [:], add: p.add ?? [:],
            remove: p.remove ?? [:])
    }

    static func delete(_ p: RPC.DocDelete) -> WriteOp {
        .delete(collection: p.collection, id: p.id)
    }

    /// One op of `tx.commit`: `{op, collection, ...}` with the members of the matching `doc.*` method but `db`.
    static func transactionOp(_ o: [String: JSONValue], index i: Int, db: String) throws -> WriteOp {
        var params = o
        guard case .string(let kind)? = params.removeValue(forKey: "op") else {
            throw RPCError.invalidParams("ops[\(i)] must be an object with a string \"op\"")
        }
        guard params["db"] == nil else {
            throw RPCError.invalidParams("ops[\(i)]: unknown member \"db\"; the transaction's db applies to every op")
        }
        params["db"] = .string(db)
        do {
            switch kind {
            case "insert": return insert(try RPC.DocInsert(validating: params))
            case "put": return try put(try RPC.DocPut(validating: params))
            case "patch": return patch(try RPC.DocPatch(validating: params))
            case "delete": return delete(try RPC.DocDelete(validating: params))
            default: throw RPCError.invalidParams("unknown op \"\(kind)\"; use insert, put, patch or delete")
            }
        } catch let e as RPCError {
            throw RPCError(code: e.code, kind: e.kind, message: "ops[\(i)]: \(e.message)", details: ["op": .int(Int64(i))])
        }
    }
}
