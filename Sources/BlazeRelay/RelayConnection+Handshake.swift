import BlazeCrypto
import BlazeWire
import NIOCore

/// The relay's side of a device's handshake, as the shared `HandshakeHandler`'s delegate: which served space the
/// device's proof is for (re-reading the list once when it names none: another process may have added the space),
/// then the device's place (as a device the space's log lists, or another one), taken before the reply is sent.
extension RelayConnection: HandshakeDelegate {
    func accept(_ auth: [UInt8], with server: Handshake.Server, context: ChannelHandlerContext) -> HandshakeVerdict {
        if let accepted = try? server.accept(auth, spaces: relay.servedKeys()) { return takePlace(accepted, loop: context.eventLoop) }
        guard let reread = relay.rereadForHandshake() else {
            // A re-read may have ended between the check above and now: the list as it is now decides.
            guard let accepted = try? server.accept(auth, spaces: relay.servedKeys()) else { return .refused }
            return takePlace(accepted, loop: context.eventLoop)
        }
        let done = context.eventLoop.makePromise(of: Void.self)
        Task(executorPreference: relay.executor) {
            await reread.value
            done.succeed()
        }
        let bound = NIOLoopBound(self, eventLoop: context.eventLoop)
        let loop = context.eventLoop
        return .later(
            done.futureResult.map {
                let connection = bound.value
                guard case .handshake = connection.state,
                    let accepted = try? server.accept(auth, spaces: connection.relay.servedKeys())
                else { return .refused }
                return connection.takePlace(accepted, loop: loop)
            })
    }

    /// The device proved its key and a space's capability: it takes a place as a device the space's log lists or
    /// as another one. When this process does not hold the log, the device is admitted at once to a place not
    /// reserved (and moved to a reserved one once the log lists it, `listed()`), so a handshake waits for no store;
    /// only when no such place is left is the log read first.
    func takePlace(_ accepted: Handshake.Accepted, loop: any EventLoop) -> HandshakeVerdict {
        // A device that shares no protocol version takes no place: it gets the reply, to verify the relay before it
        // believes the mismatch, and the connection closes.
        if accepted.mismatch != nil { return .incompatible(accepted) }
        if let membership = relay.cachedMembership(accepted.space.id) {
            return admit(accepted, membership: membership, known: true)
        }
        if relay.gate.hasUnreservedPlace { return admit(accepted, membership: nil, known: false) }
        let space = accepted.space.id
        let read = loop.makePromise(of: MembershipState?.self)
        let relay = self.relay
        Task(executorPreference: relay.executor) {
            do { read.succeed(try await relay.membership(space)) } catch { read.fail(error) }
        }
        let bound = NIOLoopBound(self, eventLoop: loop)
        return .later(
            read.futureResult.map { membership in
                let connection = bound.value
                guard case .handshake = connection.state else { return .refused }
                return connection.admit(accepted, membership: membership, known: true)
            }.flatMapErrorThrowing { _ in
                let connection = bound.value
                guard case .handshake = connection.state else { return .refused }
                connection.storeFailed = true
                connection.relay.record(.storeFailed(timedOut: false))
                return .refused
            })
    }

    /// Takes the device's place as `membership` lists it (refused when no such place is left). Without the log
    /// `known`, the device counts as unlisted and fetches nothing until `sendMembers` has read the log and found what
    /// it may fetch.
    func admit(_ accepted: Handshake.Accepted, membership: MembershipState?, known: Bool) -> HandshakeVerdict {
        let listed = known && RelayAccess.of(accepted.device, in: membership) == .member && membership != nil
        guard relay.established(place, device: accepted.device, listed: listed) else { return .refused }
        device = accepted.device
        access = known ? .of(accepted.device, in: membership) : .outsider
        return .accepted(accepted)
    }

    func established(_ link: EstablishedLink, context: ChannelHandlerContext) throws -> [any ChannelHandler] {
        protocolVersion = link.protocolVersion
        return [
            ByteToMessageHandler(SealedFrameDecoder(opener: link.cipher.opener, counters: nil)),
            MessageToByteHandler(SealedFrameEncoder(sealer: link.cipher.sealer, counters: nil)),
            PeerMessageDecoder(),
        ]
    }

    func started(_ link: EstablishedLink, context: ChannelHandlerContext) {
        guard case .handshake = state, let own = ownContext else { return }
        state = .established(space: link.space.id)
        startSession(space: link.space.id, context: own)
    }

    /// A handshake that failed or timed out is counted (a frame that is not one as the reason it gives; a store that
    /// failed to answer as that), and the connection's place released.
    func failed(_ failure: HandshakeFailure, context: ChannelHandlerContext) {
        switch failure {
        case .rejected(let reason, _):
            relay.record(.rejected(reason.rawValue))
            relay.logger.info("Relay refused a device's data", metadata: ["reason": "\(reason.rawValue)"])
        case .refused where storeFailed: break
        case .refused, .timedOut: relay.record(.refusedHandshake)
        case .closedByPeer: break
        case .incompatible(let mismatch, _):
            relay.record(.rejected(SyncRejection.incompatibleProtocol.rawValue))
            relay.logger.warning("Relay refused a device", metadata: ["reason": "\(mismatch)"])
        }
        // Released here even before this handler is in the pipeline (a hello that failed to write closes the channel
        // while the handlers are being added); the handshake handler closes the channel.
        release()
    }
}
