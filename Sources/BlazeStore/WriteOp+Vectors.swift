import BlazeProtocol
import BlazeVector

extension WriteOp {
    /// This operation with every vector its values give (`{"$vector": [numbers]}` or base64) in the stored form,
    /// `{"$vector": base64}`; `invalid_vector` for a malformed one. Values without a `$vector` member are not copied.
    func withStoredVectors() throws -> WriteOp {
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
