import Foundation
import Hummingbird
import HummingbirdWebSocket
import Logging
import NIOCore
import NIOPosix

/// BlazeDB Studio: a local web app (Hummingbird 2) that talks to blazed through its JSON-RPC methods, carried over a
/// WebSocket to the daemon's Unix socket (`DaemonBridge`).
///
/// What it serves: the app's page, script and style sheet (built in, not secret) to anyone on loopback, and
/// `GET /ws?token=…`, the bridge, only to a request carrying the token and coming from the Studio's own page
/// (`StudioGuard`). The token travels in the URL's fragment (`/#token=…`), which a browser never sends to a server,
/// never puts in a Referer and keeps per tab; the page hands it to `/ws`. Nothing the daemon holds is served
/// otherwise, so a page elsewhere (or one reaching 127.0.0.1 through a rebound DNS name) gets the app shell at most.
public struct Studio: Sendable {
    /// The daemon's socket the bridge connects to.
    public let socketPath: String
    /// The loopback address to listen on.
    public let host: String
    /// The port (0 picks a free one).
    public let port: Int
    /// The secret a browser must present to reach the daemon: 32 random bytes, base64url.
    public let token: String

    /// A Studio for the daemon at `socketPath`, listening on `host:port` (loopback only), with a new random token.
    public init(socketPath: String, host: String = "127.0.0.1", port: Int = 0) throws {
        guard ["127.0.0.1", "::1", "localhost"].contains(host) else {
            throw StudioError("Studio listens on loopback only (127.0.0.1, ::1 or localhost), not \(host)")
        }
        self.socketPath = socketPath
        self.host = host
        self.port = port
        var bytes = [UInt8](repeating: 0, count: 32)
        var generator = SystemRandomNumberGenerator()
        for i in bytes.indices { bytes[i] = UInt8.random(in: .min ... .max, using: &generator) }
        token = Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// The address to open: the page, with the token in the fragment.
    public func url(port: Int) -> String {
        let h = host.contains(":") ? "[\(host)]" : host
        return "http://\(h):\(port)/#token=\(token)"
    }

    /// Serves until SIGINT or SIGTERM; `listening` gets the port once the server accepts connections.
    public func run(logger: Logger, listening: @escaping @Sendable (Int) -> Void) async throws {
        let router = Router(context: BasicWebSocketRequestContext.self)
        let guardian = StudioGuard<BasicWebSocketRequestContext>(token: token)
        router.add(middleware: guardian)
        router.get("/") { _, _ in Self.asset(StudioAssets.indexHTML, "text/html; charset=utf-8") }
        router.get("/studio.js") { _, _ in Self.asset(StudioAssets.script, "text/javascript; charset=utf-8") }
        router.get("/studio.css") { _, _ in Self.asset(StudioAssets.styles, "text/css; charset=utf-8") }
        // Lets the page tell a refused token from a daemon that does not answer.
        router.get("/check") { request, _ in
            guardian.tokenMatches(request) ? Response(status: .noContent) : StudioGuard<BasicWebSocketRequestContext>.refusal(
                .forbidden, "this token is not the one blazectl studio printed")
        }
        let socketPath = self.socketPath
        router.ws("/ws") { request, _ in
            guardian.mayUpgrade(request) ? .upgrade([:]) : .dontUpgrade
        } onUpgrade: { inbound, outbound, context in
            try await DaemonBridge.run(socketPath: socketPath, inbound: inbound, outbound: outbound, logger: context.logger)
        }
        let app = Application(
            router: router,
            server: .http1WebSocketUpgrade(
                webSocketRouter: router,
                configuration: .init(ws: .init(maxFrameSize: DaemonBridge.maxMessageBytes))),
            configuration: .init(address: .hostname(host, port: port), serverName: "BlazeDB Studio"),
            onServerRunning: { channel in listening(channel.localAddress?.port ?? 0) },
            logger: logger)
        try await app.runService()
    }

    /// A built-in file as a response (the security headers are `StudioGuard`'s).
    static func asset(_ bytes: [UInt8], _ type: String) -> Response {
        Response(
            status: .ok, headers: [.contentType: type, .cacheControl: "no-store"],
            body: .init(byteBuffer: ByteBuffer(bytes: bytes)))
    }
}

/// Why Studio cannot start.
public struct StudioError: Error, CustomStringConvertible {
    /// What is wrong.
    public let description: String

    init(_ description: String) { self.description = description }
}
