import HummingbirdWebSocket
import Logging
import NIOCore
import NIOExtras
import NIOPosix

/// One browser WebSocket joined to one connection to the daemon's Unix socket: each text message is sent as one
/// request line, each line the daemon writes (responses and subscription notifications) comes back as one text
/// message. Studio adds nothing and hides nothing: the daemon checks every request as it checks any client's, and
/// the connection is the Studio process's own (the same user, by the socket's peer credentials).
///
/// Either side closing closes the other: the daemon's connection ends its subscriptions with it.
enum DaemonBridge {
    /// The largest message taken from the browser (the daemon's own default `max-line-bytes`).
    static let maxMessageBytes = 8 << 20

    /// Carries messages both ways until either side closes.
    static func run(
        socketPath: String, inbound: WebSocketInboundStream, outbound: WebSocketOutboundWriter, logger: Logger
    ) async throws {
        let daemon: NIOAsyncChannel<ByteBuffer, ByteBuffer>
        do {
            daemon = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connect(unixDomainSocketPath: socketPath) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(
                            ByteToMessageHandler(LineBasedFrameDecoder()))
                        return try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                    }
                }
        } catch {
            logger.warning("Studio cannot reach the daemon", metadata: ["socket": "\(socketPath)", "error": "\(error)"])
            // A close reason holds 123 bytes at most: no path in it.
            try await outbound.close(.unexpectedServerError, reason: "the daemon does not answer")
            return
        }
        try await daemon.executeThenClose { lines, requests in
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    // Whatever the daemon answers goes on, at any size (a page of large documents can pass 8 MiB).
                    for try await line in lines {
                        try await outbound.write(.text(String(buffer: line)))
                    }
                }
                group.addTask {
                    for try await message in inbound.messages(maxSize: maxMessageBytes) {
                        // One text message is one line: a raw newline would split it into requests the page never
                        // made. Anything else ends the bridge, said so, rather than leaving a call unanswered.
                        guard case .text(let text) = message, !text.utf8.contains(0x0A) else {
                            try await outbound.close(.policyViolation, reason: "one JSON-RPC request per text message")
                            return
                        }
                        var buffer = ByteBuffer(string: text)
                        buffer.writeInteger(UInt8(0x0A))
                        try await requests.write(buffer)
                    }
                }
                // Whichever side ends first ends the bridge.
                _ = try await group.next()
                group.cancelAll()
            }
        }
    }
}
