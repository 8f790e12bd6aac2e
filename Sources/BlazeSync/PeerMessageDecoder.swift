import BlazeCrypto
import NIOCore

/// Decodes each opened frame into a `PeerMessage`; a message that does not decode fails the connection
/// (`SyncRejection.malformed`, or the reason `PeerMessage(decoding:)` names).
final class PeerMessageDecoder: ChannelInboundHandler {
    typealias InboundIn = [UInt8]
    typealias InboundOut = PeerMessage

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        do {
            context.fireChannelRead(wrapInboundOut(try PeerMessage(decoding: unwrapInboundIn(data))))
        } catch {
            context.fireErrorCaught(error)
        }
    }
}
