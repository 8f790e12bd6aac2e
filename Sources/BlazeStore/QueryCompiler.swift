import BlazeProtocol
import Foundation
import GRDB
import Synchronization

/// A sort key: a field path and a direction. Sorting uses the `TypeRank` order; ties break on `_id` (see `orderBy`).
public struct SortKey: Sendable, Equatable {
    /// The field sorted on.
    public var path: FieldPath
    /// True for descending order.
    public var descending: Bool

    /// Maximum number of sort keys in one query.
    public static let maxKeys = 8

    /// Parses `"field"`, `"-field"` (descending), or an array of those.
    public static func parse(_ json: JSONValue?) throws(StoreError) -> [SortKey] {
        let items: [JSONValue]
        switch json {
        case nil, .null?: return []
        case .string?: items = [json!]
        case .array(let a)?: items = a
        default:
            throw .invalid("invalid_sort", "sort must be a field name or an array of them (prefix '-' for descending)")
        }
        guard items.count <= maxKeys else {
            throw StoreError(.limitExceeded, kind: "sort_too_large", "at most \(maxKeys) sort keys are allowed")
        }
        var keys: [SortKey] = []
        for item in items {
            guard case .string(var s) = item else {
                throw .invalid("invalid_sort", "sort entries must be strings such as \"age\" or \"-age\"")
            }
            let descending = s.hasPrefix("-")
            if descending { s.removeFirst() }
            keys.append(SortKey(path: try FieldPath(s), descending: descending))
        }
        return keys
    }
}

/// SQL text and arguments produced by `QueryCompiler`.
public struct CompiledSQL: Sendable {
    /// The statement text; values are never inlined, only validated names and paths.
    public var sql: String
    /// Bound values in order.
    public var values: [DatabaseValue]
    /// The same values as GRDB's arguments.
    public var arguments: StatementArguments { StatementArguments(values) }
}

/// Compiles filters, sorts and cursors to parameterised SQL over the `docs` table.
///
/// Every field is addressed by two expressions: its type rank (`CASE json_type(...)`) and its value
/// (`json_extract(...)`). User indexes index exactly those expressions, so typed equality, ranges, prefixes and
/// sorts can all be answered from an index.
public enum QueryCompiler {
    /// SQL string literal of the JSON path for `path`, e.g. `'$."a"."b"'`.
    static func pathLiteral(_ path: FieldPath) -> String {
        // Built by hand: Foundation's `replacingOccurrences` was a third of compiling a one-field find.
        var literal = "'$"
        for segment in path.segments {
            literal += ".\""
            if segment.utf8.contains(UInt8(ascii: "'")) {
                literal += segment.split(separator: "'", omittingEmptySubsequences: false).joined(separator: "''")
            } else {
                literal += segment
            }
            literal += "\""
        }
        return literal + "'"
    }

    /// The value expression for a path.
    static func valueSQL(_ path: FieldPath) -> String { expressions(path).value }

    /// The type-rank expression for a path (see `TypeRank`).
    static func rankSQL(_ path: FieldPath) -> String { expressions(path).rank }

    /// The rank and value expressions of paths recently compiled: building them was a third of compiling a find. Each
    /// thread keeps its own (one shared lock held up finds once the event loops outnumbered the cores).
    private static let recentExpressions = Sharded<[FieldPath: Expressions]>([:])

    /// A path's type-rank and value expressions.
    typealias Expressions = (rank: String, value: String)

    /// At most this many paths' expressions are kept per thread (then its set starts over).
    static let maxRecentExpressions = 1024

    /// The rank and value expressions for a path.
    static func expressions(_ path: FieldPath) -> Expressions {
        if let known = recentExpressions.withLocal({ $0[path] }) { return known }
        let literal = pathLiteral(path)
        let made = path.isID ? (rank: "3", value: "id") : (rankCase("json_type(body, \(literal))"), "json_extract(body, \(literal))")
        recentExpressions.withLocal {
            if $0.count >= maxRecentExpressions { $0.removeAll(keepingCapacity: true) }
            $0[path] = made
        }
        return made
    }

