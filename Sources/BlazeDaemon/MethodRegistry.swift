import BlazeProtocol
import BlazeStore
import BlazeSync
import Logging

/// The JSON type a parameter must have.
enum ParamType: String, Sendable {
    case string, integer, boolean, object, array
    /// Any JSON value.
    case any
    /// A string or an array of strings (e.g. `sort`).
    case stringOrArray

    func accepts(_ v: JSONValue) -> Bool {
        switch (self, v) {
        case (.any, _), (.string, .string), (.integer, .int), (.boolean, .bool), (.object, .object),
            (.array, .array), (.stringOrArray, .string), (.stringOrArray, .array):
            return true
        default:
            return false
        }
    }

    var schema: JSONValue {
        switch self {
        case .any: return [:]
        case .stringOrArray: return ["oneOf": [["type": "string"], ["type": "array", "items": ["type": "string"]]]]
        default: return ["type": .string(rawValue)]
        }
    }
}

/// One declared parameter of a method.
struct ParamSpec: Sendable {
    let name: String
    let type: ParamType
    let required: Bool
    let summary: String

    static func required(_ name: String, _ type: ParamType, _ summary: String) -> ParamSpec {
        ParamSpec(name: name, type: type, required: true, summary: summary)
    }

    static func optional(_ name: String, _ type: ParamType, _ summary: String) -> ParamSpec {
        ParamSpec(name: name, type: type, required: false, summary: summary)
    }

    static let db = required("db", .string, "Database name.")
    static let collection = required("collection", .string, "Collection name.")
    static let id = required("id", .string, "Document id.")
    static let fields = optional("fields", .array, "Field paths to return (projection); _id is always returned.")
    static let `where` = optional("where", .object, "Filter (see Protocol/QUERIES.md).")
}

/// Validated parameters of one call; accessors cannot fail on type because validation ran first.
struct Params: Sendable {
    let values: [String: JSONValue]

    subscript(name: String) -> JSONValue? { values[name] }

    func string(_ name: String) -> String { values[name]!.stringValue! }
    func optionalString(_ name: String) -> String? { values[name]?.stringValue }
    func array(_ name: String) -> [JSONValue] { values[name]!.arrayValue! }

    /// An array of strings, with a clear error naming the first bad element.
    func strings(_ name: String) throws -> [String]? {
        guard let items = values[name]?.arrayValue else { return nil }
        return try items.enumerated().map { i, v in
            guard case .string(let s) = v else {
                throw RPCError.invalidParams("\(name)[\(i)] must be a string, got \(v.typeName)")
            }
            return s
        }
    }

    /// The projection paths in `fields`, if given.
    func projection() throws -> [FieldPath]? {
        try strings("fields")?.map { (s: String) throws -> FieldPath in try FieldPath(s) }
    }
}

/// Facts a handler may use.
struct RequestContext: Sendable {
    let store: Store
    let config: DaemonConfig
    let logger: Logger
    let startedAt: ContinuousClock.Instant
    let registry: MethodRegistry
    /// The daemon's open connections.
    let connections: ConnectionTable
    /// Sync: sharing, peers, status.
    let sync: SyncEngine
    /// The connection the request came on (set per call).
    var connection: ConnectionHandle?

    func database(_ params: Params) throws -> BlazeDatabase {
        try store.database(params.string("db"))
    }
}

/// A method: its name, summary, parameters and handler.
struct MethodSpec: Sendable {
    typealias Handler = @Sendable (Params, RequestContext) throws -> JSONValue
    let name: String
    let summary: String
    let params: [ParamSpec]
    /// True for methods that only read a little and may run on the event loop; the rest run on the I/O pool.
    var runsInline = false
    let handler: Handler

    init(inline: Bool = false, name: String, summary: String, params: [ParamSpec], handler: @escaping Handler) {
        self.name = name
        self.summary = summary
        self.params = params
        self.runsInline = inline
        self.handler = handler
    }

    /// Checks names, presence and types of parameters.
    func validate(_ raw: [String: JSONValue]) throws(RPCError) -> Params {
        for key in raw.keys.sorted() where !params.contains(where: { $0.name == key }) {
            let accepted = params.map(\.name).joined(separator: ", ")
            throw .invalidParams(
                "unknown parameter \"\(key)\" for \(name); accepted: \(accepted.isEmpty ? "none" : accepted)")
        }
        for p in params {
            guard let v = raw[p.name] else {
                if p.required { throw .invalidParams("missing required parameter \"\(p.name)\" for \(name)") }
                continue
            }
            if v.isNull && !p.required { continue }
            guard p.type.accepts(v) else {
                throw .invalidParams("parameter \"\(p.name)\" of \(name) must be \(p.type.rawValue), got \(v.typeName)")
            }
        }
        // An explicit null means "absent" except for parameters that take any JSON value, where null is a value.
        let keepsNull = Set(params.filter { $0.type == .any }.map(\.name))
        return Params(values: raw.filter { !$0.value.isNull || keepsNull.contains($0.key) })
    }
}

/// The table of methods the daemon serves.
struct MethodRegistry: Sendable {
    let methods: [String: MethodSpec]

    init(_ specs: [MethodSpec]) {
        var m: [String: MethodSpec] = [:]
        for s in specs {
            precondition(m[s.name] == nil, "method \(s.name) registered twice")
            m[s.name] = s
        }
        methods = m
    }

    /// Sorted method names.
    var names: [String] { methods.keys.sorted() }
}
