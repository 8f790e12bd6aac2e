import BlazeCrypto
import BlazeWire

/// What one sync connection tells the engine's status book: the database and peer it serves, and the wire bytes
/// counted since they were last added. The handlers of one channel share it, on that channel's event loop only.
final class LinkReport {
    let book: StatusBook
    /// `host:port` for outbound links; `inbound` for connections peers opened here.
    let peer: String
    let direction: PeerDirection
    /// The database served: known at once for outbound links, after the handshake for inbound ones.
    var db: String?
    /// Wire bytes sent and received after the handshake, not yet added to the book.
    var unreported = (sent: 0, received: 0)

    /// A report for an outbound link to `peer` serving `db`, or an inbound connection (`db` nil until its handshake).
    init(book: StatusBook, peer: String, direction: PeerDirection, db: String?) {
        self.book = book
        self.peer = peer
        self.direction = direction
        self.db = db
    }

    /// Edits this link's status, adding the unreported wire bytes; does nothing before the database is known.
    func update(_ edit: (inout PeerStatus) -> Void) {
        guard let db else { return }
        let bytes = unreported
        unreported = (0, 0)
        book.update(db: db, peer: peer, direction: direction) {
            $0.sentBytes += bytes.sent
            $0.receivedBytes += bytes.received
            edit(&$0)
        }
    }

    /// Adds the unreported wire bytes, if any.
    func flush() {
        if unreported != (0, 0) { update { _ in } }
    }

    /// Counts a refusal of the peer's data by reason.
    func reject(_ reason: SyncRejection) {
        guard let db else { return }
        book.reject(db: db, peer: peer, direction: direction, reason)
    }
}

extension LinkReport: WireCounters {
    /// Counts a frame received (added to the status with the next update).
    func received(_ bytes: Int) { unreported.received += bytes }

    /// Counts a frame sent (added to the status with the next update).
    func sent(_ bytes: Int) { unreported.sent += bytes }

    /// Counts the connection ending inside a frame as an error.
    func lostMidFrame() { update { $0.errors += 1; $0.lastError = "connection lost mid-frame" } }
}
