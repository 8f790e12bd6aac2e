import BlazeCRDT
import BlazeCrypto
import BlazeStore
import BlazeWire
import NIOCore

/// Sending: this side's `STATE`, then what the peer lacks.
extension SyncSession {
    /// Entries per batch read for sending.
    static let batchEntries = 1000
    /// Bytes of encoded batches read per pump round.
    static let roundBytes = 4 << 20

    /// Seals pending local changes and sends this side's vector and own signed head.
    func sendState(context: ChannelHandlerContext) {
        guard let link, !stateSent else { return }
        stateSent = true
        let (db, key, identity, membership) = (link.db, link.key, engine.identity, link.space.snapshot.membership)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        engine.pool.runIfActive(eventLoop: context.eventLoop) { () -> ([NodeID: UInt64], SignedHead?) in
            try db.sealLocal(key: key, identity: identity, membership: membership)
            return (try db.syncVector(), try db.latestHead(origin: db.node))
        }.whenComplete { result in
            let (session, context) = bound.value
            switch result {
            case .success(let (vector, head)): session.send(.state(vector: vector, ownHead: head), context: context)
            case .failure(let error): session.errorCaught(context: context, error: LocalFailure(error))
            }
        }
    }

    /// Sends the peer what it lacks, one round of batches at a time; a round starts after the previous one is
    /// written, so the socket's buffer, not memory, holds what the peer has not read.
    func pump(context: ChannelHandlerContext) {
        // A commit may reference chunks a put just stored: a relay is offered them.
        offerChunks(context: context)
        guard !closed, let peerVector, let link, servesPeer else { return }
        if pumping {
            pumpAgain = true
            return
        }
        pumping = true
        pumpAgain = false
        let (db, key, identity, membership) = (link.db, link.key, engine.identity, link.space.snapshot.membership)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        // Reading, packing and encoding happen on the I/O pool; only sealing the frames (the cipher's counter) stays
        // on the event loop.
        // A peer of an older protocol (a device or relay of an earlier build) refuses entries of format 3.
        let newest = link.protocolVersion >= Self.formatsFrom ? EntryHeader.newestVersion : EntryHeader.version
        engine.pool.runIfActive(eventLoop: context.eventLoop) { () -> Round in
            try db.sealLocal(key: key, identity: identity, membership: membership)
            return try Round.read(db: db, mine: db.syncVector(), theirs: peerVector, newestFormat: newest)
        }.whenComplete { result in
            let (session, context) = bound.value
            switch result {
            case .success(let round) where round.needsSnapshot && round.batches.isEmpty:
                session.sendSnapshot(context: context)
            case .success(let round): session.send(round, context: context)
            case .failure(let error):
                session.pumping = false
                session.errorCaught(context: context, error: LocalFailure(error))
            }
        }
    }

    /// Writes a round's batches and pumps again once the last is written (or at once when there was nothing to send
    /// and a commit arrived meanwhile).
    private func send(_ round: Round, context: ChannelHandlerContext) {
        var last: EventLoopFuture<Void>?
        var sent = 0, held = 0
        for (batch, message) in round.batches {
            // The peer sent it while the round was read: it holds it already.
            if let theirs = peerVector?[batch.origin], theirs >= batch.head.seq {
                held += batch.entries.count
                continue
            }
            sent += batch.entries.count
            last = send(bytes: message, context: context)
            peerHolds(origin: batch.origin, seq: batch.head.seq)
        }
        report.update {
            $0.sentEntries += sent
            $0.peerBehind = max(0, round.ahead - sent - held)
            $0.selfBehind = round.behind
            if sent > 0 { $0.lastSyncMs = nowMs() }
        }
        if let origin = round.unopenable, !toldUnopenable, let version = link?.protocolVersion {
            toldUnopenable = true
            let what = report.peer.hasPrefix("ws") ? "relay" : "device"
            report.update {
                $0.lastError = "entries of \(origin.hex) are sealed in entry format 3, which this \(what) (sync protocol \(version)) "
                    + "cannot open: upgrade it; they wait here until then"
            }
            engine.logger.warning(
                "Sync peer cannot open entries of format 3: they wait until it is upgraded",
                metadata: ["peer": "\(report.peer)", "origin": "\(origin.hex)", "protocol": "\(version)"])
        }
        guard let last else {
            pumping = false
            if pumpAgain { pump(context: context) }
            return
        }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        last.whenComplete { _ in
            let (session, context) = bound.value
            session.pumping = false
            session.pump(context: context)
        }
    }

    /// One round of sending: encoded batches of what the peer lacks, and how far apart the two sides are.
    struct Round {
        var batches: [(batch: EntryBatch, message: [UInt8])] = []
        /// Entries the peer holds that this side lacks.
        var behind = 0
        /// Entries this side holds that the peer lacked before this round.
        var ahead = 0
        /// True when the peer lacks entries compacted away here: it needs a snapshot (SYNC.md §11).
        var needsSnapshot = false
        /// An origin whose next batch holds an entry of a format newer than the peer opens: it is not sent.
        var unopenable: NodeID?

        /// Reads up to `roundBytes` of batches the peer lacks, per origin in order, from `db` (on the I/O pool), each
        /// origin up to its first batch holding an entry of a format past `newestFormat`.
        static func read(
            db: BlazeDatabase, mine: [NodeID: UInt64], theirs: [NodeID: UInt64], newestFormat: UInt8 = EntryHeader.newestVersion
        ) throws -> Round {
            var round = Round()
            var bytes = 0
            // Counts saturate: a STATE may name many origins near the seq bound.
            for (origin, seq) in theirs where seq > mine[origin] ?? 0 {
                round.behind = round.behind.saturatingAdd(seq - (mine[origin] ?? 0))
            }
            let pruned = try db.prunedHeads()
            for (origin, seq) in mine.sorted(by: { $0.key < $1.key }) {
                var after = theirs[origin] ?? 0
                guard seq > after else { continue }
                round.ahead = round.ahead.saturatingAdd(seq - after)
                if let floor = pruned[origin]?.seq, after < floor {
                    round.needsSnapshot = true
                    continue
                }
                while bytes < SyncSession.roundBytes,
                    let batch = try db.entryBatch(origin: origin, after: after, maxEntries: SyncSession.batchEntries)
                {
                    if batch.entries.contains(where: { $0.header.version > newestFormat }) {
                        round.unopenable = round.unopenable ?? origin
                        break
                    }
                    let message = try PeerMessage.entries(batch).encoded()
                    // A span between two heads larger than a frame (signed before heads were cut by size) cannot
                    // travel; the receiver would refuse the frame and the link would only reconnect.
                    guard message.count <= SessionCipher.maxMessage else { break }
                    round.batches.append((batch, message))
                    bytes += message.count
                    after = batch.head.seq
                }
            }
            return round
        }
    }
}

/// A failure on this side (storage, shutdown) while serving a session: never counted as the peer's fault, even when
/// the underlying error is a `SyncRejection` (a damaged local log).
struct LocalFailure: Error, CustomStringConvertible {
    let underlying: any Error
    init(_ underlying: any Error) { self.underlying = underlying }
    var description: String { "\(underlying)" }
}

extension Int {
    /// `self + n`, or `Int.max` when that does not fit.
    func saturatingAdd(_ n: UInt64) -> Int {
        guard n <= UInt64(Int.max) else { return .max }
        let (sum, overflow) = addingReportingOverflow(Int(n))
        return overflow ? .max : sum
    }
}
