import BlazeProtocol
import BlazeStore
import Dispatch
import Synchronization

/// How the daemon runs one method: its typed parameters in, its typed result out (types generated from the
/// protocol document, `RPC.*`), and whether it may run on the event loop.
struct MethodHandler: Sendable {
    /// True for methods that only read a little and may run on the event loop; the rest run on the I/O pool.
    let runsInline: Bool
    /// True for reads that run on the event loop within `ReadBudget.inline` when they come alone on a line, and move
    /// to the I/O pool (unbounded) when that budget runs out: an indexed page is answered with no thread hop, a scan
    /// of a large collection does not hold the loop.
    var budgeted = false
    /// True for methods that move a file's worth of bytes (`blob.put`, `blob.get`): they run on the transfer pool, so
    /// a few long transfers never hold the I/O pool that writes and queries need.
    var transfers = false
    /// Validates the params against the method's declaration, runs it and encodes its result.
    let run: @Sendable ([String: JSONValue], RequestContext) throws -> JSONValue
    /// For single-operation writes: validates the params (on the event loop) and queues the write for its database's
    /// group commit; `reply` gets the encoded result once the write is durable. Nil for every other method.
    let submit: Submit?
    /// For reads that can hand back stored JSON text as it is: validates the params, runs the method and returns its
    /// result as JSON text, spliced into the response without being parsed and written again. Nil for the others.
    let text: (@Sendable ([String: JSONValue], RequestContext) throws -> [UInt8])?

    /// Where a submitted write's outcome goes.
    typealias Reply = @Sendable (Result<JSONValue, any Error>) -> Void
    /// Validates a write's params and queues it, replying once it is durable; with `here`, a write that finds no group
    /// commit under way commits on the calling thread, and `reply` runs before this returns.
    typealias Submit = @Sendable ([String: JSONValue], RequestContext, _ here: Bool, @escaping Reply) throws -> Void

    /// A method that runs on the I/O pool (writes, queries, anything that may block).
    init<P: RPCParameters>(_ params: P.Type, _ body: @escaping @Sendable (P, RequestContext) throws -> P.Result) {
        self.init(params, inline: false, body)
    }

    /// A method that runs inline when `inline` (cheap reads), else on the I/O pool; `budgeted`: see `budgeted`.
    init<P: RPCParameters>(
        _ params: P.Type, inline: Bool, budgeted: Bool = false,
        _ body: @escaping @Sendable (P, RequestContext) throws -> P.Result
    ) {
        self.runsInline = inline
        self.budgeted = budgeted
        self.run = { raw, context in P.encode(try body(try P(validating: raw), context)) }
        self.submit = nil
        self.text = nil
    }

    /// A read whose result `body` returns as JSON text (it must be the encoding of a valid `P.Result`); inside a batch
    /// the text is parsed back into a value.
    init<P: RPCParameters>(
        text params: P.Type, inline: Bool, budgeted: Bool = false,
        _ body: @escaping @Sendable (P, RequestContext) throws -> [UInt8]
    ) {
        self.runsInline = inline
        self.budgeted = budgeted
        self.submit = nil
        let text: @Sendable ([String: JSONValue], RequestContext) throws -> [UInt8] = { raw, context in
            try body(try P(validating: raw), context)
        }
        self.text = text
        self.run = { raw, context in try JSONParser(maxDepth: 10_000).parse(try text(raw, context)) }
    }

    /// A method that may answer later without holding a thread meanwhile (a blob read waiting for chunks from peers):
    /// `body` checks the params on the event loop and calls its reply exactly once, from any thread. Inside a batch
    /// the pool thread running the batch waits for the reply, and `body` is told to answer on it
    /// (`RequestContext.answersInline`).
    init<P: RPCParameters>(
        deferred params: P.Type,
        _ body: @escaping @Sendable (P, RequestContext, @escaping @Sendable (Result<P.Result, any Error>) -> Void) throws -> Void
    ) {
        self.runsInline = false
        self.text = nil
        self.run = { raw, context in
            let outcome = Mutex<Result<P.Result, any Error>?>(nil)
            let answered = DispatchSemaphore(value: 0)
            var inline = context
            inline.answersInline = true
            try body(try P(validating: raw), inline) { result in
                outcome.withLock { $0 = result }
                answered.signal()
            }
            answered.wait()
            return P.encode(try outcome.withLock { $0! }.get())
        }
        self.submit = { raw, context, _, reply in
            try body(try P(validating: raw), context) { result in reply(result.map { P.encode($0) }) }
        }
    }

    /// A single-operation write: `body` names the database and the operation and turns the store's result into the
    /// method's. Submitted to the group commit (or committed on the caller's thread) when it comes alone; run on the
    /// I/O pool inside a batch.
    init<P: RPCParameters>(
        write params: P.Type,
        _ body: @escaping @Sendable (P, RequestContext) throws -> (BlazeDatabase, WriteOp, @Sendable (WriteResult) -> P.Result)
    ) {
        self.runsInline = false
        self.run = { raw, context in
            let (db, op, result) = try body(try P(validating: raw), context)
            return P.encode(result(try db.apply(op)))
        }
        self.text = nil
        self.submit = { raw, context, here, reply in
            let (db, op, result) = try body(try P(validating: raw), context)
            db.submit(op, here: here) { outcome in reply(outcome.map { P.encode(result($0)) }) }
        }
    }
}

/// The handlers of every method, by wire name.
extension MethodHandler {
    /// This handler, run on the transfer pool (`transfers`).
    func onTransferPool() -> MethodHandler {
        var copy = self
        copy.transfers = true
        return copy
    }
}

struct MethodTable: Sendable {
    private let handlers: [String: MethodHandler]

    /// One handler per `RPCMethod` (`Methods.handler(for:)` is an exhaustive switch, so none can be missing).
    init() {
        handlers = Dictionary(uniqueKeysWithValues: RPCMethod.allCases.map { ($0.rawValue, Methods.handler(for: $0)) })
    }

    /// The handler of a method named on the wire, or nil for an unknown name.
    subscript(name: String) -> MethodHandler? { handlers[name] }
}
