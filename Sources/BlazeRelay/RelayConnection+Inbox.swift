import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeWire
import NIOCore

/// What a device sends that the relay stores, in the order it was sent: batches, membership operations,
/// acknowledgements, snapshot manifests and pieces, join refusals and blob chunks wait in an inbox (reading pauses while it is full) and are
/// handled one at a time, so operations count for the entries that follow them.
extension RelayConnection {
    /// Queues what the device sent for storing, pausing reads while the queue is full.
    func receive(_ received: Received, space: SpaceID, context: ChannelHandlerContext) {
        inbox.append(received)
        if inbox.count >= Self.maxInbox { context.channel.setOption(ChannelOptions.autoRead, value: false).whenFailure { _ in } }
        storeNext(space: space, context: context)
    }

    /// Stores the next received item, then the one after it; a refusal closes the connection.
    func storeNext(space: SpaceID, context: ChannelHandlerContext) {
        guard !storing, !inbox.isEmpty else { return }
        storing = true
        let batch: EntryBatch
        switch inbox.removeFirst() {
        case .ops(let ops):
            let listener = self.listener
            let aside = opsSetAside
            run(context: context, { relay -> (Bool, SetAsideOps) in
                let (grew, left) = try await relay.merge(ops, space: space, aside: aside)
                // Told here, not once this connection hears back: what is merged counts even if it closed meanwhile.
                if grew {
                    relay.announce(space: space, except: listener, .members)
                    // The log decides who is passed joins and whose join is done: every connection looks again.
                    Task(executorPreference: relay.executor) { await relay.joinsChanged(space: space) }
                }
                return (grew, left)
            }) { connection, merged, context in
                let (grew, left) = merged
                // Held aside for a listed member's connection only: strangers and capability holders hold nothing here.
                connection.opsSetAside = connection.access == .member && connection.device != nil ? left
                    : SetAsideOps(maxOps: RelayConnection.setAsideOps, maxBytes: RelayConnection.setAsideBytes)
                connection.storing = false
                // The operations may list this device (one the relay had not seen added), or remove it.
                if grew { connection.sendMembers(space: space, context: context) }
                connection.resumeReading(context: context)
                connection.storeNext(space: space, context: context)
            }
            return
        case .acks(let acks):
            keep(acks: acks, space: space, context: context)
            return
        case .formats(let statements):
            keep(formats: statements, space: space, context: context)
            return
        case .joinRefused(let invite, let joiner, let reason):
            refuse(invite: invite, joiner: joiner, reason: reason, space: space, context: context)
            return
        case .snapshotPart(let part):
            stage(part, space: space, context: context)
            return
        case .snapshotManifest(let manifest):
            beginUpload(manifest, space: space, context: context)
            return
        case .chunk(let id, let sealed):
            store(chunk: id, sealed: sealed, space: space, context: context)
            return
        case .offer(let ids):
            answer(offer: ids, space: space, context: context)
            return
        case .keep(let ids):
            keep(chunks: ids, space: space, context: context)
            return
        case .batch(let b):
            batch = b
        }
        let listener = self.listener
        run(context: context, { relay in
            // A space whose log no member has brought yet has no writer: nothing is stored for it.
            guard let membership = try await relay.membership(space) else { throw SyncRejection.notMember }
            let added = try await relay.store.store(batch, space: space, membership: membership)
            // Counted and passed on here, not once this connection hears back: a batch stored after the device closed
            // its connection still reaches the other connections now, not at their next round.
            if added > 0 {
                relay.record(.stored(entries: added, bytes: batch.byteCount))
                relay.announce(space: space, except: listener, .batch(batch))
            }
            return added
        }) { connection, _, context in
            connection.storing = false
            if var v = connection.peerVector { v[batch.origin] = max(v[batch.origin] ?? 0, batch.head.seq); connection.peerVector = v }
            connection.resumeReading(context: context)
            connection.storeNext(space: space, context: context)
        }
    }

    func resumeReading(context: ChannelHandlerContext) {
        if inbox.count < Self.maxInbox { context.channel.setOption(ChannelOptions.autoRead, value: true).whenFailure { _ in } }
    }
}
