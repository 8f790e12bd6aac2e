import BlazeProtocol
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

/// The `metrics-listen` HTTP server: `GET /metrics` (Prometheus text format) on a loopback address, nothing else.
///
/// At most `maxConnections` at once (more are closed unread); each connection gets one answer and is closed, and one
/// that sends no complete request within `timeout` is closed. A request whose `Host` is not a loopback name is
/// refused (403), so a web page cannot read the metrics through a DNS name rebound to 127.0.0.1.
final class MetricsListener: Sendable {
    /// Connections served at once at most.
    static let maxConnections = 16
    /// How long a connection may take to send its request.
    static let timeout = TimeAmount.seconds(10)

    private let channel: any Channel
    /// The port it listens on.
    let port: Int

    private init(channel: any Channel) {
        self.channel = channel
        port = channel.localAddress?.port ?? 0
    }

    /// Listens on `host:port`; `render` makes the exposition text (it runs on `pool`).
    static func start(
        host: String, port: Int, pool: NIOThreadPool, render: @escaping @Sendable () -> [UInt8]
    ) async throws -> MetricsListener {
        let open = Atomic<Int>(0)
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                guard open.add(1, ordering: .relaxed).newValue <= maxConnections else {
                    open.subtract(1, ordering: .relaxed)
                    return channel.close()
                }
                channel.closeFuture.whenComplete { _ in open.subtract(1, ordering: .relaxed) }
                return channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    try channel.pipeline.syncOperations.addHandler(MetricsHTTPHandler(pool: pool, render: render))
                }
            }
            .bind(host: host, port: port).get()
        return MetricsListener(channel: channel)
    }

    /// Stops listening (connections being answered finish).
    func close() async {
        try? await channel.close()
    }
}

/// One metrics connection: answers its first complete request, then closes.
final class MetricsHTTPHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let pool: NIOThreadPool
    private let render: @Sendable () -> [UInt8]
    private var head: HTTPRequestHead?
    private var answered = false
    private var deadline: Scheduled<Void>?

    init(pool: NIOThreadPool, render: @escaping @Sendable () -> [UInt8]) {
        self.pool = pool
        self.render = render
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        deadline = context.eventLoop.scheduleTask(in: MetricsListener.timeout) { bound.value.close(promise: nil) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        deadline?.cancel()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let h): head = h
        case .body: break
        case .end:
            guard let head, !answered else { return }
            answered = true
            respond(to: head, context: context)
        }
    }

    private func respond(to head: HTTPRequestHead, context: ChannelHandlerContext) {
        let path = head.uri.split(separator: "?", maxSplits: 1).first.map(String.init) ?? head.uri
        guard Self.isLoopbackHost(head.headers.first(name: "host")) else {
            return send(.forbidden, "text/plain", Array("the Host header must name a loopback address\n".utf8), head, context)
        }
        guard path == "/metrics" else { return send(.notFound, "text/plain", Array("not found\n".utf8), head, context) }
        guard head.method == .GET || head.method == .HEAD else {
            return send(.methodNotAllowed, "text/plain", Array("method not allowed\n".utf8), head, context)
        }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let render = self.render
        pool.runIfActive(eventLoop: context.eventLoop) { render() }.whenComplete { result in
            let (handler, context) = bound.value
            switch result {
            case .success(let text):
                handler.send(.ok, "text/plain; version=0.0.4; charset=utf-8", head.method == .HEAD ? [] : text, head, context)
            case .failure:
                handler.send(.serviceUnavailable, "text/plain", Array("the daemon is shutting down\n".utf8), head, context)
            }
        }
    }

    private func send(
        _ status: HTTPResponseStatus, _ type: String, _ body: [UInt8], _ head: HTTPRequestHead, _ context: ChannelHandlerContext
    ) {
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: type)
        headers.add(name: "Content-Length", value: "\(body.count)")
        headers.add(name: "Connection", value: "close")
        context.write(wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: status, headers: headers))), promise: nil)
        context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(bytes: body)))), promise: nil)
        let bound = NIOLoopBound(context, eventLoop: context.eventLoop)
        context.writeAndFlush(wrapOutboundOut(.end(nil))).whenComplete { _ in bound.value.close(promise: nil) }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    /// True when a `Host` header names a loopback address (any port); false when absent.
    static func isLoopbackHost(_ header: String?) -> Bool {
        guard let header, !header.isEmpty else { return false }
        var host = Substring(header)
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return false }
            host = host[host.index(after: host.startIndex)..<close]
        } else if let colon = host.lastIndex(of: ":") {
            host = host[..<colon]
        }
        return PeerAddress.isLoopback(host: host.lowercased())
    }
}
