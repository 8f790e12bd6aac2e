/// One JSON-RPC 2.0 request as received: `id` is nil for notifications (which get no reply).
public struct RPCRequest: Sendable, Equatable {
    /// The request id (string, number or null); nil when the member was absent (a notification).
    public var id: JSONValue?
    /// The method name, `area.verb`.
    public var method: String
    /// Parameters by name; absent params are an empty object.
    public var params: [String: JSONValue]

    /// Creates a request.
    public init(id: JSONValue?, method: String, params: [String: JSONValue]) {
        self.id = id
        self.method = method
        self.params = params
    }

    /// True when no reply is expected.
    public var isNotification: Bool { id == nil }

    /// The request as a JSON object.
    public var jsonValue: JSONValue {
        var o: [String: JSONValue] = ["jsonrpc": "2.0", "method": .string(method), "params": .object(params)]
        if let id { o["id"] = id }
        return .object(o)
    }
}

/// What one input line decodes to, before any method runs.
public enum RPCIncoming: Sendable {
    /// A single request, or the error response owed for an invalid one.
    case single(Result<RPCRequest, RPCFailure>)
    /// A batch: one entry per element, in order.
    case batch([Result<RPCRequest, RPCFailure>])
    /// The line is not usable at all (parse error, empty batch, batch over the cap); reply with this.
    case failure(RPCFailure)
}

/// An error tied to the request id it answers (null when the id could not be read).
public struct RPCFailure: Error, Sendable, Equatable {
    /// The id to answer with.
    public var id: JSONValue
    /// The error.
    public var error: RPCError

    /// Creates a failure.
    public init(id: JSONValue, error: RPCError) {
        self.id = id
        self.error = error
    }
}

/// Decoding and encoding of line-delimited JSON-RPC 2.0.
public enum RPCCodec {
    /// Decodes one line (without its newline) into requests, enforcing nesting depth and batch size.
    public static func decode<Bytes: Collection>(line: Bytes, maxDepth: Int, maxBatch: Int) -> RPCIncoming
    where Bytes.Element == UInt8 {
        let value: JSONValue
        do {
            value = try JSONParser(maxDepth: maxDepth).parse(line)
        } catch {
            return .failure(RPCFailure(id: .null, error: parseError(error)))
        }
        if case .array(let items) = value {
            if items.isEmpty {
                return .failure(RPCFailure(id: .null, error: .invalidRequest("empty batch")))
            }
            if items.count > maxBatch {
                return .failure(
                    RPCFailure(
                        id: .null,
                        error: RPCError(
                            code: RPCErrorCode.limitExceeded, kind: "batch_too_large",
                            message: "batch of \(items.count) requests exceeds the limit of \(maxBatch)",
                            details: ["limit": .int(Int64(maxBatch))])))
            }
            return .batch(items.map(request(from:)))
        }
        return .single(request(from: value))
    }

    /// Maps a JSON parse error to the -32700 response error.
    public static func parseError(_ error: JSONParseError) -> RPCError {
        let kind: String
        switch error.kind {
        case "depth": kind = "nesting_too_deep"
        case "invalid_utf8": kind = "invalid_utf8"
        case "number_range": kind = "number_out_of_range"
        case "duplicate_key": kind = "duplicate_key"
        default: kind = "parse_error"
        }
        return RPCError(code: RPCErrorCode.parseError, kind: kind, message: "invalid JSON: \(error.message)")
    }

    /// Validates the shape of one request object.
    public static func request(from value: JSONValue) -> Result<RPCRequest, RPCFailure> {
        guard case .object(let o) = value else {
            return .failure(
                RPCFailure(id: .null, error: .invalidRequest("a request must be a JSON object, got \(value.typeName)")))
        }
        let id = o["id"]
        let replyID = id ?? .null
        if let id {
            switch id {
            case .string, .int, .null: break
            case .double: break
            default:
                return .failure(
                    RPCFailure(id: .null, error: .invalidRequest("id must be a string, number or null")))
            }
        }
        guard o["jsonrpc"] == .string("2.0") else {
            return .failure(RPCFailure(id: replyID, error: .invalidRequest("jsonrpc must be \"2.0\"")))
        }
        guard let method = o["method"]?.stringValue else {
            return .failure(RPCFailure(id: replyID, error: .invalidRequest("method must be a string")))
        }
        let params: [String: JSONValue]
        switch o["params"] {
        case nil: params = [:]
        case .object(let p)?: params = p
        case .array?:
            return .failure(
                RPCFailure(
                    id: replyID, error: .invalidParams("params must be an object (parameters are passed by name)")))
        case let other?:
            return .failure(
                RPCFailure(id: replyID, error: .invalidRequest("params must be an object, got \(other.typeName)")))
        }
        for key in o.keys where !["jsonrpc", "id", "method", "params"].contains(key) {
            return .failure(RPCFailure(id: replyID, error: .invalidRequest("unknown request member \"\(key)\"")))
        }
        return .success(RPCRequest(id: id, method: method, params: params))
    }

    /// A success response object.
    public static func response(id: JSONValue, result: JSONValue) -> JSONValue {
        .object(["jsonrpc": "2.0", "id": id, "result": result])
    }

    /// The bytes of a success response whose result is already JSON text (spliced in as is; it must be valid JSON).
    public static func responseBytes(id: JSONValue, resultText: [UInt8]) -> [UInt8] {
        // Members in the order `JSONValue` writes an object's (sorted): id, jsonrpc, result.
        var out = Array("{\"id\":".utf8)
        out.reserveCapacity(out.count + 32 + resultText.count)
        out += id.jsonBytes
        out += Array(",\"jsonrpc\":\"2.0\",\"result\":".utf8)
        out += resultText
        out.append(UInt8(ascii: "}"))
        return out
    }

    /// An error response object.
    public static func response(id: JSONValue, error: RPCError) -> JSONValue {
        .object(["jsonrpc": "2.0", "id": id, "error": error.jsonValue])
    }

    /// A notification object (server to client).
    public static func notification(method: String, params: JSONValue) -> JSONValue {
        .object(["jsonrpc": "2.0", "method": .string(method), "params": params])
    }
}
