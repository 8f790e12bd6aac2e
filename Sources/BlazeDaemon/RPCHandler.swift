import BlazeProtocol
import BlazeStore
import Logging
import NIOCore

/// Answers the requests of one connection in order, on the connection's event loop, and delivers its subscriptions.
///
/// Requests whose methods only read a little (`MethodHandler.runsInline`) are answered right here, with no thread hop;
/// a single-operation write is queued for its database's group commit and answered once durable (a connection alone on
/// its event loop commits it right here when no group commit is under way, see `ClientLoops`); the others run on
/// the daemon's I/O thread pool and are answered back on the loop. While a request runs on the
/// pool, later lines wait in a queue, and reading from the socket pauses once that queue is full or while the
/// client does not read its responses.
///
/// A subscription starts once the response to its `subscribe` is written: it replays the durable feed from its
/// start sequence in pages (each page waits until the client has read the previous ones), then attaches to the live
/// feed. Live events are written as they commit; a subscription whose connection already has more than
/// `maxSubscriberBacklogBytes` unsent is dropped with a final error notification.
///
/// On `ChannelShouldQuiesceEvent` (the daemon shutting down) or when the client half-closes, it answers every line
/// already received and then closes.
final class RPCHandler: ChannelDuplexHandler {
    typealias InboundIn = InboundFrame
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Lines queued beyond this stop reading from the socket until the queue drains.
    static let maxQueued = 64

    let connection: ConnectionHandle
    let dispatcher: Dispatcher
    let limits: ServerLimits
    let logger: Logger
    private var queue = CircularBuffer<InboundFrame>()
    private var busy = false
    private var closing = false
    private var heldRead = false
    /// Connections served by this connection's event loop, this one included.
    let loopConnections: NIOLoopBoundBox<Int>
    /// True while a write is being submitted: its answer, if it comes before `submit` returns, is `answeredHere`.
    private var submitting = false
    private var answeredHere: [UInt8]??

    /// Loop-side state of a started subscription.
    struct Delivery {
        let sub: Subscription
        /// Events up to this feed sequence are delivered (or were not for this subscription).
        var delivered: Int64
        /// Replaying and paused until the client reads (the channel becomes writable).
        var waiting = false
    }

    var deliveries: [String: Delivery] = [:]

    var id: Int { connection.id }

    init(
        connection: ConnectionHandle, dispatcher: Dispatcher, limits: ServerLimits, logger: Logger,
        loopConnections: NIOLoopBoundBox<Int>
    ) {
        self.connection = connection
        self.loopConnections = loopConnections
        self.dispatcher = dispatcher
        self.limits = limits
        self.logger = logger
    }

    func handlerAdded(context: ChannelHandlerContext) {
        loopConnections.value += 1
        // Pause reading requests while this much output waits for the client (it reads its responses too slowly).
        context.channel.setOption(.writeBufferWaterMark, value: .init(low: 256 << 10, high: 1 << 20)).whenFailure { _ in }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        loopConnections.value -= 1
    }

