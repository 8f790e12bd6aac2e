/// A JSON-RPC error as sent to clients: numeric code, stable `data.kind`, and a message that says what to do.
public struct RPCError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The JSON-RPC error code (see `RPCErrorCode`).
    public var code: Int
    /// Stable machine-readable reason, sent as `data.kind`.
    public var kind: String
    /// Human-readable explanation.
    public var message: String
    /// Extra members merged into `data` next to `kind`.
    public var details: [String: JSONValue]

    /// Creates an error.
    public init(code: Int, kind: String, message: String, details: [String: JSONValue] = [:]) {
        self.code = code
        self.kind = kind
        self.message = message
        self.details = details
    }

    /// "message (kind)".
    public var description: String { "\(message) (\(kind))" }

    /// The `error` member of a response.
    public var jsonValue: JSONValue {
        var data = details
        data["kind"] = .string(kind)
        return .object(["code": .int(Int64(code)), "message": .string(message), "data": .object(data)])
    }

    /// Reads an error member back (used by clients); nil when the shape is wrong.
    public init?(json: JSONValue) {
        guard let code = json["code"]?.intValue, let message = json["message"]?.stringValue else { return nil }
        var details = json["data"]?.objectValue ?? [:]
        let kind = details.removeValue(forKey: "kind")?.stringValue ?? "unknown"
        self.init(code: Int(code), kind: kind, message: message, details: details)
    }
}

/// The error codes BlazeDB uses: the JSON-RPC 2.0 standard ones plus an application range.
public enum RPCErrorCode {
    /// Invalid JSON was received (syntax, invalid UTF-8, nesting too deep, number out of range).
    public static let parseError = -32700
    /// The JSON is not a valid request object (or an empty batch).
    public static let invalidRequest = -32600
    /// The method does not exist.
    public static let methodNotFound = -32601
    /// Missing, unknown or wrongly typed parameters, or invalid values.
    public static let invalidParams = -32602
    /// A bug or an I/O failure in the daemon; details are in the daemon's log.
    public static let internalError = -32603
    /// A database, collection, document, index or subscription does not exist.
    public static let notFound = -32010
    /// The target already exists or the write conflicts with current state.
    public static let conflict = -32011
    /// A configured limit was exceeded (line length, batch size, document size, connections...).
    public static let limitExceeded = -32012
    /// The daemon is shutting down and accepts no new work.
    public static let unavailable = -32014
    /// Sync cannot proceed: the database is not shared, its key is missing, sync is not enabled.
    public static let syncError = -32020
}

extension RPCError {
    /// -32602 with kind `invalid_params`.
    public static func invalidParams(_ message: String, kind: String = "invalid_params") -> RPCError {
        RPCError(code: RPCErrorCode.invalidParams, kind: kind, message: message)
    }

    /// -32600 with kind `invalid_request`.
    public static func invalidRequest(_ message: String) -> RPCError {
        RPCError(code: RPCErrorCode.invalidRequest, kind: "invalid_request", message: message)
    }

    /// -32603 with kind `internal`; never carries internal details.
    public static func internalError(_ message: String = "internal error; see the daemon log") -> RPCError {
        RPCError(code: RPCErrorCode.internalError, kind: "internal", message: message)
    }
}
