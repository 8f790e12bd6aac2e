import NIOCore
import NIOEmbedded

/// Records what reaches the end of a pipeline: messages, events and errors.
public final class Recorder<Message>: ChannelInboundHandler {
    public typealias InboundIn = Message
    /// The messages read, in order.
    public var messages: [Message] = []
    /// The user events seen, in order.
    public var events: [Any] = []
    /// The errors caught, in order.
    public var errors: [any Error] = []

    /// An empty recorder.
    public init() {}

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) { messages.append(unwrapInboundIn(data)) }
    public func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) { events.append(event) }
    public func errorCaught(context: ChannelHandlerContext, error: any Error) { errors.append(error) }
}

/// An embedded channel with `handlers`, connected (so active).
public func active(_ handlers: [any ChannelHandler]) throws -> EmbeddedChannel {
    let channel = EmbeddedChannel()
    try channel.pipeline.syncOperations.addHandlers(handlers)
    try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
    return channel
}

/// Moves every written byte between two embedded channels until both are quiet; `chunk` splits each write.
public func shuttle(_ x: EmbeddedChannel, _ y: EmbeddedChannel, chunk: Int = .max) throws {
    var moved = true
    while moved {
        moved = false
        for (from, to) in [(x, y), (y, x)] {
            while var out = try from.readOutbound(as: ByteBuffer.self) {
                moved = true
                while out.readableBytes > 0, to.isActive {
                    try to.writeInbound(out.readSlice(length: min(chunk, out.readableBytes))!)
                }
            }
        }
    }
}
