import BlazeProtocol

/// A dotted path into a document (`a.b` reaches `{"a":{"b":…}}`); array positions are not addressed.
public struct FieldPath: Hashable, Sendable, CustomStringConvertible {
    /// The path's segments, each a literal object key.
    public let segments: [String]

    /// Parses and validates a dotted path.
    public init(_ dotted: String) throws(StoreError) {
        segments = try Names.parsePath(dotted)
    }

    /// The dotted form.
    public var description: String { segments.joined(separator: ".") }

    /// True for the document id path `_id`.
    public var isID: Bool { segments == ["_id"] }

    /// The value at this path in `doc`, or nil when missing (or when an intermediate is not an object).
    public func lookup(in doc: [String: JSONValue]) -> JSONValue? {
        var current: JSONValue = .object(doc)
        for s in segments {
            guard case .object(let o) = current, let next = o[s] else { return nil }
            current = next
        }
        return current
    }
}

/// A comparison operator in a filter.
public enum CompareOp: String, Sendable {
    case eq = "$eq", gt = "$gt", gte = "$gte", lt = "$lt", lte = "$lte"
}

/// A parsed query filter (ARCHITECTURE.md, "Queries"). Semantics are defined by `matches(_:)` and documented in
/// Protocol/QUERIES.md.
public indirect enum Filter: Sendable, Equatable {
    /// Matches every document.
    case all
    /// All sub-filters match.
    case and([Filter])
    /// At least one sub-filter matches.
    case or([Filter])
    /// The sub-filter does not match.
    case not(Filter)
    /// Typed comparison: both sides must have the same type rank (see `TypeRank`).
    case compare(FieldPath, CompareOp, JSONValue)
    /// Equal to one of the values.
    case oneOf(FieldPath, [JSONValue])
    /// The field is present (a JSON `null` counts as present) or absent.
    case exists(FieldPath, Bool)
    /// An array field holds an element equal to the value, or a string field contains the string.
    case contains(FieldPath, JSONValue)
    /// A string field starts with the string (by UTF-8 bytes).
    case prefix(FieldPath, String)

    /// Maximum number of values in one `$in`/`$nin` list.
    public static let maxListValues = 1000
    /// Maximum number of leaf conditions in one filter.
    public static let maxTerms = 256

    /// Parses a `where` object. `nil` or `{}` match everything.
    public static func parse(_ json: JSONValue?) throws(StoreError) -> Filter {
        guard let json, !json.isNull else { return .all }
        guard case .object(let o) = json else {
            throw .invalid("invalid_filter", "where must be an object, got \(json.typeName)")
        }
        var counter = 0
        return try parseObject(o, counter: &counter)
    }

    private static func parseObject(_ o: [String: JSONValue], counter: inout Int) throws(StoreError) -> Filter {
        var parts: [Filter] = []
        for key in o.keys.sorted(by: utf8Less) {
            let value = o[key]!
            switch key {
            case "$and", "$or":
                guard case .array(let items) = value, !items.isEmpty else {
                    throw .invalid("invalid_filter", "\(key) takes a non-empty array of filter objects")
                }
                var subs: [Filter] = []
                for item in items {
                    guard case .object(let so) = item else {
                        throw .invalid("invalid_filter", "\(key) takes a non-empty array of filter objects")
                    }
                    subs.append(try parseObject(so, counter: &counter))
                }
                parts.append(key == "$and" ? .and(subs) : .or(subs))
            case "$not":
                guard case .object(let so) = value else {
                    throw .invalid("invalid_filter", "$not takes a filter object")
                }
                parts.append(.not(try parseObject(so, counter: &counter)))
            default:
                if key.hasPrefix("$") {
                    throw .invalid(
                        "invalid_filter", "unknown top-level operator \(key); supported: $and, $or, $not")
                }
                let path = try FieldPath(key)
                parts.append(try parseCondition(path, value, counter: &counter))
            }
        }
        if parts.count == 1 { return parts[0] }
        return parts.isEmpty ? .all : .and(parts)
    }

    private static func isOperatorObject(_ o: [String: JSONValue], path: FieldPath) throws(StoreError) -> Bool {
        let ops = o.keys.filter { $0.hasPrefix("$") }.count
        if ops == 0 { return false }
        if ops != o.count {
            throw .invalid("invalid_filter", "condition on \(path) mixes operators and plain fields")
        }
        return true
    }

    private static func parseCondition(_ path: FieldPath, _ value: JSONValue, counter: inout Int) throws(StoreError)
        -> Filter
    {
        guard case .object(let o) = value, try isOperatorObject(o, path: path) else {
            try count(&counter)
            return .compare(path, .eq, value)
        }
        var parts: [Filter] = []
        for op in o.keys.sorted(by: utf8Less) {
            let operand = o[op]!
            try count(&counter)
            switch op {
            case "$eq": parts.append(.compare(path, .eq, operand))
            case "$ne": parts.append(.not(.compare(path, .eq, operand)))
            case "$gt", "$gte", "$lt", "$lte":
                switch operand {
                case .int, .double, .string, .bool: break
                default:
                    throw .invalid(
                        "invalid_filter", "\(op) on \(path) needs a number, string or boolean, got \(operand.typeName)")
                }
                parts.append(.compare(path, CompareOp(rawValue: op)!, operand))
            case "$in", "$nin":
                guard case .array(let values) = operand else {
                    throw .invalid("invalid_filter", "\(op) on \(path) takes an array of values")
                }
                guard values.count <= maxListValues else {
                    throw StoreError(
                        .limitExceeded, kind: "filter_too_large",
                        "\(op) on \(path) has \(values.count) values; the limit is \(maxListValues)")
                }
                parts.append(op == "$in" ? .oneOf(path, values) : .not(.oneOf(path, values)))
            case "$exists":
                guard case .bool(let b) = operand else {
                    throw .invalid("invalid_filter", "$exists on \(path) takes true or false")
                }
                parts.append(.exists(path, b))
            case "$contains":
                parts.append(.contains(path, operand))
            case "$prefix":
                guard case .string(let s) = operand else {
                    throw .invalid("invalid_filter", "$prefix on \(path) takes a string")
                }
                parts.append(.prefix(path, s))
            case "$not":
                guard case .object(let so) = operand, try isOperatorObject(so, path: path) else {
                    throw .invalid("invalid_filter", "$not on \(path) takes an operator object such as {\"$gt\": 5}")
                }
                parts.append(.not(try parseCondition(path, operand, counter: &counter)))
            default:
                throw .invalid(
                    "invalid_filter",
                    "unknown operator \(op) on \(path); supported: $eq $ne $gt $gte $lt $lte $in $nin $exists $contains $prefix $not"
                )
            }
        }
        return parts.count == 1 ? parts[0] : .and(parts)
    }

    private static func count(_ counter: inout Int) throws(StoreError) {
        counter += 1
        if counter > maxTerms {
            throw StoreError(.limitExceeded, kind: "filter_too_large", "filter has more than \(maxTerms) conditions")
        }
    }
}