    static func rankCase(_ typeExpr: String) -> String {
        "CASE \(typeExpr) WHEN 'false' THEN 1 WHEN 'true' THEN 1 WHEN 'integer' THEN 2 WHEN 'real' THEN 2 "
            + "WHEN 'text' THEN 3 WHEN 'array' THEN 4 WHEN 'object' THEN 5 ELSE 0 END"
    }

    /// The SQLite value a JSON scalar binds as (booleans as 0/1, arrays and objects as canonical JSON text).
    static func databaseValue(_ v: JSONValue) -> DatabaseValue {
        switch v {
        case .null: return .null
        case .bool(let b): return (b ? 1 : 0 as Int64).databaseValue
        case .int(let i): return i.databaseValue
        case .double(let d): return d.databaseValue
        case .string(let s): return s.databaseValue
        case .array, .object: return v.jsonText.databaseValue
        }
    }

    /// Compiles a filter into a boolean SQL expression; appends bound values to `args`.
    static func compile(_ filter: Filter, _ args: inout [DatabaseValue]) -> String {
        switch filter {
        case .all: return "1"
        case .and(let fs): return "(" + fs.map { compile($0, &args) }.joined(separator: " AND ") + ")"
        case .or(let fs): return "(" + fs.map { compile($0, &args) }.joined(separator: " OR ") + ")"
        case .not(let f): return "(NOT IFNULL(\(compile(f, &args)), 0))"
        case .compare(let p, let op, let v):
            return typed(rank: rankSQL(p), value: valueSQL(p), op, v, &args)
        case .oneOf(let p, let vs):
            // Grouped by type rank into `rank = r AND value IN (...)`, which SQLite answers from an index as a
            // list of equality probes; an OR of equalities is rarely given the multi-index OR plan.
            var groups: [Int: [JSONValue]] = [:]
            for v in vs { groups[TypeRank.of(v), default: []].append(v) }
            if groups.isEmpty { return "0" }
            let terms = groups.keys.sorted().map { rank -> String in
                if rank == 0 { return "(\(rankSQL(p)) = 0)" }
                let values = groups[rank]!
                args.append(contentsOf: values.map(databaseValue))
                let marks = Array(repeating: "?", count: values.count).joined(separator: ", ")
                return "(\(rankSQL(p)) = \(rank) AND \(valueSQL(p)) IN (\(marks)))"
            }
            return terms.count == 1 ? terms[0] : "(" + terms.joined(separator: " OR ") + ")"
        case .exists(let p, let b):
            if p.isID { return b ? "1" : "0" }
            return "(json_type(body, \(pathLiteral(p))) IS \(b ? "NOT " : "")NULL)"
        case .contains(let p, let v):
            if p.isID {
                guard case .string(let s) = v else { return "0" }
                args.append(s.databaseValue)
                return "(instr(id, ?) > 0)"
            }
            let lit = pathLiteral(p)
            let element = typed(rank: rankCase("e.type"), value: "e.value", .eq, v, &args)
            var sql = "(json_type(body, \(lit)) = 'array' AND EXISTS (SELECT 1 FROM json_each(body, \(lit)) AS e WHERE \(element)))"
            if case .string(let s) = v {
                args.append(s.databaseValue)
                sql = "(\(sql) OR (json_type(body, \(lit)) = 'text' AND instr(json_extract(body, \(lit)), ?) > 0))"
            }
            return sql
        case .prefix(let p, let s):
            args.append(s.databaseValue)
            args.append(Data(Array(s.utf8) + [0xFF]).databaseValue)
            return "(\(rankSQL(p)) = 3 AND likelihood(\(valueSQL(p)) >= ?, \(rangeLikelihood)) "
                + "AND \(valueSQL(p)) < CAST(? AS TEXT))"
        }
    }

