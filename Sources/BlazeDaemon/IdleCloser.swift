import NIOCore

/// Closes a connection when `IdleStateHandler` reports it idle, unless it holds subscriptions (a watcher is silent
/// by nature; it stays until it unsubscribes or disconnects).
final class IdleCloser: ChannelInboundHandler, Sendable {
    typealias InboundIn = NIOAny
    let connection: ConnectionHandle

    init(connection: ConnectionHandle) { self.connection = connection }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if event is IdleStateHandler.IdleStateEvent {
            if connection.count == 0 { context.close(promise: nil) }
        } else {
            context.fireUserInboundEventTriggered(event)
        }
    }
}
