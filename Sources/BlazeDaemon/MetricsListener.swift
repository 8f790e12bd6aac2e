import BlazeProtocol
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The `metrics-listen` HTTP server: `GET /metrics` (Prometheus text format) on a loopback address, nothing else.
///
/// Loopback is reachable by every user of the machine, and the metrics name the owner's databases, peers and
/// folders: a scrape must carry `Authorization: Bearer TOKEN`, the token in `metrics.token` in the data directory
/// (mode 0600, made at the first start with `metrics-listen`), as Prometheus's `credentials_file` sends it (401
/// otherwise). A request whose `Host` is not a loopback name is refused (403), so a web page cannot reach it through
/// a DNS name rebound to 127.0.0.1. At most `maxConnections` at once (more are closed unread); each connection gets
/// one answer and is closed, and one that sends no complete request within `timeout` is closed.
final class MetricsListener: Sendable {
    /// Connections served at once at most.
    static let maxConnections = 16
    /// How long a connection may take to send its request.
    static let timeout = TimeAmount.seconds(2)
    /// The file in the data directory holding the bearer token.
    static let tokenFile = "metrics.token"

    /// The token in `directory/metrics.token`, made (32 random bytes, base64url, mode 0600) when missing.
    static func loadOrCreateToken(directory: String) throws -> String {
        let path = directory + "/" + tokenFile
        if let text = try? String(contentsOfFile: path, encoding: .utf8) {
            let token = text.trimmingCharacters(in: .whitespacesAndNewlines)
            if token.count >= 32 { return token }
        }
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<32).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
        let token = Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
        let fd = Glibc.open(path + ".tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw DaemonError(description: "cannot write \(path): \(String(cString: strerror(errno)))") }
        let line = Array((token + "\n").utf8)
        let written = line.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
        let synced = fsync(fd) == 0
        Glibc.close(fd)
        guard written == line.count, synced, rename(path + ".tmp", path) == 0 else {
            throw DaemonError(description: "cannot write \(path): \(String(cString: strerror(errno)))")
        }
        return token
    }

    private let channel: any Channel
    /// The port it listens on.
    let port: Int

    private init(channel: any Channel) {
        self.channel = channel
        port = channel.localAddress?.port ?? 0
    }

    /// Listens on `host:port` for scrapes carrying `token`; `render` makes the exposition text (it runs on `pool`).
    static func start(
        host: String, port: Int, token: String, pool: NIOThreadPool, render: @escaping @Sendable () -> [UInt8]
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
                    try channel.pipeline.syncOperations.addHandler(MetricsHTTPHandler(token: token, pool: pool, render: render))
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

    private let token: [UInt8]
    private let pool: NIOThreadPool
    private let render: @Sendable () -> [UInt8]
    private var head: HTTPRequestHead?
    private var answered = false
    private var deadline: Scheduled<Void>?

    init(token: String, pool: NIOThreadPool, render: @escaping @Sendable () -> [UInt8]) {
        self.token = Array(("Bearer " + token).utf8)
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
            // The request is in: the answer may take longer than the request was allowed to.
            deadline?.cancel()
            respond(to: head, context: context)
        }
    }

    private func respond(to head: HTTPRequestHead, context: ChannelHandlerContext) {
        let path = head.uri.split(separator: "?", maxSplits: 1).first.map(String.init) ?? head.uri
        guard PeerAddress.isLoopbackHostHeader(head.headers.first(name: "host")) else {
            return send(.forbidden, "text/plain", Array("the Host header must name a loopback address\n".utf8), head, context)
        }
        guard path == "/metrics" else { return send(.notFound, "text/plain", Array("not found\n".utf8), head, context) }
        guard head.method == .GET else {
            return send(.methodNotAllowed, "text/plain", Array("method not allowed\n".utf8), head, context)
        }
        guard Self.equalInConstantTime(Array((head.headers.first(name: "authorization") ?? "").utf8), token) else {
            var extra = HTTPHeaders()
            extra.add(name: "WWW-Authenticate", value: #"Bearer realm="blazed""#)
            let text = "send Authorization: Bearer and the token in the data directory's \(MetricsListener.tokenFile)\n"
            return send(.unauthorized, "text/plain", Array(text.utf8), head, context, extra: extra)
        }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let render = self.render
        pool.runIfActive(eventLoop: context.eventLoop) { render() }.whenComplete { result in
            let (handler, context) = bound.value
            switch result {
            case .success(let text):
                handler.send(.ok, "text/plain; version=0.0.4; charset=utf-8", text, head, context)
            case .failure:
                handler.send(.serviceUnavailable, "text/plain", Array("the daemon is shutting down\n".utf8), head, context)
            }
        }
    }

    private func send(
        _ status: HTTPResponseStatus, _ type: String, _ body: [UInt8], _ head: HTTPRequestHead, _ context: ChannelHandlerContext,
        extra: HTTPHeaders = HTTPHeaders()
    ) {
        var headers = extra
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

    /// True when `a` equals `b`, taking as long whatever the first difference (only the lengths leak).
    static func equalInConstantTime(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        return zip(a, b).reduce(UInt8(0)) { $0 | ($1.0 ^ $1.1) } == 0
    }
}
