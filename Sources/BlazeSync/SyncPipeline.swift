import BlazeCrypto
import BlazeStore
import BlazeWire
import NIOCore

/// The handlers of a peer sync connection, in pipeline order.
///
/// Before the handshake: `HandshakeHandler`, then (inbound) the `GateTicket`, the `BatchReceiver` and the
/// `SyncSession`. When the handshake succeeds it puts the session's wire handlers in its own place: keepalive and
/// silence (`IdleStateHandler`), the sealed frame decoder and encoder, and the message decoder. A transport that
/// carries `PeerMessage`s some other way reuses `BatchReceiver` and `SyncSession` unchanged.
enum SyncPipeline {
    /// The handlers of an inbound connection the gate admitted from `address`.
    static func inbound(engine: SyncEngine, address: String) -> [any ChannelHandler] {
        let report = LinkReport(book: engine.status, peer: "inbound", direction: .inbound, db: nil)
        return [
            HandshakeHandler(engine: engine, report: report),
            GateTicket(gate: engine.gate, address: address),
            BatchReceiver(engine: engine, report: report),
            SyncSession(engine: engine, report: report),
        ]
    }

    /// The handlers of an outbound link to `peer` serving `space`; `relay` when the peer is reached over a WebSocket
    /// (a relay, which the log never lists, is served as a member is).
    static func outbound(
        engine: SyncEngine, space: SharedSpace, peer: String, relay: Bool, onEstablished: (() -> Void)? = nil
    ) -> [any ChannelHandler] {
        let report = LinkReport(book: engine.status, peer: peer, direction: .outbound, db: space.db.name)
        return [
            HandshakeHandler(engine: engine, report: report, space: space, onEstablished: onEstablished),
            BatchReceiver(engine: engine, report: report, relay: relay),
            SyncSession(engine: engine, report: report, servesUnlisted: relay),
        ]
    }

    /// The wire handlers of an established connection, sealing and opening with its cipher (which knows the
    /// protocol version agreed).
    static func session(engine: SyncEngine, link: EstablishedLink, report: LinkReport) -> [any ChannelHandler] {
        let cipher = link.cipher
        return [
            IdleStateHandler(
                readTimeout: engine.timeout, writeTimeout: .nanoseconds(engine.timeout.nanoseconds / 3)),
            ByteToMessageHandler(SealedFrameDecoder(opener: cipher.opener, counters: report)),
            MessageToByteHandler(SealedFrameEncoder(sealer: cipher.sealer, counters: report)),
            PeerMessageDecoder(),
        ]
    }
}
