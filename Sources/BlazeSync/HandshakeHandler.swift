import BlazeCrypto
import Foundation
import BlazeStore
import BlazeWire
import NIOCore

/// A daemon's side of the peer handshake that `HandshakeHandler` (BlazeWire) runs: which served database a client's
/// proof is for, the session's handlers (`SyncPipeline.session`), and how a failure counts.
///
/// An inbound connection that proves no key served here (or none in time) is closed without a word and counted as a
/// stranger; an outbound link whose peer answers wrongly counts the reason on that peer's status. On success the
/// session's handlers take the handshake's place and `SyncLinkEstablished` goes down the pipeline.
final class SyncHandshake: HandshakeDelegate {
    let engine: SyncEngine
    let report: LinkReport
    /// The space the link serves: given for an outbound link, found from the client's proof for an inbound one.
    private var space: SharedSpace?
    /// Fired once the handshake succeeds (outbound links reset their backoff).
    private let onEstablished: (() -> Void)?

    init(engine: SyncEngine, report: LinkReport, space: SharedSpace?, onEstablished: (() -> Void)?) {
        self.engine = engine
        self.report = report
        self.space = space
        self.onEstablished = onEstablished
    }

    func accept(_ auth: [UInt8], with server: Handshake.Server, context: ChannelHandlerContext) -> HandshakeVerdict {
        let spaces = engine.servedSpaces()
        let accepted: Handshake.Accepted
        do { accepted = try server.accept(auth, spaces: spaces.map(\.key)) } catch {
            guard error == .incompatibleProtocol, let mismatch = server.mismatch(auth) else { return .refused }
            // The proof held: the refusal is reported on the database whose key it proved.
            report.db = spaces.first { server.proves(auth, spaces: [$0.key]) }?.db.name
            return .incompatible(mismatch)
        }
        guard let space = spaces.first(where: { $0.id == accepted.space.id }) else { return .refused }
        self.space = space
        return .accepted(accepted)
    }

    func established(_ link: EstablishedLink, context: ChannelHandlerContext) throws -> [any ChannelHandler] {
        guard let space else { throw SyncRejection.badFrame }
        report.db = space.db.name
        report.update { $0.protocolVersion = Int(link.protocolVersion) }
        return SyncPipeline.session(engine: engine, link: link, report: report)
    }

    /// Announces the link (a device the space removed gets a session only to receive the proof of its removal:
    /// `SyncSession.startMembership`).
    func started(_ link: EstablishedLink, context: ChannelHandlerContext) {
        guard let space else { return }
        context.fireUserInboundEventTriggered(SyncLinkEstablished(space: space, device: link.device))
        onEstablished?()
    }

    func failed(_ failure: HandshakeFailure, context: ChannelHandlerContext) {
        switch failure {
        case .refused, .rejected(_, .awaitingAuth):
            engine.strangersRefused.add(1, ordering: .relaxed)
        case .timedOut(let phase):
            if phase == .awaitingAuth {
                engine.strangersRefused.add(1, ordering: .relaxed)
            } else {
                let ms = engine.handshakeTimeout.nanoseconds / 1_000_000
                report.update { $0.errors += 1; $0.lastError = "timed out: handshake not finished within \(ms) ms" }
            }
            engine.logger.info("Sync connection timed out", metadata: ["db": "\(report.db ?? "-")", "peer": "\(report.peer)"])
        case .incompatible(let mismatch, _):
            // Only a holder of the space's key gets this far as a client (the server checks the proof first), so its
            // words are worth a warning on either side.
            report.reject(.incompatibleProtocol)
            report.update { $0.errors += 1; $0.lastError = mismatch.description }
            engine.logger.warning(
                "Sync refused", metadata: ["db": "\(report.db ?? "-")", "peer": "\(report.peer)", "reason": "\(mismatch)"])
        case .rejected(let reason, _):
            report.reject(reason)
            engine.logger.warning(
                "Sync rejected", metadata: ["db": "\(report.db ?? "-")", "peer": "\(report.peer)", "reason": "\(reason.rawValue)"])
        case .closedByPeer(.awaitingHello):
            // An outbound link the peer closed mid-handshake says why it most likely did: a member closes silently on
            // a proof of a space it does not serve, so "refused" is told apart from "unreachable" (a failed connect).
            report.update {
                $0.errors += 1
                $0.lastError = "closed by the peer before its hello: over its connection limits, or not a BlazeDB sync listener"
            }
        case .closedByPeer(.awaitingReply):
            report.update {
                $0.errors += 1
                $0.lastError =
                    "refused by the peer: it closed the handshake after this device's proof, so it serves no space with "
                    + "this key (it does not hold the database, paused its sync or is stopping, removed this device, or "
                    + "is a relay not given this space's capability)"
            }
        case .closedByPeer(.awaitingAuth):
            break
        }
    }
}

extension HandshakeHandler {
    /// The sync protocol versions a daemon speaks: this build's, unless `BLAZE_SYNC_PROTOCOLS` (`LOW-HIGH` or one
    /// number, from 4) narrows or moves them, which tests of mixed versions use to play an older or newer device.
    static let daemonProtocols: ClosedRange<UInt8> = {
        guard let text = ProcessInfo.processInfo.environment["BLAZE_SYNC_PROTOCOLS"] else { return Handshake.protocols }
        let bounds = text.split(separator: "-", maxSplits: 1).map { UInt8($0) }
        guard let low = bounds.first ?? nil, let high = bounds.last ?? nil, low >= 4, low <= high else { return Handshake.protocols }
        return low...high
    }()

    /// The connecting side of a daemon's link serving `space`, proving its capability.
    convenience init(engine: SyncEngine, report: LinkReport, space: SharedSpace, onEstablished: (() -> Void)? = nil) {
        self.init(
            client: space.key, identity: engine.identity, timeout: engine.handshakeTimeout,
            delegate: SyncHandshake(engine: engine, report: report, space: space, onEstablished: onEstablished),
            protocols: Self.daemonProtocols)
    }

    /// The accepting side of a daemon's listener: the client's proof decides which served database it is for.
    convenience init(engine: SyncEngine, report: LinkReport) {
        self.init(
            server: engine.identity, timeout: engine.handshakeTimeout,
            delegate: SyncHandshake(engine: engine, report: report, space: nil, onEstablished: nil),
            protocols: Self.daemonProtocols)
    }

    /// A handshake frame (`HandshakeFrame.encode`).
    static func frame(_ body: [UInt8]) -> ByteBuffer { HandshakeFrame.encode(body) }
}