extension Filter {
    /// Evaluates the filter against a document in memory, with exactly the semantics of the compiled SQL.
    public func matches(_ doc: [String: JSONValue]) -> Bool {
        switch self {
        case .all: return true
        case .and(let fs): return fs.allSatisfy { $0.matches(doc) }
        case .or(let fs): return fs.contains { $0.matches(doc) }
        case .not(let f): return !f.matches(doc)
        case .compare(let p, let op, let v): return Self.compare(p.lookup(in: doc), op, v)
        case .oneOf(let p, let vs):
            let field = p.lookup(in: doc)
            return vs.contains { Self.compare(field, .eq, $0) }
        case .exists(let p, let b): return (p.lookup(in: doc) != nil) == b
        case .contains(let p, let v):
            switch p.lookup(in: doc) {
            case .array(let items)?: return items.contains { Self.compare($0, .eq, v) }
            case .string(let s)?:
                guard case .string(let needle) = v else { return false }
                return needle.isEmpty || Self.containsBytes(Array(s.utf8), Array(needle.utf8))
            default: return false
            }
        case .prefix(let p, let s):
            guard case .string(let field)? = p.lookup(in: doc) else { return false }
            return field.utf8.starts(with: s.utf8)
        }
    }

    static func compare(_ field: JSONValue?, _ op: CompareOp, _ v: JSONValue) -> Bool {
        let rank = TypeRank.of(v)
        guard TypeRank.of(field) == rank else { return false }
        if rank == 0 { return op == .eq }
        let c = TypeRank.compareSameRank(field!, v)
        switch op {
        case .eq: return c == 0
        case .gt: return c > 0
        case .gte: return c >= 0
        case .lt: return c < 0
        case .lte: return c <= 0
        }
    }

    static func containsBytes(_ hay: [UInt8], _ needle: [UInt8]) -> Bool {
        guard needle.count <= hay.count else { return false }
        for start in 0...(hay.count - needle.count) where hay[start..<(start + needle.count)].elementsEqual(needle) {
            return true
        }
        return false
    }
}
