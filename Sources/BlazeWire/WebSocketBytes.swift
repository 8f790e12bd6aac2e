import NIOCore
import NIOHTTP1
import NIOWebSocket

/// Carries the peer protocol's byte stream over a WebSocket (Protocol/RELAY.md, "Transport"): what the handlers above
/// write goes out as binary messages of at most `chunkSize` bytes, and the payload of every binary message read is
/// passed up as bytes, message boundaries meaning nothing. So the framing, handshake and session handlers of a TCP
/// link run unchanged over a connection that HTTPS reverse proxies and load balancers forward.
public final class WebSocketBytes: ChannelDuplexHandler {
    public typealias InboundIn = WebSocketFrame
    public typealias InboundOut = ByteBuffer
    public typealias OutboundIn = ByteBuffer
    public typealias OutboundOut = WebSocketFrame

    /// Which end of the WebSocket this is: a client masks what it sends (RFC 6455 §5.3), a server does not.
    public enum Role: Sendable { case client, server }

    /// The largest message either end sends.
    public static let chunkSize = 256 << 10
    /// The largest frame either end accepts: more than `chunkSize`, far less than a batch.
    public static let maxFrameSize = 1 << 20
    /// The HTTP path devices open their WebSocket on.
    public static let defaultPath = "/v1/sync"

    private let role: Role
    private var closing = false
    /// The payload of the latest ping not answered yet because the connection was not writable: a peer that pings
    /// without reading gets one pong once it reads again (RFC 6455 §5.5.3 allows answering only the latest), so its
    /// pings cannot grow the write queue.
    private var unansweredPing: ByteBuffer?

    /// A stream adapter for the `role` end.
    public init(role: Role) { self.role = role }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        switch frame.opcode {
        case .binary, .continuation:
            guard !closing, frame.data.readableBytes > 0 else { return }
            context.fireChannelRead(wrapInboundOut(frame.unmaskedData))
        case .ping:
            guard !closing else { return }
            guard context.channel.isWritable else {
                unansweredPing = frame.unmaskedData
                return
            }
            send(.pong, data: frame.unmaskedData, context: context, promise: nil)
            context.flush()
        case .pong:
            break
        case .connectionClose:
            // Answer the close once, then close: whatever the other end sent before it was passed up already.
            guard !closing else {
                context.close(promise: nil)
                return
            }
            var reason = frame.unmaskedData
            closeWith(reason.readWebSocketErrorCode() ?? .normalClosure, context: context)
        default:
            // Text frames (or unknown opcodes) are not the peer protocol.
            closeWith(.unacceptableData, context: context)
        }
    }

    public func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable, !closing, let payload = unansweredPing {
            unansweredPing = nil
            send(.pong, data: payload, context: context, promise: nil)
            context.flush()
        }
        context.fireChannelWritabilityChanged()
    }

    /// Sends a close frame with `code`, then closes the connection once it is written.
    private func closeWith(_ code: WebSocketErrorCode, context: ChannelHandlerContext) {
        closing = true
        var body = context.channel.allocator.buffer(capacity: 2)
        body.write(webSocketErrorCode: code)
        let written = context.eventLoop.makePromise(of: Void.self)
        send(.connectionClose, data: body, context: context, promise: written)
        context.flush()
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        written.futureResult.whenComplete { _ in bound.value.close(promise: nil) }
    }

    public func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        var bytes = unwrapOutboundIn(data)
        guard bytes.readableBytes > Self.chunkSize else {
            send(.binary, data: bytes, context: context, promise: promise)
            return
        }
        // One message per chunk, the last one completing the caller's promise.
        while bytes.readableBytes > Self.chunkSize {
            let part = bytes.readSlice(length: Self.chunkSize)!
            send(.binary, data: part, context: context, promise: nil)
        }
        send(.binary, data: bytes, context: context, promise: promise)
    }

    private func send(_ opcode: WebSocketOpcode, data: ByteBuffer, context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) {
        let frame = WebSocketFrame(
            fin: true, opcode: opcode, maskKey: role == .client ? .random() : nil, data: data)
        context.write(wrapOutboundOut(frame), promise: promise)
    }
}

/// Opens a WebSocket from a client channel: sends the upgrade request for `path` on `host` once connected, and, when
/// the server accepts, puts `WebSocketBytes` in the HTTP handlers' place and runs `upgraded` to add the handlers above
/// it. `headers` are added to the request (a load test naming a client behind a proxy). A refusal (any other response) runs `refused` with the status and closes the connection.
public enum WebSocketClient {
    /// Adds the HTTP client handlers and the upgrade request for `path` on `host:port` to a new `channel`.
    public static func configure(
        _ channel: any Channel, host: String, port: Int, path: String, headers: [(String, String)] = [],
        refused: @escaping @Sendable (String) -> Void,
        upgraded: @escaping @Sendable (any Channel) throws -> Void
    ) throws {
        let request = UpgradeRequest(host: host, port: port, path: path, headers: headers, refused: refused)
        let upgrader = NIOWebSocketClientUpgrader(maxFrameSize: WebSocketBytes.maxFrameSize) { channel, _ in
            channel.eventLoop.makeCompletedFuture {
                try channel.pipeline.syncOperations.addHandler(WebSocketBytes(role: .client))
                try upgraded(channel)
            }
        }
        // The server's first frames may come in the same read as its 101 answer: they are passed on, not dropped.
        try channel.pipeline.syncOperations.addHTTPClientHandlers(
            leftOverBytesStrategy: .forwardBytes,
            withClientUpgrade: (
                upgraders: [upgrader],
                completionHandler: { context in
                    if let request = try? context.pipeline.syncOperations.handler(type: UpgradeRequest.self) {
                        context.pipeline.syncOperations.removeHandler(request, promise: nil)
                    }
                }
            ))
        try channel.pipeline.syncOperations.addHandler(request)
    }

    /// Sends the upgrade request once the connection is up; sees only a response the upgrade did not take.
    final class UpgradeRequest: ChannelInboundHandler, RemovableChannelHandler {
        typealias InboundIn = HTTPClientResponsePart
        typealias OutboundOut = HTTPClientRequestPart

        let host: String, port: Int, path: String
        let extraHeaders: [(String, String)]
        let refused: @Sendable (String) -> Void
        private var sent = false

        init(host: String, port: Int, path: String, headers: [(String, String)], refused: @escaping @Sendable (String) -> Void) {
            self.host = host
            self.port = port
            self.path = path
            self.extraHeaders = headers
            self.refused = refused
        }

        func handlerAdded(context: ChannelHandlerContext) {
            if context.channel.isActive { send(context: context) }
        }

        func channelActive(context: ChannelHandlerContext) {
            send(context: context)
            context.fireChannelActive()
        }

        private func send(context: ChannelHandlerContext) {
            guard !sent else { return }
            sent = true
            var headers = HTTPHeaders()
            headers.add(name: "Host", value: host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)")
            headers.add(name: "Content-Length", value: "0")
            for (name, value) in extraHeaders { headers.add(name: name, value: value) }
            let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: path, headers: headers)
            context.write(wrapOutboundOut(.head(head)), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            if case .head(let head) = unwrapInboundIn(data) {
                refused("websocket upgrade refused: HTTP \(head.status.code)")
            }
            context.close(promise: nil)
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            refused("websocket upgrade failed: \(error)")
            context.close(promise: nil)
        }
    }
}