    func channelInactive(context: ChannelHandlerContext) {
        connection.close()
        deliveries = [:]
        context.fireChannelInactive()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            for (id, d) in deliveries where d.waiting {
                deliveries[id]?.waiting = false
                pump(id, context: context)
            }
            if heldRead && queue.count < Self.maxQueued {
                heldRead = false
                context.read()
            }
        }
        context.fireChannelWritabilityChanged()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !closing else { return }
        queue.append(unwrapInboundIn(data))
        drain(context: context)
    }

    func read(context: ChannelHandlerContext) {
        if queue.count >= Self.maxQueued || !context.channel.isWritable {
            heldRead = true
        } else {
            context.read()
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is ChannelShouldQuiesceEvent {
            // Graceful shutdown (`ServerQuiescingHelper`): answer everything received, then close.
            closing = true
            closeIfIdle(context: context)
        } else if case ChannelEvent.inputClosed = event {
            // The client sent its last request: answer everything received, then close.
            closing = true
            closeIfIdle(context: context)
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }

    private func closeIfIdle(context: ChannelHandlerContext) {
        if !busy && queue.isEmpty { context.close(promise: nil) }
    }

    private func drain(context: ChannelHandlerContext) {
        while !busy, let frame = queue.popFirst() {
            switch frame {
            case .tooLong:
                logger.notice("Closing connection: line too long", metadata: ["connection.id": "\(id)"])
                dispatcher.context.metrics?.malformed(kind: "line_too_long")
                let err = RPCCodec.response(
                    id: .null,
                    error: RPCError(
                        code: RPCErrorCode.limitExceeded, kind: "line_too_long",
                        message: "request line exceeds \(limits.maxLineBytes) bytes; closing the connection",
                        details: ["limit": .int(Int64(limits.maxLineBytes))]))
                queue.removeAll()
                closing = true
                context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: err.jsonBytes + [0x0A])), promise: nil)
                context.close(promise: nil)
                return
            case .line(let line):
                if line.readableBytesView.allSatisfy({ $0 == 0x20 || $0 == 0x09 }) { continue }
                let prepared = dispatcher.prepare(line: line.readableBytesView)
                if let (request, submit) = dispatcher.submission(prepared) {
                    // A single-operation write joins its database's next group commit; no thread waits for it. A
                    // connection alone on its loop commits it right here when no group commit is under way: only
                    // this connection, which waits for the write anyway, waits for the fsync.
                    busy = true
                    let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
                    let eventLoop = context.eventLoop
                    submitting = true
                    let here = loopConnections.value == 1
                    dispatcher.submit(request, submit, connection: connection, here: here) { reply in
                        if eventLoop.inEventLoop, loopBound.value.0.submitting {
                            // Answered before `submit` returned: committed here, or refused before it was queued.
                            loopBound.value.0.answeredHere = .some(reply)
                            return
                        }
                        eventLoop.execute {
                            let (handler, context) = loopBound.value
                            handler.busy = false
                            handler.send(reply, context: context)
                            handler.drain(context: context)
                        }
                    }
                    submitting = false
                    if let reply = answeredHere {
                        answeredHere = nil
                        busy = false
                        send(reply, context: context)
                        continue
                    }
                    return
                }
                if dispatcher.runsInline(prepared), let reply = dispatcher.executeInline(prepared, connection: connection) {
                    send(reply, context: context)
                    continue
                }
                // Runs on the pool: a method that may block, or a budgeted read whose inline budget ran out.
                busy = true
                let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
                let connection = self.connection
                let dispatcher = self.dispatcher
                dispatcher.pool(for: prepared).runIfActive(eventLoop: context.eventLoop) {
                    dispatcher.execute(prepared, connection: connection)
                }.whenComplete { result in
                    let (handler, context) = loopBound.value
                    handler.busy = false
                    switch result {
                    case .success(let reply): handler.send(reply, context: context)
                    case .failure:
                        handler.dispatcher.context.metrics?.malformed(kind: "shutting_down")
                        let err = RPCCodec.response(id: .null, error: RPCError(
                            code: RPCErrorCode.unavailable, kind: "shutting_down", message: "the daemon is shutting down"))
                        handler.send(err.jsonBytes, context: context)
                    }
                    handler.drain(context: context)
                }
                return
            }
        }
        if heldRead && queue.count < Self.maxQueued && context.channel.isWritable {
            heldRead = false
            context.read()
        }
        if closing { closeIfIdle(context: context) }
    }

    private func send(_ reply: [UInt8]?, context: ChannelHandlerContext) {
        if var reply {
            reply.append(0x0A)
            context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: reply)), promise: nil)
        }
        // Subscriptions created by this request start now that their `subscribe` response is out.
        for sub in connection.takePending() where !sub.isCancelled {
            deliveries[sub.id] = Delivery(sub: sub, delivered: sub.start)
            pump(sub.id, context: context)
            listenForBlobs(sub, context: context)
        }
    }

    // MARK: subscriptions
}
