/// The typed parameters of one RPC method, generated from `Protocol/blazedb.openrpc.json` (see `RPCMethods.swift`).
///
/// The daemon builds them from a request's params (`init(validating:)`), clients build them by their memberwise
/// initializer and send `jsonObject`; both sides share `Result` and its JSON form.
public protocol RPCParameters: Sendable {
    /// What the method returns.
    associatedtype Result: Sendable
    /// The method these are the parameters of.
    static var method: RPCMethod { get }
    /// Checks names, presence and JSON types of the params of a request (the only validation done by schema).
    init(validating params: [String: JSONValue]) throws(RPCError)
    /// The params as a request carries them (absent optional parameters are left out).
    var jsonObject: [String: JSONValue] { get }
    /// The JSON form of a result.
    static func encode(_ result: Result) -> JSONValue
    /// Reads a result a daemon sent.
    static func decode(_ result: JSONValue) throws(RPCShapeError) -> Result
}

/// A generated value type of the protocol (a closed object of a result or a component schema).
public protocol RPCObject: Sendable {
    /// Reads the value from JSON, failing with the path of the first member that does not fit.
    init(json: JSONValue) throws(RPCShapeError)
    /// The value's JSON form.
    var json: JSONValue { get }
}

/// The params of a notification the daemon sends (no id, no reply), generated from the protocol document's
/// `x-notifications`.
public protocol RPCNotificationParams: RPCObject {
    /// The notification's method name.
    static var method: String { get }
}

/// A JSON value that does not have the shape the protocol document declares; `path` leads to it from the top.
public struct RPCShapeError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Members and indexes from the outside in: `["ids", "[3]"]`.
    public var path: [String]
    /// What the document declares ("string", "integer", "present"...).
    public var expected: String
    /// What was found (a JSON type name, or "nothing").
    public var got: String

    /// A failure at the value itself.
    public init(expected: String, got: String) {
        self.path = []
        self.expected = expected
        self.got = got
    }

    /// The same failure one level further out.
    func inside(_ component: String) -> RPCShapeError {
        var e = self
        e.path.insert(component, at: 0)
        return e
    }

    /// `ids[3]`, `limits.maxDepth`.
    public var pathText: String {
        var s = ""
        for c in path { s += c.hasPrefix("[") || s.isEmpty ? c : "." + c }
        return s
    }

    /// `a string`, `an integer`: the expected type with its article, as messages about nested values use it.
    var expectedWithArticle: String {
        switch expected {
        case "string", "boolean", "number": return "a " + expected
        case "integer", "object", "array": return "an " + expected
        default: return expected
        }
    }

    public var description: String {
        path.isEmpty ? "must be \(expected), got \(got)" : "\(pathText) must be \(expectedWithArticle), got \(got)"
    }
}

/// Readers the generated code composes: each checks one JSON type and returns the Swift value.
public enum RPCDecode {
    /// A decoding step the generated code passes around.
    public typealias Step<T> = (JSONValue) throws(RPCShapeError) -> T

    public static func string(_ v: JSONValue) throws(RPCShapeError) -> String {
        guard case .string(let s) = v else { throw RPCShapeError(expected: "string", got: v.typeName) }
        return s
    }

    public static func int(_ v: JSONValue) throws(RPCShapeError) -> Int {
        guard case .int(let i) = v else { throw RPCShapeError(expected: "integer", got: v.typeName) }
        return Int(i)
    }

    public static func double(_ v: JSONValue) throws(RPCShapeError) -> Double {
        switch v {
        case .double(let d): return d
        case .int(let i): return Double(i)
        default: throw RPCShapeError(expected: "number", got: v.typeName)
        }
    }

    public static func bool(_ v: JSONValue) throws(RPCShapeError) -> Bool {
        guard case .bool(let b) = v else { throw RPCShapeError(expected: "boolean", got: v.typeName) }
        return b
    }

    /// Any JSON value.
    public static func json(_ v: JSONValue) throws(RPCShapeError) -> JSONValue { v }

    /// An object's members.
    public static func object(_ v: JSONValue) throws(RPCShapeError) -> [String: JSONValue] {
        guard case .object(let o) = v else { throw RPCShapeError(expected: "object", got: v.typeName) }
        return o
    }

    /// An object, kept as a JSON value (documents in results).
    public static func objectValue(_ v: JSONValue) throws(RPCShapeError) -> JSONValue {
        guard case .object = v else { throw RPCShapeError(expected: "object", got: v.typeName) }
        return v
    }

    /// A value whose JSON type is one of `types` (a `oneOf` of plain types such as a sort key).
    public static func oneOf(_ types: [String], _ v: JSONValue) throws(RPCShapeError) -> JSONValue {
        guard types.contains(v.typeName) else {
            throw RPCShapeError(expected: types.joined(separator: " or "), got: v.typeName)
        }
        return v
    }

