import BlazeProtocol

/// Turns a local API write into the CRDT operation that expresses it, given the document's current state.
public enum LocalEdit {
    /// Insert or put: the document becomes exactly `fields`.
    ///
    /// On a live document the op writes every given field and unsets the fields it currently has that `fields`
    /// lacks. On a missing or deleted document it starts the next incarnation (causal length + 1) with `fields`.
    public static func replace(_ key: DocKey, fields: [String: JSONValue], current: DocumentState?) -> DocOp {
        let state = current ?? DocumentState()
        if state.isAlive {
            let present = state.materialize(id: key.id)?.keys.filter { $0 != "_id" && fields[$0] == nil } ?? []
            return DocOp(key: key, cl: state.cl, set: fields, unset: present.sorted(by: utf8Less))
        }
        return DocOp(key: key, cl: state.cl + 1, set: fields)
    }

    /// A patch of a live document at its current causal length; nil when the document does not exist.
    public static func patch(
        _ key: DocKey, current: DocumentState?, set: [String: JSONValue] = [:], unset: [String] = [],
        incr: [String: JSONValue] = [:], add: [String: [JSONValue]] = [:], remove: [String: [JSONValue]] = [:]
    ) -> DocOp? {
        guard let state = current, state.isAlive else { return nil }
        return DocOp(key: key, cl: state.cl, set: set, unset: unset, incr: incr, add: add, remove: remove)
    }

    /// A delete of a live document (the next, even causal length); nil when it does not exist.
    public static func delete(_ key: DocKey, current: DocumentState?) -> CRDTOp? {
        guard let state = current, state.isAlive else { return nil }
        return .delete(key, cl: state.cl + 1)
    }
}