    static func typed(rank: String, value: String, _ op: CompareOp, _ v: JSONValue, _ args: inout [DatabaseValue])
        -> String
    {
        let r = TypeRank.of(v)
        if r == 0 { return op == .eq ? "(\(rank) = 0)" : "0" }
        let sqlOp: String
        switch op {
        case .eq: sqlOp = "="
        case .gt: sqlOp = ">"
        case .gte: sqlOp = ">="
        case .lt: sqlOp = "<"
        case .lte: sqlOp = "<="
        }
        args.append(databaseValue(v))
        if op == .eq { return "(\(rank) = \(r) AND \(value) = ?)" }
        return "(\(rank) = \(r) AND likelihood(\(value) \(sqlOp) ?, \(rangeLikelihood)))"
    }

    /// Selectivity hint for range terms. This SQLite has no STAT4, so it guesses a one-sided range keeps 1/4 of
    /// the rows and then prefers walking `id` order under a LIMIT; the hint lets a matching index win. The hint
    /// changes only the plan, never the result.
    static let rangeLikelihood = "0.05"

    /// The ORDER BY column pairs (rank, value) for each sort key, then `id` in the last key's direction.
    ///
    /// Breaking ties in the last key's direction lets a single-field sort walk a user index (which ends in `id`)
    /// forwards or backwards without a temporary B-tree.
    static func orderBy(_ sort: [SortKey]) -> String {
        var terms: [String] = []
        for key in sort {
            let dir = key.descending ? "DESC" : "ASC"
            terms.append("\(rankSQL(key.path)) \(dir)")
            terms.append("\(valueSQL(key.path)) \(dir)")
        }
        terms.append("id \(idDescending(sort) ? "DESC" : "ASC")")
        return terms.joined(separator: ", ")
    }

    /// Whether the `_id` tie-break runs descending (it follows the last sort key).
    public static func idDescending(_ sort: [SortKey]) -> Bool { sort.last?.descending ?? false }

    /// The predicate "row sorts strictly after the cursor position".
    static func after(_ sort: [SortKey], _ cursor: QueryCursor, _ args: inout [DatabaseValue]) -> String {
        // Components in order: (rank_i, value_i) per key with the key's direction, then id ascending.
        var comps: [(expr: String, desc: Bool, value: DatabaseValue)] = []
        for (i, key) in sort.enumerated() {
            comps.append((rankSQL(key.path), key.descending, databaseValue(cursor.keys[2 * i])))
            comps.append((valueSQL(key.path), key.descending, databaseValue(cursor.keys[2 * i + 1])))
        }
        comps.append(("id", idDescending(sort), cursor.id.databaseValue))
        var ors: [String] = []
        for k in 0..<comps.count {
            var ands: [String] = []
            for j in 0..<k {
                args.append(comps[j].value)
                ands.append("\(comps[j].expr) IS ?")
            }
            args.append(comps[k].value)
            ands.append("\(comps[k].expr) \(comps[k].desc ? "<" : ">") ?")
            ors.append("(" + ands.joined(separator: " AND ") + ")")
        }
        return "(" + ors.joined(separator: " OR ") + ")"
    }

    /// Compiles a find query: selects `id`, `body`, then each sort key's rank and value (for the next cursor).
    public static func find(_ q: FindQuery, limit: Int) -> CompiledSQL {
        var args: [DatabaseValue] = []
        var columns = ["id", "body"]
        for key in q.sort {
            columns.append(rankSQL(key.path))
            columns.append(valueSQL(key.path))
        }
        var sql = "SELECT \(columns.joined(separator: ", ")) FROM docs WHERE collection = '\(q.collection)'"
        if q.filter != .all { sql += " AND \(compile(q.filter, &args))" }
        if let cursor = q.cursor { sql += " AND \(after(q.sort, cursor, &args))" }
        sql += " ORDER BY \(orderBy(q.sort)) LIMIT \(limit)"
        return CompiledSQL(sql: sql, values: args)
    }

