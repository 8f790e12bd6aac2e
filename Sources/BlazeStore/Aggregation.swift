import BlazeProtocol
import Foundation
import GRDB

/// One aggregate of `query.aggregate`: what it computes over the documents of a group.
public enum Aggregate: Sendable, Equatable {
    /// How many documents.
    case count
    /// The sum of the numbers at a path (others ignored; 0 when there are none).
    case sum(FieldPath)
    /// The mean of the numbers at a path (null when there are none).
    case avg(FieldPath)
    /// The smallest value at a path in the query type order (missing and null ignored; null when none).
    case min(FieldPath)
    /// The largest value at a path in the query type order (missing and null ignored; null when none).
    case max(FieldPath)

    /// Most aggregates one query may compute.
    public static let maxCount = 32

    /// Parses `{"$count": {}}`, `{"$sum": "path"}`, `{"$avg": …}`, `{"$min": …}` or `{"$max": …}`.
    public static func parse(_ name: String, _ json: JSONValue) throws(StoreError) -> Aggregate {
        guard case .object(let o) = json, o.count == 1, let (op, arg) = o.first else {
            throw .invalid(
                "invalid_aggregate",
                "aggregate \(Names.quoted(name)) must be an object with one operator: $count, $sum, $avg, $min or $max")
        }
        if op == "$count" {
            guard arg == .object([:]) || arg == .bool(true) else {
                throw .invalid("invalid_aggregate", "aggregate \(Names.quoted(name)): $count takes {} (got \(arg.typeName))")
            }
            return .count
        }
        guard case .string(let dotted) = arg else {
            throw .invalid("invalid_aggregate", "aggregate \(Names.quoted(name)): \(op) takes a field path (got \(arg.typeName))")
        }
        let path = try FieldPath(dotted)
        switch op {
        case "$sum": return .sum(path)
        case "$avg": return .avg(path)
        case "$min": return .min(path)
        case "$max": return .max(path)
        default:
            throw .invalid(
                "invalid_aggregate", "aggregate \(Names.quoted(name)): unknown operator \(Names.quoted(op)); use $count, $sum, $avg, $min or $max")
        }
    }
}

/// A `query.aggregate`: the matching documents of a collection, grouped by the values at some paths.
public struct AggregateQuery: Sendable {
    /// Collection name.
    public var collection: String
    /// Which documents.
    public var filter: Filter
    /// Group by the values at these paths (none: one group of every matching document).
    public var group: [FieldPath]
    /// What to compute per group, by result name (returned in name order).
    public var aggregates: [(name: String, aggregate: Aggregate)]
    /// Most groups returned.
    public var limit: Int

    /// Creates a query.
    public init(
        collection: String, filter: Filter = .all, group: [FieldPath] = [],
        aggregates: [(name: String, aggregate: Aggregate)], limit: Int = 1000
    ) {
        self.collection = collection
        self.filter = filter
        self.group = group
        self.aggregates = aggregates
        self.limit = limit
    }
}

/// The groups of an aggregation, in the order of their keys.
public struct AggregateResult: Sendable, Equatable {
    /// One group: the values of the group paths (null when missing) and the computed aggregates.
    public struct Group: Sendable, Equatable {
        /// Group path → value.
        public var key: [String: JSONValue]
        /// Aggregate name → value.
        public var values: [String: JSONValue]
    }

    /// The groups.
    public var groups: [Group]
    /// True when there were more groups than the limit.
    public var truncated: Bool
}

extension QueryCompiler {
    /// Ranks and their columns: min and max compute one column per type rank (1 booleans … 5 objects), so the result
    /// follows the query type order across types, as sorts do.
    static let valueRanks = 1...5

    /// Compiles an aggregation: per group path its rank and value, then each aggregate's columns.
    static func aggregate(_ q: AggregateQuery, limit: Int) -> CompiledSQL {
        var args: [DatabaseValue] = []
        var columns: [String] = []
        var groupBy: [String] = []
        for path in q.group {
            columns += [rankSQL(path), valueSQL(path)]
            groupBy += [rankSQL(path), valueSQL(path)]
        }
        for (_, a) in q.aggregates {
            switch a {
            case .count:
                columns.append("count(*)")
            case .sum(let p):
                // Integers exactly, in two halves that cannot overflow (combined in Swift), and doubles apart: SQLite's
                // sum() fails the whole statement when one group's integers overflow.
                let type = p.isID ? "'text'" : "json_type(body, \(pathLiteral(p)))"
                let value = valueSQL(p)
                columns += [
                    "sum(CASE WHEN \(type) = 'integer' THEN \(value) >> 32 END)",
                    "sum(CASE WHEN \(type) = 'integer' THEN \(value) & 4294967295 END)",
                    "total(CASE WHEN \(type) = 'real' THEN \(value) END)",
                    "count(CASE WHEN \(type) = 'real' THEN 1 END)",
                ]
            case .avg(let p):
                columns.append("avg(CASE WHEN \(rankSQL(p)) = 2 THEN \(valueSQL(p)) END)")
            case .min(let p), .max(let p):
                let fn = if case .min = a { "min" } else { "max" }
                for r in valueRanks { columns.append("\(fn)(CASE WHEN \(rankSQL(p)) = \(r) THEN \(valueSQL(p)) END)") }
            }
        }
        var sql = "SELECT \(columns.joined(separator: ", ")) FROM docs WHERE collection = '\(q.collection)'"
        if q.filter != .all { sql += " AND \(compile(q.filter, &args))" }
        if !groupBy.isEmpty {
            sql += " GROUP BY \(groupBy.joined(separator: ", ")) ORDER BY \(groupBy.joined(separator: ", ")) LIMIT \(limit)"
        }
        return CompiledSQL(sql: sql, values: args)
    }
}

