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
        guard let accepted = try? server.accept(auth, spaces: spaces.map(\.key)),
            let space = spaces.first(where: { $0.id == accepted.space.id })
        else { return .refused }
        if accepted.mismatch != nil {
            // The proof held: the refusal is reported on the database whose key it proved.
            report.db = space.db.name
            return .incompatible(accepted)
        }
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
        context.fireUserInboundEventTriggered(SyncLinkEstablished(space: space, device: link.device, protocolVersion: link.protocolVersion))
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
            // Ranges are compared only once the other side's proof holds (a hello of another handshake version
            // aside, which says so), so only a holder of the space's key gets this far.
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

/// The sync protocol versions this daemon speaks (SYNC.md §8, "Versions").
public enum SyncProtocols {
    /// This build's (`Handshake.protocols`), unless `BLAZE_SYNC_PROTOCOLS` (`LOW-HIGH` or one number, from 4) narrows or
    /// moves them, which tests of mixed versions use to play an older or newer device. A value of another shape is
    /// ignored (`overrideProblem` says so, for the log).
    public static let spoken: ClosedRange<UInt8> = parsed ?? Handshake.protocols

    /// Why `BLAZE_SYNC_PROTOCOLS` is ignored, when it is set and not a range.
    public static var overrideProblem: String? {
        guard let text = setting, parsed == nil else { return nil }
        return "BLAZE_SYNC_PROTOCOLS=\(text) is not LOW-HIGH or one number from 4 up: ignored"
    }

    private static let setting = ProcessInfo.processInfo.environment["BLAZE_SYNC_PROTOCOLS"]

    private static let parsed: ClosedRange<UInt8>? = {
        guard let text = setting else { return nil }
        let parts = text.split(separator: "-", omittingEmptySubsequences: false)
        guard (1...2).contains(parts.count), let low = UInt8(parts[0]), let high = UInt8(parts[parts.count - 1]), low >= 4, low <= high
        else { return nil }
        return low...high
    }()
}

extension HandshakeHandler {
    /// The connecting side of a daemon's link serving `space`, proving its capability.
    convenience init(engine: SyncEngine, report: LinkReport, space: SharedSpace, onEstablished: (() -> Void)? = nil) {
        self.init(
            client: space.key, identity: engine.identity, timeout: engine.handshakeTimeout,
            delegate: SyncHandshake(engine: engine, report: report, space: space, onEstablished: onEstablished),
            protocols: SyncProtocols.spoken)
    }

    /// The accepting side of a daemon's listener: the client's proof decides which served database it is for.
    convenience init(engine: SyncEngine, report: LinkReport) {
        self.init(
            server: engine.identity, timeout: engine.handshakeTimeout,
            delegate: SyncHandshake(engine: engine, report: report, space: nil, onEstablished: nil),
            protocols: SyncProtocols.spoken)
    }

    /// A handshake frame (`HandshakeFrame.encode`).
    static func frame(_ body: [UInt8]) -> ByteBuffer { HandshakeFrame.encode(body) }
}
