import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeSync
import NIOCore

/// What a device sends that the relay stores, in the order it was sent: batches, membership operations,
/// acknowledgements, snapshot pieces and join refusals wait in an inbox (reading pauses while it is full) and are
/// handled one at a time, so operations count for the entries that follow them.
extension RelayConnection {
    /// Queues what the device sent for storing, pausing reads while the queue is full.
    func receive(_ received: Received, space: [UInt8], context: ChannelHandlerContext) {
        inbox.append(received)
        if inbox.count >= Self.maxInbox { context.channel.setOption(ChannelOptions.autoRead, value: false).whenFailure { _ in } }
        storeNext(space: space, context: context)
    }

    /// Stores the next received item, then the one after it; a refusal closes the connection.
    func storeNext(space: [UInt8], context: ChannelHandlerContext) {
        guard !storing, !inbox.isEmpty else { return }
        storing = true
        let batch: EntryBatch
        switch inbox.removeFirst() {
        case .ops(let ops):
            run(context: context, { relay -> Bool in
                try await relay.merge(ops, space: space)
            }) { connection, grew, context in
                connection.storing = false
                if grew {
                    connection.relay.announce(space: space, except: connection.listener, .members)
                    // The operations may list this device (one the relay had not seen added), or remove it.
                    connection.sendMembers(space: space, context: context)
                    // The log decides who is passed joins and whose join is done: every connection looks again.
                    let relay = connection.relay
                    Task(executorPreference: relay.executor) { await relay.joinsChanged(space: space) }
                }
                connection.resumeReading(context: context)
                connection.storeNext(space: space, context: context)
            }
            return
        case .acks(let acks):
            keep(acks: acks, space: space, context: context)
            return
        case .joinRefused(let invite, let joiner, let reason):
            refuse(invite: invite, joiner: joiner, reason: reason, space: space, context: context)
            return
        case .snapshotPart(let part):
            stage(part, space: space, context: context)
            return
        case .snapshotEnd(let manifest):
            finishUpload(manifest, space: space, context: context)
            return
        case .batch(let b):
            batch = b
        }
        run(context: context, { relay in
            // A space whose log no member has brought yet has no writer: nothing is stored for it.
            guard let membership = try await relay.membership(space) else { throw SyncRejection.notMember }
            return try await relay.store.store(batch, space: space, membership: membership)
        }) { connection, added, context in
            connection.storing = false
            if var v = connection.peerVector { v[batch.origin] = max(v[batch.origin] ?? 0, batch.head.seq); connection.peerVector = v }
            if added > 0 {
                connection.relay.record(.stored(entries: added, bytes: batch.byteCount))
                connection.relay.announce(space: space, except: connection.listener, .batch(batch))
            }
            connection.resumeReading(context: context)
            connection.storeNext(space: space, context: context)
        }
    }

    func resumeReading(context: ChannelHandlerContext) {
        if inbox.count < Self.maxInbox { context.channel.setOption(ChannelOptions.autoRead, value: true).whenFailure { _ in } }
    }
}
