import NIOCore

/// Sends one error line as soon as the connection is active, then closes it (the initializer runs too early to write).
final class RefuseHandler: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    let line: [UInt8]

    init(line: [UInt8]) { self.line = line }

    func channelActive(context: ChannelHandlerContext) {
        let channel = context.channel
        let buffer = channel.allocator.buffer(bytes: line)
        context.writeAndFlush(NIOAny(buffer)).whenComplete { _ in channel.close(promise: nil) }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}
}
