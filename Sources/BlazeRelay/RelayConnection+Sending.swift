import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeWire
import NIOCore

/// What the relay sends a device: the membership operations and entries it lacks, a round at a time, and batches
/// other connections store, forwarded live.
extension RelayConnection {
    /// A batch another connection just stored: sent as it is when it is exactly what the device lacks next of its
    /// origin (live fan-out without reading it back), otherwise the usual round from the store.
    func forward(_ batch: EntryBatch, space: SpaceID, context: ChannelHandlerContext) {
        guard access == .member else { return }
        // A device of an older protocol refuses entries of format 3 (SYNC.md §6, "Entry formats"): it is not sent them.
        guard !batch.entries.contains(where: { $0.header.version > newestFormat }) else { return }
        guard !pumping, let theirs = peerVector, let first = batch.entries.first,
            first.header.seq == (theirs[batch.origin] ?? 0) + 1
        else {
            pump(space: space, context: context)
            return
        }
        send(.entries(batch), context: context)
        peerVector?[batch.origin] = batch.head.seq
        relay.record(.sent(entries: batch.entries.count, bytes: batch.byteCount))
    }

    /// The newest entry format the device opens, as its protocol says (entry format 3 came with protocol 6).
    var newestFormat: UInt8 { protocolVersion >= Self.formatsFrom ? EntryHeader.newestVersion : EntryHeader.version }

    /// Sends the device what it lacks, a round at a time.
    func pump(space: SpaceID, context: ChannelHandlerContext) {
        guard access == .member, let theirs = peerVector else { return }
        if pumping {
            pumpAgain = true
            return
        }
        pumping = true
        pumpAgain = false
        let sendsSnapshot = !snapshotSent
        let newest = newestFormat
        run(context: context, { relay -> (batches: [EntryBatch], needsSnapshot: Bool) in
            var batches: [EntryBatch] = []
            var bytes = 0
            // What a snapshot covers and the device lacks comes with the snapshot, first.
            let bases = try await relay.store.bases(space: space)
            let needsSnapshot = bases.contains { origin, base in (theirs[origin] ?? 0) < base.seq }
            if needsSnapshot && sendsSnapshot { return ([], true) }
            for (origin, seq) in try await relay.store.vector(space: space).sorted(by: { $0.key < $1.key }) {
                var after = theirs[origin] ?? 0
                if let base = bases[origin], after < base.seq { continue }
                while seq > after, bytes < Self.batchBytes,
                    let batch = try await relay.store.batch(
                        space: space, origin: origin, after: after, maxEntries: Self.batchEntries, maxBytes: Self.batchBytes)
                {
                    // An origin stops at its first entry of a format the device does not open.
                    if batch.entries.contains(where: { $0.header.version > newest }) { break }
                    batches.append(batch)
                    bytes += batch.byteCount
                    after = batch.head.seq
                }
            }
            return (batches, needsSnapshot)
        }) { connection, round, context in
            if round.needsSnapshot && !connection.snapshotSent {
                connection.snapshotSent = true
                connection.sendSnapshot(space: space, context: context)
                return
            }
            // Entries the device sent while the round was read (its uploads, stored meanwhile) are not sent back.
            let batches = round.batches.compactMap { $0.after(connection.peerVector?[$0.origin] ?? 0) }
            var last: EventLoopFuture<Void>?
            for batch in batches {
                last = connection.send(.entries(batch), context: context)
                connection.peerVector?[batch.origin] = batch.head.seq
            }
            connection.relay.record(
                .sent(entries: batches.reduce(0) { $0 + $1.entries.count }, bytes: batches.reduce(0) { $0 + $1.byteCount }))
            guard let last else {
                connection.pumping = false
                if connection.pumpAgain { connection.pump(space: space, context: context) }
                return
            }
            // The next round is read once this one is written: the socket's buffer, not memory, holds what the device
            // has not read yet.
            let bound = NIOLoopBound((connection, context), eventLoop: context.eventLoop)
            last.whenComplete { _ in
                let (connection, context) = bound.value
                connection.pumping = false
                guard case .established = connection.state else { return }
                connection.pump(space: space, context: context)
            }
        }
    }
}