    /// Compiles a count query.
    public static func count(collection: String, filter: Filter) -> CompiledSQL {
        var args: [DatabaseValue] = []
        var sql = "SELECT count(*) FROM docs WHERE collection = '\(collection)'"
        if filter != .all { sql += " AND \(compile(filter, &args))" }
        return CompiledSQL(sql: sql, values: args)
    }

    /// The index column list for the given fields: (rank, value) per field, then `id` so sorts need no temp B-tree.
    public static func indexColumns(_ fields: [FieldPath]) -> String {
        (fields.map { "\(rankSQL($0)), \(valueSQL($0))" } + ["id"]).joined(separator: ", ")
    }
}

/// A find query: what to match, in which order, how many, where to resume, which fields to return.
public struct FindQuery: Sendable {
    /// Collection name (validated).
    public var collection: String
    /// The filter.
    public var filter: Filter
    /// Sort keys (empty: by `_id`).
    public var sort: [SortKey]
    /// Maximum number of documents in this page.
    public var limit: Int
    /// Resume after this position (from a previous page's cursor).
    public var cursor: QueryCursor?
    /// Projection; nil returns whole documents.
    public var fields: [FieldPath]?

    /// Creates a query.
    public init(
        collection: String, filter: Filter = .all, sort: [SortKey] = [], limit: Int = 100,
        cursor: QueryCursor? = nil, fields: [FieldPath]? = nil
    ) {
        self.collection = collection
        self.filter = filter
        self.sort = sort
        self.limit = limit
        self.cursor = cursor
        self.fields = fields
    }

    /// A fingerprint of collection and sort, so a cursor is only used with the query shape it came from.
    var shape: String {
        collection + "|" + sort.map { ($0.descending ? "-" : "") + $0.path.description }.joined(separator: ",")
    }
}

/// An opaque resume position: the last row's sort key values and id, tied to the query's shape.
public struct QueryCursor: Sendable, Equatable {
    /// Rank and value per sort key, flattened.
    var keys: [JSONValue]
    /// The last row's id.
    var id: String
    /// The query shape it belongs to.
    var shape: String

    /// The token given to clients (base64url of a small JSON object).
    public var token: String {
        let json: JSONValue = ["k": .array(keys), "i": .string(id), "s": .string(shape)]
        return Base64URL.encode(json.jsonBytes)
    }

    /// Decodes a token for the given query; rejects tokens from another query shape.
    public static func decode(_ token: String, for query: FindQuery) throws(StoreError) -> QueryCursor {
        let bad = StoreError.invalid("invalid_cursor", "cursor is not a cursor returned by query.find")
        guard let bytes = Base64URL.decode(token), let json = try? JSONParser().parse(bytes),
            case .array(let keys)? = json["k"], let id = json["i"]?.stringValue, let shape = json["s"]?.stringValue
        else { throw bad }
        guard shape == query.shape else {
            throw .invalid("invalid_cursor", "cursor belongs to a query with a different collection or sort")
        }
        guard keys.count == 2 * query.sort.count else { throw bad }
        return QueryCursor(keys: keys, id: id, shape: shape)
    }
}

/// Projection of documents onto a list of field paths (`_id` is always kept).
public enum Projection {
    /// Keeps only `fields` (and `_id`) of `doc`, rebuilding nested objects along each path.
    public static func apply(_ fields: [FieldPath], to doc: [String: JSONValue]) -> [String: JSONValue] {
        var out: [String: JSONValue] = [:]
        if let id = doc["_id"] { out["_id"] = id }
        for path in fields {
            guard let value = path.lookup(in: doc) else { continue }
            insert(value, at: path.segments[...], into: &out)
        }
        return out
    }

    private static func insert(_ value: JSONValue, at path: ArraySlice<String>, into object: inout [String: JSONValue]) {
        let head = path.first!
        if path.count == 1 {
            object[head] = value
            return
        }
        var child = object[head]?.objectValue ?? [:]
        insert(value, at: path.dropFirst(), into: &child)
        object[head] = .object(child)
    }
}
