import BlazeWire
import NIOCore

/// Holds an inbound connection's place in the listener's limits (`ConnectionGate`) for as long as the connection
/// lives: it stops counting as a handshake once the link is established and is released when the connection closes,
/// however it ends.
final class GateTicket: ChannelInboundHandler {
    typealias InboundIn = Never

    let place: GatePlace

    /// A ticket for a connection `gate` admitted from `address`.
    init(gate: ConnectionGate, address: String) {
        self.place = GatePlace(gate: gate, address: address)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is SyncLinkEstablished { place.established() }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        place.release()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        place.release()
    }
}
