/// The type order used by comparisons and sorting: null/missing < booleans < numbers < strings < arrays < objects.
public enum TypeRank {
    /// Rank of a value; nil (missing) ranks with null.
    public static func of(_ v: JSONValue?) -> Int {
        switch v {
        case nil, .null?: return 0
        case .bool?: return 1
        case .int?, .double?: return 2
        case .string?: return 3
        case .array?: return 4
        case .object?: return 5
        }
    }

    /// Orders two values of the same rank as SQLite orders their `json_extract` values.
    ///
    /// Booleans as 0/1, numbers exactly (integers against doubles without rounding), strings by UTF-8 bytes,
    /// arrays and objects by their canonical JSON text.
    public static func compareSameRank(_ a: JSONValue, _ b: JSONValue) -> Int {
        switch (a, b) {
        case (.bool(let x), .bool(let y)): return x == y ? 0 : (x ? 1 : -1)
        case (.int(let x), .int(let y)): return x == y ? 0 : (x < y ? -1 : 1)
        case (.double(let x), .double(let y)): return x == y ? 0 : (x < y ? -1 : 1)
        case (.int(let x), .double(let y)): return compareIntDouble(x, y)
        case (.double(let x), .int(let y)): return -compareIntDouble(y, x)
        case (.string(let x), .string(let y)): return compareBytes(x.utf8, y.utf8)
        case (.array, .array), (.object, .object): return compareBytes(a.jsonBytes, b.jsonBytes)
        default: return 0
        }
    }

    /// Full order of two optional values: rank first, then `compareSameRank`.
    public static func compare(_ a: JSONValue?, _ b: JSONValue?) -> Int {
        let ra = of(a)
        let rb = of(b)
        if ra != rb { return ra < rb ? -1 : 1 }
        guard ra != 0, let a, let b else { return 0 }
        return compareSameRank(a, b)
    }

    /// Orders two byte sequences lexicographically (-1, 0, 1).
    public static func compareBytes<A: Sequence, B: Sequence>(_ a: A, _ b: B) -> Int
    where A.Element == UInt8, B.Element == UInt8 {
        var ia = a.makeIterator()
        var ib = b.makeIterator()
        while true {
            switch (ia.next(), ib.next()) {
            case (nil, nil): return 0
            case (nil, _): return -1
            case (_, nil): return 1
            case (let x?, let y?): if x != y { return x < y ? -1 : 1 }
            }
        }
    }

    /// Exact order of an integer and a double (-1, 0, 1).
    public static func compareIntDouble(_ i: Int64, _ d: Double) -> Int {
        if d >= 9_223_372_036_854_775_808.0 { return -1 }
        if d < -9_223_372_036_854_775_808.0 { return 1 }
        let whole = d.rounded(.down)
        let w = Int64(whole)
        if i != w { return i < w ? -1 : 1 }
        return d > whole ? -1 : 0
    }
}
