import NIOCore

/// Holds an inbound connection's place in the listener's limits (`ConnectionGate`) for as long as the connection
/// lives: it stops counting as a handshake once the link is established and is released when the connection closes,
/// however it ends.
final class GateTicket: ChannelInboundHandler {
    typealias InboundIn = Never

    let gate: ConnectionGate
    /// The source address the gate admitted the connection for.
    let address: String
    private var handshaking = true
    private var released = false

    /// A ticket for a connection `gate` admitted from `address`.
    init(gate: ConnectionGate, address: String) {
        self.gate = gate
        self.address = address
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is SyncLinkEstablished, handshaking, !released {
            handshaking = false
            gate.established()
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        release()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        release()
    }

    private func release() {
        guard !released else { return }
        released = true
        gate.release(address: address, handshaking: handshaking)
    }
}
