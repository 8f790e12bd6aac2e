import BlazeProtocol
import BlazeStore
import Logging
import NIOPosix

/// Turns one request line into one response line: decode, validate, run the method, map errors in one place.
struct Dispatcher: Sendable {
    let context: RequestContext
    /// Where requests that may block (writes, queries) run.
    let pool: NIOThreadPool
    /// Where long transfers run (`MethodHandler.transfers`); nil: on `pool`.
    let transferPool: NIOThreadPool?
    /// The handler of every method.
    let methods = MethodTable()

    /// A dispatcher running blocking requests on `pool`, and long transfers on `transferPool` (nil: on `pool`).
    init(context: RequestContext, pool: NIOThreadPool, transferPool: NIOThreadPool? = nil) {
        self.context = context
        self.pool = pool
        self.transferPool = transferPool
    }

    /// The pool a line that does not run inline runs on: the transfer pool for a request to a transfer method, or a
    /// batch holding one (a batch of transfers must not hold the I/O pool either).
    func pool(for incoming: RPCIncoming) -> NIOThreadPool {
        guard let transferPool else { return pool }
        func transfers(_ r: Result<RPCRequest, RPCFailure>) -> Bool {
            guard case .success(let req) = r else { return false }
            return methods[req.method]?.transfers == true
        }
        switch incoming {
        case .single(let r): return transfers(r) ? transferPool : pool
        case .batch(let items): return items.contains(where: transfers) ? transferPool : pool
        case .failure: return pool
        }
    }

    /// Decodes a line (on the event loop; cheap).
    func prepare(line: some Collection<UInt8>) -> RPCIncoming {
        let config = context.config
        return RPCCodec.decode(line: line, maxDepth: config.storeLimits.maxDepth, maxBatch: config.limits.maxBatch)
    }

    /// True when the line may start on the event loop: every method it calls only reads a little, or it is one
    /// request to a budgeted read (`MethodHandler.budgeted`; `executeInline` tells when it must move to the pool).
    func runsInline(_ incoming: RPCIncoming) -> Bool {
        func inline(_ r: Result<RPCRequest, RPCFailure>, alone: Bool) -> Bool {
            guard case .success(let req) = r, let method = methods[req.method] else { return true }
            return method.runsInline || (alone && method.budgeted)
        }
        switch incoming {
        case .failure: return true
        case .single(let r): return inline(r, alone: true)
        case .batch(let items): return items.allSatisfy { inline($0, alone: false) }
        }
    }

    /// Runs a line that `runsInline` on the event loop, budgeted reads within `ReadBudget.inline`; nil when such a
    /// read ran out of its budget (nothing was answered: run the line again with `execute`, on the pool).
    func executeInline(_ incoming: RPCIncoming, connection: ConnectionHandle) -> [UInt8]?? {
        do {
            return .some(try execute(incoming, connection: connection, budget: .inline))
        } catch {
            return nil
        }
    }

    /// Runs a decoded line; returns the response bytes (without newline), or nil when nothing is owed.
    func execute(_ incoming: RPCIncoming, connection: ConnectionHandle) -> [UInt8]? {
        // An unbounded read never runs out of its budget.
        (try? execute(incoming, connection: connection, budget: .unbounded)) ?? nil
    }

    private func execute(
        _ incoming: RPCIncoming, connection: ConnectionHandle, budget: ReadBudget
    ) throws(ReadBudgetExceeded) -> [UInt8]? {
        switch incoming {
        case .failure(let f):
            context.metrics?.malformed(kind: f.error.kind)
            return RPCCodec.response(id: f.id, error: f.error).jsonBytes
        case .single(.success(let req)) where methods[req.method]?.text != nil:
            return try respondWithText(req, connection: connection, budget: budget)
        case .single(let r):
            return try respond(r, connection: connection, budget: budget)?.jsonBytes
        case .batch(let items):
            let responses = items.compactMap { respond($0, connection: connection) }
            return responses.isEmpty ? nil : JSONValue.array(responses).jsonBytes
        }
    }

    /// The response bytes of a request whose method returns its result as JSON text, spliced in unparsed.
    func respondWithText(
        _ req: RPCRequest, connection: ConnectionHandle, budget: ReadBudget = .unbounded
    ) throws(ReadBudgetExceeded) -> [UInt8]? {
        let started = ContinuousClock.now
        var context = self.context
        context.connection = connection
        context.readBudget = budget
        let result: Result<[UInt8], RPCError>
        do {
            result = .success(try methods[req.method]!.text!(req.params, context))
        } catch let e as ReadBudgetExceeded where budget == .inline {
            throw e
        } catch {
            result = .failure(map(error, method: req.method, connection: connection.id))
        }
        finished(req, connection: connection, started: started, result: result.map { _ in .null })
        guard let id = req.id else { return nil }
        switch result {
        case .success(let text): return RPCCodec.responseBytes(id: id, resultText: text)
        case .failure(let e): return RPCCodec.response(id: id, error: e).jsonBytes
        }
    }

    func respond(_ item: Result<RPCRequest, RPCFailure>, connection: ConnectionHandle) -> JSONValue? {
        (try? respond(item, connection: connection, budget: .unbounded)) ?? nil
    }

    private func respond(
        _ item: Result<RPCRequest, RPCFailure>, connection: ConnectionHandle, budget: ReadBudget
    ) throws(ReadBudgetExceeded) -> JSONValue? {
        switch item {
        case .failure(let f):
            context.metrics?.malformed(kind: f.error.kind)
            return RPCCodec.response(id: f.id, error: f.error)
        case .success(let req):
            let outcome = try call(req, connection: connection, budget: budget)
            guard let id = req.id else { return nil }
            switch outcome {
            case .success(let v): return RPCCodec.response(id: id, result: v)
            case .failure(let e): return RPCCodec.response(id: id, error: e)
            }
        }
    }

