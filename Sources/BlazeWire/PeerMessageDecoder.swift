import BlazeCrypto
import NIOCore

/// Decodes each opened frame into a `PeerMessage`; a message that does not decode fails the connection
/// (`SyncRejection.malformed`, or the reason `PeerMessage(decoding:)` names).
public final class PeerMessageDecoder: ChannelInboundHandler {
    public typealias InboundIn = [UInt8]
    public typealias InboundOut = PeerMessage

    /// A decoder.
    public init() {}

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        do {
            context.fireChannelRead(wrapInboundOut(try PeerMessage(decoding: unwrapInboundIn(data))))
        } catch {
            context.fireErrorCaught(error)
        }
    }
}
