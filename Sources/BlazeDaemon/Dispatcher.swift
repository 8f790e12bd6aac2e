import BlazeProtocol
import BlazeStore
import GRDB
import Logging

/// Turns one request line into one response line: decode, validate, run the method, map errors in one place.
struct Dispatcher: Sendable {
    let context: RequestContext

    /// Handles a line; returns the response bytes (without newline), or nil when nothing is owed (notifications).
    func handle(line: some Collection<UInt8>, connection: Int) async -> [UInt8]? {
        let limits = context.config.limits
        switch RPCCodec.decode(line: line, maxDepth: limits.maxDepth, maxBatch: limits.maxBatch) {
        case .failure(let f):
            return RPCCodec.response(id: f.id, error: f.error).jsonBytes
        case .single(let r):
            return await respond(r, connection: connection)?.jsonBytes
        case .batch(let items):
            var responses: [JSONValue] = []
            for item in items {
                if let r = await respond(item, connection: connection) { responses.append(r) }
            }
            return responses.isEmpty ? nil : JSONValue.array(responses).jsonBytes
        }
    }

    func respond(_ item: Result<RPCRequest, RPCFailure>, connection: Int) async -> JSONValue? {
        switch item {
        case .failure(let f):
            return RPCCodec.response(id: f.id, error: f.error)
        case .success(let req):
            let outcome = await call(req, connection: connection)
            guard let id = req.id else { return nil }
            switch outcome {
            case .success(let v): return RPCCodec.response(id: id, result: v)
            case .failure(let e): return RPCCodec.response(id: id, error: e)
            }
        }
    }

    func call(_ req: RPCRequest, connection: Int) async -> Result<JSONValue, RPCError> {
        guard let method = context.registry.methods[req.method] else {
            return .failure(
                RPCError(
                    code: RPCErrorCode.methodNotFound, kind: "method_not_found",
                    message: "unknown method \"\(req.method)\"; rpc.discover lists the methods"))
        }
        do {
            let params = try method.validate(req.params)
            return .success(try await method.handler(params, context))
        } catch {
            return .failure(map(error, method: req.method, connection: connection))
        }
    }

    /// The single mapping from any error to the JSON-RPC error a client sees.
    func map(_ error: any Error, method: String, connection: Int) -> RPCError {
        switch error {
        case let e as RPCError:
            return e
        case let e as StoreError:
            let code: Int
            switch e.code {
            case .notFound: code = RPCErrorCode.notFound
            case .alreadyExists: code = RPCErrorCode.conflict
            case .invalidArgument: code = RPCErrorCode.invalidParams
            case .limitExceeded: code = RPCErrorCode.limitExceeded
            default:
                context.logger.error(
                    "Store failure",
                    metadata: ["rpc.method": "\(method)", "connection.id": "\(connection)", "error": "\(e)"])
                return .internalError()
            }
            return RPCError(code: code, kind: e.kind, message: e.message, details: e.details)
        case is CancellationError:
            return RPCError(code: RPCErrorCode.unavailable, kind: "shutting_down", message: "the daemon is shutting down")
        default:
            context.logger.error(
                "Request failed",
                metadata: ["rpc.method": "\(method)", "connection.id": "\(connection)", "error": "\(String(reflecting: error))"])
            return .internalError()
        }
    }
}