    /// Runs one request; counts it (`DaemonMetrics`), and at debug level logs its method, connection, duration and
    /// outcome (never its params).
    func call(
        _ req: RPCRequest, connection: ConnectionHandle, budget: ReadBudget = .unbounded
    ) throws(ReadBudgetExceeded) -> Result<JSONValue, RPCError> {
        let started = ContinuousClock.now
        let result = try run(req, connection: connection, budget: budget)
        finished(req, connection: connection, started: started, result: result)
        return result
    }

    /// Counts a finished request and logs it at debug level.
    private func finished(
        _ req: RPCRequest, connection: ConnectionHandle, started: ContinuousClock.Instant, result: Result<JSONValue, RPCError>
    ) {
        if let metrics = context.metrics {
            switch result {
            case .success: metrics.request(req.method, kind: nil, started: started)
            case .failure(let e): metrics.request(req.method, kind: e.kind, started: started)
            }
        }
        if context.logger.logLevel <= .debug { log(req, connection: connection, started: started, result: result) }
    }

    /// The request and its write handler when the line is one request to a method that queues its write for a group
    /// commit (a single-operation write); nil otherwise.
    func submission(_ incoming: RPCIncoming) -> (RPCRequest, MethodHandler.Submit)? {
        guard case .single(.success(let req)) = incoming, let submit = methods[req.method]?.submit else { return nil }
        return (req, submit)
    }

    /// Validates `req` and queues its write; `done` gets the response bytes (nil when nothing is owed) once the write
    /// is durable or has failed, on whichever thread finished it. With `here`, a write that finds no group commit
    /// under way commits on the calling thread, and `done` runs before this returns (as it does for invalid params).
    func submit(
        _ req: RPCRequest, _ submit: MethodHandler.Submit, connection: ConnectionHandle, here: Bool,
        done: @escaping @Sendable ([UInt8]?) -> Void
    ) {
        let started = ContinuousClock.now
        let finish: MethodHandler.Reply = { outcome in
            let result = outcome.mapError { map($0, method: req.method, connection: connection.id) }
            finished(req, connection: connection, started: started, result: result)
            guard let id = req.id else { return done(nil) }
            switch result {
            case .success(let v): done(RPCCodec.response(id: id, result: v).jsonBytes)
            case .failure(let e): done(RPCCodec.response(id: id, error: e).jsonBytes)
            }
        }
        var context = self.context
        context.connection = connection
        do {
            try submit(req.params, context, here, finish)
        } catch {
            finish(.failure(error))
        }
    }

    private func log(
        _ req: RPCRequest, connection: ConnectionHandle, started: ContinuousClock.Instant, result: Result<JSONValue, RPCError>
    ) {
        let elapsed = ContinuousClock.now - started
        let micros = elapsed.components.seconds * 1_000_000 + elapsed.components.attoseconds / 1_000_000_000_000
        var metadata: Logger.Metadata = [
            "connection.id": "\(connection.id)", "rpc.method": "\(req.method)", "duration.us": "\(micros)",
        ]
        if case .failure(let e) = result {
            metadata["error.code"] = "\(e.code)"
            metadata["error.kind"] = "\(e.kind)"
        }
        context.logger.debug("Request", metadata: metadata)
    }

    func run(
        _ req: RPCRequest, connection: ConnectionHandle, budget: ReadBudget = .unbounded
    ) throws(ReadBudgetExceeded) -> Result<JSONValue, RPCError> {
        guard let method = methods[req.method] else {
            return .failure(
                RPCError(
                    code: RPCErrorCode.methodNotFound, kind: "method_not_found",
                    message: "unknown method \"\(req.method)\"; rpc.discover lists the methods"))
        }
        do {
            var context = self.context
            context.connection = connection
            context.readBudget = budget
            return .success(try method.run(req.params, context))
        } catch let e as ReadBudgetExceeded where budget == .inline {
            throw e
        } catch {
            return .failure(map(error, method: req.method, connection: connection.id))
        }
    }

    /// The client-facing form of a store error; nil for internal failures (whose details stay in the log).
    static func rpcError(_ e: StoreError) -> RPCError? {
        let code: Int
        switch e.code {
        case .notFound: code = RPCErrorCode.notFound
        case .alreadyExists: code = RPCErrorCode.conflict
        case .invalidArgument: code = RPCErrorCode.invalidParams
        case .limitExceeded: code = RPCErrorCode.limitExceeded
        case .unavailable: code = RPCErrorCode.unavailable
        case .syncFailure: code = RPCErrorCode.syncError
        default: return nil
        }
        return RPCError(code: code, kind: e.kind, message: e.message, details: e.details)
    }

    /// The single mapping from any error to the JSON-RPC error a client sees.
    func map(_ error: any Error, method: String, connection: Int) -> RPCError {
        switch error {
        case let e as RPCError:
            return e
        case let e as StoreError:
            guard let mapped = Self.rpcError(e) else {
                context.logger.error(
                    "Store failure",
                    metadata: ["rpc.method": "\(method)", "connection.id": "\(connection)", "error": "\(e)"])
                return .internalError()
            }
            return mapped
        default:
            context.logger.error(
                "Request failed",
                metadata: ["rpc.method": "\(method)", "connection.id": "\(connection)", "error": "\(String(reflecting: error))"])
            return .internalError()
        }
    }
}