extension BlazeDatabase {
    /// Groups the documents of a collection matching a filter and computes aggregates per group (an empty result for a
    /// collection that does not exist, and with no group paths, one group even when nothing matches).
    public func aggregate(_ q: AggregateQuery) throws -> AggregateResult {
        try Names.validateCollection(q.collection)
        guard q.limit >= 1, q.limit <= limits.maxQueryLimit else {
            throw StoreError(
                .limitExceeded, kind: "limit_out_of_range", "limit must be between 1 and \(limits.maxQueryLimit), got \(q.limit)")
        }
        guard !q.aggregates.isEmpty, q.aggregates.count <= Aggregate.maxCount else {
            throw StoreError.invalid("invalid_aggregate", "give 1 to \(Aggregate.maxCount) aggregates")
        }
        guard q.group.count <= limits.maxIndexFields else {
            throw StoreError.invalid("invalid_aggregate", "group by at most \(limits.maxIndexFields) paths")
        }
        guard Set(q.group).count == q.group.count else {
            throw StoreError.invalid("invalid_aggregate", "group paths must be distinct")
        }
        return try read { db in try Self.runAggregate(db, q) }
    }

    static func runAggregate(_ db: Database, _ q: AggregateQuery) throws -> AggregateResult {
        let compiled = QueryCompiler.aggregate(q, limit: q.limit + 1)
        var groups: [AggregateResult.Group] = []
        let rows = try Row.fetchCursor(db, sql: compiled.sql, arguments: compiled.arguments)
        while let row = try rows.next() {
            if groups.count == q.limit { return AggregateResult(groups: groups, truncated: true) }
            var column = 0
            func next() -> DatabaseValue {
                defer { column += 1 }
                return row[column]
            }
            var key: [String: JSONValue] = [:]
            for path in q.group {
                let rank = Int64.fromDatabaseValue(next()) ?? 0
                key[path.description] = try value(next(), rank: rank)
            }
            var values: [String: JSONValue] = [:]
            for (name, a) in q.aggregates {
                switch a {
                case .count:
                    values[name] = .int(Int64.fromDatabaseValue(next()) ?? 0)
                case .sum:
                    let (high, low) = (Int64.fromDatabaseValue(next()) ?? 0, Int64.fromDatabaseValue(next()) ?? 0)
                    let (doubles, doubleCount) = (Double.fromDatabaseValue(next()) ?? 0, Int64.fromDatabaseValue(next()) ?? 0)
                    values[name] = Self.sum(high: high, low: low, doubles: doubles, doubleCount: doubleCount)
                case .avg:
                    values[name] = try value(next(), rank: 2)
                case .min, .max:
                    let perRank = QueryCompiler.valueRanks.map { _ in next() }
                    let order: [Int] = if case .min = a { Array(QueryCompiler.valueRanks) } else { QueryCompiler.valueRanks.reversed() }
                    let first = order.first { !perRank[$0 - 1].isNull }
                    values[name] = try first.map { try value(perRank[$0 - 1], rank: Int64($0)) } ?? .null
                }
            }
            groups.append(AggregateResult.Group(key: key, values: values))
        }
        return AggregateResult(groups: groups, truncated: false)
    }

    /// A `$sum` from its parts: the integers as `high · 2^32 + low` (exact while that fits in 64 bits, else a double, as
    /// counters do), plus the doubles' total when there are any (the result is then a double).
    static func sum(high: Int64, low: Int64, doubles: Double, doubleCount: Int64) -> JSONValue {
        let (shifted, o1) = high.multipliedReportingOverflow(by: 1 << 32)
        let (ints, o2) = shifted.addingReportingOverflow(low)
        let intsAsDouble = Double(high) * 4_294_967_296 + Double(low)
        if doubleCount > 0 { return .double((o1 || o2 ? intsAsDouble : Double(ints)) + doubles) }
        return o1 || o2 ? .double(intsAsDouble) : .int(ints)
    }

    /// The JSON value of a SQLite value whose type rank is known (0 null or missing, 1 boolean, 2 number, 3 string,
    /// 4 array, 5 object: their JSON text).
    static func value(_ v: DatabaseValue, rank: Int64) throws -> JSONValue {
        switch (rank, v.storage) {
        case (_, .null): return .null
        case (1, .int64(let i)): return .bool(i != 0)
        case (2, .int64(let i)): return .int(i)
        case (2, .double(let d)): return .double(d)
        case (4, .string(let s)), (5, .string(let s)): return try JSONParser(maxDepth: 10_000).parse(s)
        case (_, .string(let s)): return .string(s)
        default: return jsonValue(v)
        }
    }
}
