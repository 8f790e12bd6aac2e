import BlazeProtocol
import BlazeVector

extension WriteOp {
    /// This operation with every vector its values give (`{"$vector": [numbers]}` or base64) in the stored form,
    /// `{"$vector": base64}`; `invalid_vector` for a malformed one. Values without a `$vector` member are not copied.
    func withStoredVectors() throws -> WriteOp {
        var named: String?
        switch self {
        case .insert(_, let doc), .put(_, _, let doc): if doc[VectorValue.marker] != nil { named = VectorValue.marker }
        case .patch(_, _, let set, let unset, let incr, let add, let remove):
            named = VectorValue.namesMarker(Array(set.keys) + unset + Array(incr.keys) + Array(add.keys) + Array(remove.keys))
        case .delete: break
        }
        if let named {
            throw StoreError.invalid(
                "invalid_vector", "\(Names.quoted(named)) names a vector's $vector member: a vector is written whole, by its field")
        }
        do {
            switch self {
            case .insert(let collection, let doc) where VectorValue.occurs(in: doc):
                return .insert(collection: collection, doc: try VectorValue.normalized(doc))
            case .put(let collection, let id, let doc) where VectorValue.occurs(in: doc):
                return .put(collection: collection, id: id, doc: try VectorValue.normalized(doc))
            case .patch(let collection, let id, let set, let unset, let incr, let add, let remove)
            where VectorValue.occurs(in: set) || add.values.contains(where: { $0.contains(where: VectorValue.occurs) })
                || remove.values.contains(where: { $0.contains(where: VectorValue.occurs) }):
                return .patch(
                    collection: collection, id: id, set: try VectorValue.normalized(set), unset: unset, incr: incr,
                    add: try add.mapValues { try $0.map { try VectorValue.normalized($0) } },
                    remove: try remove.mapValues { try $0.map { try VectorValue.normalized($0) } })
            default:
                return self
            }
        } catch let error as VectorValueError {
            throw StoreError.invalid("invalid_vector", error.description)
        }
    }
}
