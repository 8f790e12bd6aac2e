import BlazeCRDT
import BlazeProtocol

/// Validation rules for names and identifiers; messages state the rule so users can fix their input.
public enum Names {
    /// Maximum length of a document id in UTF-8 bytes.
    public static let maxIDBytes = 512

    private static func matches(_ s: String, max: Int, allowDotFirst: Bool = false) -> Bool {
        let bytes = Array(s.utf8)
        guard !bytes.isEmpty, bytes.count <= max else { return false }
        for (i, b) in bytes.enumerated() {
            switch b {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "_"), UInt8(ascii: "-"):
                continue
            case UInt8(ascii: "."):
                if i == 0 && !allowDotFirst { return false }
            default: return false
            }
        }
        return true
    }

    /// Database names: `[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}` (they become file names).
    public static func validateDatabase(_ name: String) throws(StoreError) {
        guard matches(name, max: 64) else {
            throw .invalid(
                "invalid_name", "database name must match [A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}, got \(quoted(name))")
        }
    }

    /// Collection names: `[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}`.
    public static func validateCollection(_ name: String) throws(StoreError) {
        guard matches(name, max: 128) else {
            throw .invalid(
                "invalid_name", "collection name must match [A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}, got \(quoted(name))")
        }
    }

    /// Index names: `[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}`.
    public static func validateIndex(_ name: String) throws(StoreError) {
        guard matches(name, max: 128) else {
            throw .invalid(
                "invalid_name", "index name must match [A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}, got \(quoted(name))")
        }
    }

    /// Document ids: any non-empty string of at most 512 UTF-8 bytes without control characters.
    public static func validateID(_ id: String) throws(StoreError) {
        let count = id.utf8.count
        guard count > 0, count <= maxIDBytes, !id.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F })
        else {
            throw .invalid(
                "invalid_id", "document id must be a non-empty string of at most \(maxIDBytes) bytes without control characters")
        }
    }

    /// Top-level field names written by clients: non-empty, not starting with `_` (reserved) and without `.` (it
    /// separates the segments of a field path).
    ///
    /// `WriteTransaction.scanNames` finds the names this rejects in its one pass over a document without calling it
    /// for each name: a new rule here must be added there too (`rejectsInvalidDocuments` covers both).
    public static func validateFieldName(_ name: String) throws(StoreError) {
        // The first byte: a name that starts with "_" and a combining mark is reserved too (its first Character is not
        // "_", but its text starts with it).
        guard let first = name.utf8.first else { throw .invalid("invalid_field", "field names must not be empty") }
        guard first != UInt8(ascii: "_") else {
            throw .invalid("reserved_field", "field names starting with '_' are reserved (got \(quoted(name)))")
        }
        guard !NestedPath.isNested(name) else {
            throw .invalid(
                "invalid_field", "field names may not contain '.', which separates the segments of a path (got \(quoted(name)))")
        }
    }

    /// Most segments a field path written by a patch may have.
    public static let maxPathSegments = 32

    /// A field a patch (or a remote change) edits: a top-level name, or the dotted path of a nested field
    /// (`address.city`) whose first segment is a valid field name and whose segments are non-empty.
    public static func validateFieldPath(_ path: String) throws(StoreError) {
        guard NestedPath.isNested(path) else { return try validateFieldName(path) }
        let segments = path.split(separator: ".", omittingEmptySubsequences: false)
        guard segments.allSatisfy({ !$0.isEmpty }) else {
            throw .invalid("invalid_path", "field path \(quoted(path)) must be non-empty segments joined by '.'")
        }
        guard segments.count <= maxPathSegments else {
            throw .invalid("invalid_path", "field path \(quoted(path)) has more than \(maxPathSegments) segments")
        }
        guard segments[0].utf8.first != UInt8(ascii: "_") else {
            throw .invalid("reserved_field", "field names starting with '_' are reserved (got \(quoted(path)))")
        }
    }

    /// Splits a dotted field path (`a.b.c`) into segments; `_id` is allowed, other `_` fields are not.
    ///
    /// Segments must be non-empty and may not contain `"` or `\` (they are quoted in SQLite JSON paths).
    public static func parsePath(_ path: String) throws(StoreError) -> [String] {
        // One pass over the UTF-8 bytes (Foundation's `String.contains` was most of parsing a filter): a control
        // character is a byte below 0x20, as no other scalar's UTF-8 has one.
        var segments: [String] = []
        var start = path.utf8.startIndex
        var empty = path.isEmpty
        var refused = false
        for i in path.utf8.indices {
            switch path.utf8[i] {
            case UInt8(ascii: "."):
                empty = empty || i == start
                segments.append(String(path[start..<i]))
                start = path.utf8.index(after: i)
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), 0..<0x20: refused = true
            default: break
            }
        }
        empty = empty || start == path.utf8.endIndex
        guard !empty else {
            throw .invalid("invalid_path", "field path \(quoted(path)) must be non-empty segments joined by '.'")
        }
        guard !refused else {
            throw .invalid("invalid_path", "field path \(quoted(path)) may not contain '\"', '\\' or control characters")
        }
        segments.append(String(path[start...]))
        return segments
    }

    static func quoted(_ s: String) -> String {
        JSONValue.string(s.count > 80 ? String(s.prefix(80)) + "…" : s).jsonText
    }
}
