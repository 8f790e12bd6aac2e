import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeWire
import NIOCore

/// Blob chunks on a relay (Protocol/RELAY.md, "Blob chunks"). A writing member offers the chunks it holds
/// (`CHUNK_OFFER`, one offer at a time); the relay answers with the ones it lacks and has room for (`CHUNK_WANT`,
/// possibly none), and takes only those: each arrives once (`CHUNK`, or `CHUNK_MISSING` when the device no longer
/// holds it), is checked for a sealed chunk's shape (it cannot be opened here) and stored in order with the rest the
/// device sends, counted in the space's bytes; one the quota has no room for is left out, not refused. A member asks
/// for chunks (`CHUNK_WANT`) and is served them one at a time, each read once the one before is written; a member
/// that finds a served copy bad (`CHUNK_BAD`) has it dropped, and a member's next offer restores it.
extension RelayConnection {
    /// Chunks a device may have asked for and not been served (its fetcher asks for at most 4 at a time).
    static let maxQueuedChunkWants = 2 * PeerMessage.maxChunkWants
    /// Chunks served on this connection whose copies it may report bad; older ones it may not.
    static let maxServedChunks = 1024
    /// The most chunks of one offer the relay asks for (a device offers `PeerMessage.maxChunkOffer` at a time).
    static let maxTakenPerOffer = PeerMessage.maxChunkOffer
    /// How soon an offer waiting for room in the upload budget looks again.
    static let budgetRetry = TimeAmount.milliseconds(50)

    /// The device offers `ids`: the relay wants those it lacks, when the device may write and the space has room, at
    /// most `maxTakenPerOffer`, once the relay's upload budget has room for them.
    func offered(_ ids: [ChunkID], space: SpaceID, context: ChannelHandlerContext) throws {
        // One offer at a time, after every chunk the last one's answer asked for: a device cannot queue uploads.
        guard !answeringOffer, chunksExpected.isEmpty else { throw SyncRejection.malformed }
        guard access == .member else {
            send(.chunkWant([]), context: context)
            return
        }
        answeringOffer = true
        let device = self.device
        run(context: context, { relay -> [ChunkID] in
            if let membership = try await relay.membership(space) {
                guard let device, let member = membership.member(device.nodeID), member.isCurrent, member.role.writes
                else { return [] }
            }
            guard try await relay.store.usage(space: space).bytes < relay.store.limits.maxBytesPerSpace else { return [] }
            let held = try await relay.store.heldChunks(ids, space: space)
            return Array(ids.filter { !held.contains($0) }.prefix(Self.maxTakenPerOffer))
        }) { connection, wanted, context in
            connection.answer(offer: wanted, context: context)
        }
    }

    /// Asks for `wanted` once the relay's upload budget has room for all of them, looking again every
    /// `budgetRetry` meanwhile (uploads of other connections finish): memory, not the device, waits.
    private func answer(offer wanted: [ChunkID], context: ChannelHandlerContext) {
        guard case .established = state else { return }
        let bytes = wanted.count * PeerMessage.maxSealedChunkBytes
        guard relay.chunkUploads.reserve(bytes) else {
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            context.eventLoop.scheduleTask(in: Self.budgetRetry) {
                let (connection, context) = bound.value
                connection.answer(offer: wanted, context: context)
            }
            return
        }
        chunkRoom += wanted.count
        answeringOffer = false
        chunksExpected = Set(wanted)
        send(.chunkWant(wanted), context: context)
    }

    /// Gives back the room of `count` chunks asked for (stored, not sent, or the connection closed).
    func releaseChunkRoom(_ count: Int) {
        let count = min(count, chunkRoom)
        guard count > 0 else { return }
        chunkRoom -= count
        relay.chunkUploads.release(count * PeerMessage.maxSealedChunkBytes)
    }

    /// A device's `CHUNK_MISSING`: chunks the relay asked for that it no longer holds.
    func notHeld(_ ids: [ChunkID]) {
        releaseChunkRoom(ids.filter { chunksExpected.remove($0) != nil }.count)
    }

    /// The device sends chunk `id`: only one the relay asked for, of a sealed chunk's shape, stored in order.
    func receivedChunk(_ id: ChunkID, sealed: [UInt8], space: SpaceID, context: ChannelHandlerContext) throws {
        guard chunksExpected.remove(id) != nil,
            SealedChunkLayout.isWellFormed(sealed, maximum: PeerMessage.maxSealedChunkBytes)
        else { throw SyncRejection.badChunk }
        receive(.chunk(id, sealed), space: space, context: context)
    }

    /// Stores a received chunk (from the inbox), then goes on with the next item.
    func store(chunk id: ChunkID, sealed: [UInt8], space: SpaceID, context: ChannelHandlerContext) {
        run(context: context, { relay in
            let outcome = try await relay.store.storeChunk(id, sealed: sealed, space: space)
            relay.record(.chunk(outcome, bytes: sealed.count))
            return outcome
        }) { connection, _, context in
            connection.releaseChunkRoom(1)
            connection.storing = false
            connection.resumeReading(context: context)
            connection.storeNext(space: space, context: context)
        }
    }

    /// The device asks for `ids`: a member is served them, anyone else is told none is held.
    func wantedChunks(_ ids: [ChunkID], space: SpaceID, context: ChannelHandlerContext) throws {
        guard !ids.isEmpty else { throw SyncRejection.malformed }
        guard access == .member else {
            send(.chunkMissing(ids), context: context)
            return
        }
        guard chunkWants.count + ids.count <= Self.maxQueuedChunkWants else { throw SyncRejection.malformed }
        chunkWants.append(contentsOf: ids)
        serveChunk(space: space, context: context)
    }

    /// Reads and sends the next chunk asked for, once the one before is written.
    private func serveChunk(space: SpaceID, context: ChannelHandlerContext) {
        guard !servingChunk, !chunkWants.isEmpty else { return }
        servingChunk = true
        let id = chunkWants.removeFirst()
        run(context: context, { relay in try await relay.store.chunk(id, space: space) }) { connection, sealed, context in
            let written: EventLoopFuture<Void>?
            if let sealed {
                if connection.chunksServed.count >= Self.maxServedChunks { connection.chunksServed.removeAll() }
                connection.chunksServed.insert(id)
                connection.relay.record(.chunkServed(bytes: sealed.count))
                written = connection.send(.chunk(id: id, sealed: sealed), context: context)
            } else {
                written = connection.send(.chunkMissing([id]), context: context)
            }
            let bound = NIOLoopBound((connection, context), eventLoop: context.eventLoop)
            (written ?? context.eventLoop.makeSucceededVoidFuture()).whenComplete { _ in
                let (connection, context) = bound.value
                connection.servingChunk = false
                guard case .established = connection.state else { return }
                connection.serveChunk(space: space, context: context)
            }
        }
    }

    /// A member found copies this connection served bad: they are dropped (others are not the device's to judge).
    func badChunks(_ ids: [ChunkID], space: SpaceID, context: ChannelHandlerContext) {
        let served = ids.filter { chunksServed.remove($0) != nil }
        guard access == .member, !served.isEmpty else { return }
        run(context: context, { relay in
            let dropped = try await relay.store.dropChunks(served, space: space)
            relay.record(.chunksDropped(dropped))
            relay.logger.warning(
                "A member found chunk copies this relay served bad; dropped them",
                metadata: ["space": "\(space.hex)", "chunks": "\(dropped)"])
            return dropped
        }) { _, _, _ in }
    }
}
