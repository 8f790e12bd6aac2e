import BlazeCrypto
import BlazeStore
import BlazeWire
import NIOCore

/// Statements of entry formats on a session (SYNC.md §6, "Entry formats"): sent on protocol 6 or later, like
/// acknowledgements, to a peer this side serves; kept when the log lists their signers, then passed on by every
/// session of the database.
extension SyncSession {
    /// The first protocol whose sessions carry `FORMATS`.
    static let formatsFrom: UInt8 = 6

    /// Sends the statements the peer is not known to hold (this device's own, issued first when what it can be sent
    /// changed, and those of other members it passes on). A relay this device dials is recorded as answering in this
    /// link's protocol first, so the statement counts it as one that carries format 3.
    func sendFormats(context: ChannelHandlerContext) {
        guard let link, link.protocolVersion >= Self.formatsFrom, stateSent, !closed else { return }
        let (db, shared, membership, engine) = (link.db, link.space, link.space.snapshot.membership, self.engine)
        guard membership != nil else { return }
        let known = formatsShared
        let relay = report.direction == .outbound && report.peer.hasPrefix("ws") ? report.peer : nil
        let version = Int(link.protocolVersion)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        engine.pool.runIfActive(eventLoop: context.eventLoop) { () -> [FormatStatement] in
            if let relay { try db.recordRelayProtocol(relay, version: version) }
            try engine.issueFormatStatement(db: db, space: shared)
            return try db.heldFormatStatements(membership: membership).filter { s in known[s.node].map { s.issuedMs > $0 } ?? true }
        }.whenComplete { result in
            let (session, context) = bound.value
            guard case .success(let statements) = result, !statements.isEmpty, !session.closed else { return }
            for s in statements { session.formatsShared[s.node] = max(session.formatsShared[s.node] ?? 0, s.issuedMs) }
            var rest = statements[...]
            while !rest.isEmpty {
                session.send(.formats(Array(rest.prefix(PeerMessage.maxStatements))), context: context)
                rest = rest.dropFirst(PeerMessage.maxStatements)
            }
        }
    }

    /// Keeps the peer's statements that are newer than those held, then lets every session of the database pass
    /// them on. A statement on a link of an older protocol, which never carries one, is malformed.
    func received(formats statements: [FormatStatement], context: ChannelHandlerContext) {
        guard let link else { return }
        guard link.protocolVersion >= Self.formatsFrom else {
            errorCaught(context: context, error: SyncRejection.malformed)
            return
        }
        // A peer this side does not serve (the log does not list it) has nothing worth keeping.
        guard servesPeer, let membership = link.space.snapshot.membership else { return }
        for s in statements {
            guard let member = membership.member(s.node), member.keys.signing == s.deviceKey else { continue }
            formatsShared[s.node] = max(formatsShared[s.node] ?? 0, s.issuedMs)
        }
        let (db, space, engine) = (link.db, link.space.id, self.engine)
        _ = engine.pool.runIfActive(eventLoop: context.eventLoop) {
            if try db.keep(statements, space: space, membership: membership) { engine.membershipChanged(db: db.name) }
        }
    }
}
