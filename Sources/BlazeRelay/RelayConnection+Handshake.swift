import BlazeCrypto
import BlazeWire
import NIOCore

/// The end of a device's handshake with the relay: its proof tried again once the served spaces were re-read, then
/// its place (as a device the space's log lists, or another one) taken once the log is known.
extension RelayConnection {
    /// Tries the device's proof again once the spaces were re-read.
    func retryHandshake(context: ChannelHandlerContext) {
        guard case .rereading(let server, let auth) = state else { return }
        guard let accepted = try? server.accept(auth, spaces: relay.servedKeys()) else {
            refuseHandshake(context: context)
            return
        }
        accept(accepted, context: context)
        drainOrClose(context: context)
    }

    /// The device proved its key and a space's capability: it takes a place as a device the space's log lists or
    /// as another one. When this process does not hold the log, the device is admitted at once to a place not
    /// reserved (and moved to a reserved one once the log lists it, `listed()`), so a handshake waits for no store;
    /// only when no such place is left is the log read first.
    func accept(_ accepted: Handshake.Accepted, context: ChannelHandlerContext) {
        if let membership = relay.cachedMembership(accepted.space.id) {
            admit(accepted, membership: membership, known: true, context: context)
            return
        }
        if relay.gate.hasUnreservedPlace {
            admit(accepted, membership: nil, known: false, context: context)
            return
        }
        state = .checking
        let space = accepted.space.id
        let bound = NIOLoopBound((self, context, accepted), eventLoop: context.eventLoop)
        let read = context.eventLoop.makePromise(of: MembershipState?.self)
        let relay = self.relay
        Task(executorPreference: relay.executor) {
            do { read.succeed(try await relay.membership(space)) } catch { read.fail(error) }
        }
        read.futureResult.whenComplete { result in
            let (connection, context, accepted) = bound.value
            guard case .checking = connection.state else { return }
            guard case .success(let membership) = result else {
                connection.relay.record(.storeFailed(timedOut: false))
                connection.close(context: context)
                return
            }
            connection.admit(accepted, membership: membership, known: true, context: context)
            connection.drainOrClose(context: context)
        }
    }

    /// Takes the device's place as `membership` lists it (closing the connection when no such place is left), then
    /// answers the handshake and starts the session. Without the log `known`, the device counts as unlisted and
    /// fetches nothing until `sendMembers` has read the log and found what it may fetch.
    func admit(_ accepted: Handshake.Accepted, membership: MembershipState?, known: Bool, context: ChannelHandlerContext) {
        let listed = known && RelayAccess.of(accepted.device, in: membership) == .member && membership != nil
        guard relay.established(place, device: accepted.device, listed: listed) else {
            refuseHandshake(context: context)
            return
        }
        deadline?.cancel()
        context.writeAndFlush(wrapOutboundOut(HandshakeFrame.encode(accepted.reply)), promise: nil)
        state = .established(space: accepted.space.id, cipher: accepted.session)
        device = accepted.device
        access = known ? .of(accepted.device, in: membership) : .outsider
        established(space: accepted.space.id, context: context)
    }

    /// Closes a connection whose handshake failed or timed out, counted.
    func refuseHandshake(context: ChannelHandlerContext) {
        relay.record(.refusedHandshake)
        close(context: context)
    }
}