    /// An array, each element read by `element`.
    public static func array<T>(_ v: JSONValue, _ element: Step<T>) throws(RPCShapeError) -> [T] {
        guard case .array(let items) = v else { throw RPCShapeError(expected: "array", got: v.typeName) }
        var out: [T] = []
        out.reserveCapacity(items.count)
        for (i, item) in items.enumerated() {
            do { out.append(try element(item)) } catch { throw error.inside("[\(i)]") }
        }
        return out
    }

    /// An object used as a map, each value read by `value`.
    public static func map<T>(_ v: JSONValue, _ value: Step<T>) throws(RPCShapeError) -> [String: T] {
        guard case .object(let o) = v else { throw RPCShapeError(expected: "object", got: v.typeName) }
        var out: [String: T] = [:]
        out.reserveCapacity(o.count)
        for (k, item) in o {
            do { out[k] = try value(item) } catch { throw error.inside(k) }
        }
        return out
    }

    /// A string naming one case of `E`.
    public static func enumeration<E: RawRepresentable<String>>(_ v: JSONValue) throws(RPCShapeError) -> E {
        guard case .string(let s) = v, let e = E(rawValue: s) else {
            throw RPCShapeError(expected: "one of the declared strings", got: v.typeName == "string" ? "\"\(v.stringValue!)\"" : v.typeName)
        }
        return e
    }

    /// A null, or a value read by `step`.
    public static func nullable<T>(_ v: JSONValue, _ step: Step<T>) throws(RPCShapeError) -> T? {
        v.isNull ? nil : try step(v)
    }

    /// Runs one step on a value (lets generated code call a closure with its typed error).
    public static func value<T>(_ v: JSONValue, _ step: Step<T>) throws(RPCShapeError) -> T {
        try step(v)
    }

    /// A required member of an object.
    public static func member<T>(_ o: [String: JSONValue], _ name: String, _ step: Step<T>) throws(RPCShapeError) -> T {
        guard let v = o[name] else { throw RPCShapeError(expected: "present", got: "nothing").inside(name) }
        do { return try step(v) } catch { throw error.inside(name) }
    }

    /// An optional member: absent or null gives nil.
    public static func optionalMember<T>(_ o: [String: JSONValue], _ name: String, _ step: Step<T>) throws(RPCShapeError) -> T? {
        guard let v = o[name], !v.isNull else { return nil }
        do { return try step(v) } catch { throw error.inside(name) }
    }
}

/// The checks of a request's params the generated `init(validating:)` makes, with the daemon's error messages.
public enum RPCParam {
    /// Refuses names the method does not declare, naming the first (in sorted order) and listing the accepted ones.
    public static func rejectUnknown(_ params: [String: JSONValue], accepted: [String], method: RPCMethod) throws(RPCError) {
        guard params.keys.contains(where: { !accepted.contains($0) }) else { return }
        let key = params.keys.sorted().first { !accepted.contains($0) }!
        let list = accepted.isEmpty ? "none" : accepted.joined(separator: ", ")
        throw .invalidParams("unknown parameter \"\(key)\" for \(method.rawValue); accepted: \(list)")
    }

    /// A required parameter (null is not a value for it).
    public static func required<T>(
        _ params: [String: JSONValue], _ name: String, of method: RPCMethod, _ step: RPCDecode.Step<T>
    ) throws(RPCError) -> T {
        guard let v = params[name] else { throw .invalidParams("missing required parameter \"\(name)\" for \(method.rawValue)") }
        return try read(v, name, method, step)
    }

    /// An optional parameter: absent or null gives nil.
    public static func optional<T>(
        _ params: [String: JSONValue], _ name: String, of method: RPCMethod, _ step: RPCDecode.Step<T>
    ) throws(RPCError) -> T? {
        guard let v = params[name], !v.isNull else { return nil }
        return try read(v, name, method, step)
    }

    /// An optional parameter that takes any JSON value: absent gives nil, null gives `.null`.
    public static func optionalValue(_ params: [String: JSONValue], _ name: String) -> JSONValue? {
        params[name]
    }

    static func read<T>(_ v: JSONValue, _ name: String, _ method: RPCMethod, _ step: RPCDecode.Step<T>) throws(RPCError) -> T {
        do {
            return try step(v)
        } catch {
            if error.path.isEmpty {
                throw .invalidParams("parameter \"\(name)\" of \(method.rawValue) must be \(error.expected), got \(error.got)")
            }
            throw .invalidParams("\(error.inside(name).description)")
        }
    }
}
