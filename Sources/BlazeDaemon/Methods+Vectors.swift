import BlazeProtocol
import BlazeStore
import BlazeVector

/// Vectors: nearest-neighbour queries, and the form vector values are returned in.
extension Methods {
    static let queryNearest = MethodHandler(RPC.QueryNearest.self) { p, ctx in
        let vector: [Float]
        do {
            // A vector value as documents hold it (`{"$vector": …}`) is taken as what it holds.
            var given = p.vector
            if case .object(let o) = given {
                guard o.count == 1, let inner = o[VectorValue.marker] else {
                    throw RPCError(
                        code: RPCErrorCode.invalidParams, kind: "invalid_vector",
                        message: "vector: an object given as a vector holds one member, $vector")
                }
                given = inner
            }
            vector = try VectorValue.components(of: given)
        } catch let error as VectorValueError {
            throw RPCError(code: RPCErrorCode.invalidParams, kind: "invalid_vector", message: "vector: \(error.description)")
        }
        let expand = try expandsVectors(p.vectors)
        var query = NearestQuery(
            collection: p.collection, field: try FieldPath(p.field), vector: vector, k: p.k,
            filter: try Filter.parse(p.where.map(JSONValue.object)), fields: try projection(p.fields), metric: try metric(p.metric))
        query.exact = p.exact ?? false
        query.ef = p.ef
        let r = try ctx.database(p.db).nearest(query)
        return .init(
            results: r.hits.map {
                .init(doc: expand ? VectorValue.expanded($0.doc) : $0.doc, distance: $0.distance.isFinite ? Double($0.distance) : .greatestFiniteMagnitude)
            },
            metric: .init(rawValue: r.metric.rawValue)!, index: r.index, approximate: r.approximate)
    }

    /// The metric a `metric` parameter names (nil when absent).
    static func metric(_ name: String?) throws -> VectorMetric? {
        guard let name else { return nil }
        guard let metric = VectorMetric(rawValue: name) else {
            throw RPCError.invalidParams("metric is cosine, l2 or ip, got \"\(name.prefix(40))\"")
        }
        return metric
    }

    /// Whether a `vectors` parameter asks for vectors as arrays of numbers (`array`) rather than as stored (`base64`).
    static func expandsVectors(_ form: String?) throws -> Bool {
        switch form {
        case nil, "base64": return false
        case "array": return true
        case let other?: throw RPCError.invalidParams("vectors is base64 or array, got \"\(other.prefix(40))\"")
        }
    }
}
