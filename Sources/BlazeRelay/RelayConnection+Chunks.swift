import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeWire
import NIOCore

/// Blob chunks on a relay (Protocol/RELAY.md, "Blob chunks"). A current writing member of the space's log offers the
/// chunks it holds (`CHUNK_OFFER`, one offer at a time); the relay answers with those it lacks and has room for
/// (`CHUNK_WANT`, possibly none, after a `CHUNK_MISSING` of those it lacks and cannot take now), and takes only
/// those: each arrives once (`CHUNK`, or `CHUNK_MISSING` when the device no longer holds it), is checked for a sealed
/// chunk's shape (it cannot be opened here) and stored in order with the rest the device sends, counted in the
/// space's chunk quota. A listed member asks for chunks (`CHUNK_WANT`) and is served them one at a time, each read
/// once the one before is written; a writing member that finds a copy it was served bad (`CHUNK_BAD`) has that copy
/// dropped, and a holder's next offer restores it. A space whose log the relay does not hold yet takes part in none
/// of it: without a log nobody is known to be a member.
extension RelayConnection {
    /// Chunks a device may have asked for and not been served (its fetcher asks for at most 4 at a time).
    static let maxQueuedChunkWants = 2 * PeerMessage.maxChunkWants
    /// Chunks served on this connection whose copies it may report bad; older ones it may not.
    static let maxServedChunks = 1024
    /// The most chunks of one offer the relay asks for (a device offers `PeerMessage.maxChunkOffer` at a time).
    static let maxTakenPerOffer = PeerMessage.maxChunkOffer
    /// How soon an offer or a want waiting for room in a budget looks again.
    static let budgetRetry = TimeAmount.milliseconds(50)
    /// How long a device has to send the chunks an answer asked for before the connection closes (16 chunks of 4 MiB
    /// at 250 KB/s).
    static let uploadWindow = TimeAmount.minutes(5)

    /// Whether this connection's device is a current member (`writes`: a writing one) of the space's log as it
    /// stands now; false when the relay holds no log.
    private static func listed(_ device: DevicePublicKeys?, in membership: MembershipState?, writes: Bool) -> Bool {
        guard let membership, let device, let member = membership.member(device.nodeID), member.keys == device, member.isCurrent
        else { return false }
        return !writes || member.role.writes
    }

    /// The device offers `ids`: a writing member is asked for those the space lacks, as many as its chunk quota and
    /// the relay's upload budget have room for; told which others it lacks (to offer later); anyone else, nothing.
    func offered(_ ids: [ChunkID], space: SpaceID, context: ChannelHandlerContext) throws {
        // One offer at a time, after every chunk the last one's answer asked for: a device cannot queue uploads.
        guard !answeringOffer, chunksExpected.isEmpty else { throw SyncRejection.malformed }
        answeringOffer = true
        // In order with what the device sent before it: the operations it sent first may be the log that lists it.
        receive(.offer(ids), space: space, context: context)
    }

    /// Answers an offer (from the inbox, once what came before it is stored), then goes on with the next item.
    func answer(offer ids: [ChunkID], space: SpaceID, context: ChannelHandlerContext) {
        let device = self.device
        run(context: context, { relay -> (take: [ChunkID], later: [ChunkID]) in
            // Without a log nobody is known to be a member, and nothing is held: the device offers again later,
            // once the log it sends (or another member's) is in.
            guard let membership = try await relay.membership(space) else { return ([], ids) }
            guard Self.listed(device, in: membership, writes: true) else { return ([], []) }
            let held = try await relay.store.heldChunks(ids, space: space)
            // A holder offering what the relay holds keeps it (its lease starts again).
            if !held.isEmpty { _ = try await relay.store.keepChunks(Array(held), space: space, nowMs: RelayServer.nowMs()) }
            let lacking = ids.filter { !held.contains($0) }
            let room = max(0, relay.store.limits.maxChunkBytesPerSpace - (try await relay.store.chunkBytes(space: space)))
            let take = min(lacking.count, Self.maxTakenPerOffer, room / PeerMessage.maxSealedChunkBytes)
            return (Array(lacking.prefix(take)), Array(lacking.dropFirst(take)))
        }) { connection, answer, context in
            connection.storing = false
            connection.resumeReading(context: context)
            connection.storeNext(space: space, context: context)
            if !answer.later.isEmpty { connection.send(.chunkMissing(answer.later), context: context) }
            connection.ask(for: answer.take, space: space, context: context)
        }
    }

    /// A member still needs chunks `ids` (from the inbox): a current member's (a reader's too: it adds nothing to
    /// the quota) renews the leases of those held; anyone else's is ignored. Nothing is answered.
    func keep(chunks ids: [ChunkID], space: SpaceID, context: ChannelHandlerContext) {
        let device = self.device
        run(context: context, { relay -> Int in
            guard Self.listed(device, in: try await relay.membership(space), writes: false) else { return 0 }
            return try await relay.store.keepChunks(ids, space: space, nowMs: RelayServer.nowMs())
        }) { connection, _, context in
            connection.storing = false
            connection.resumeReading(context: context)
            connection.storeNext(space: space, context: context)
        }
    }

    /// Asks for `wanted` once the relay's upload budget has room for all of them (looking again every `budgetRetry`
    /// meanwhile, as other uploads finish: memory, not the device, waits); they must come within `uploadWindow`.
    private func ask(for wanted: [ChunkID], space: SpaceID, context: ChannelHandlerContext) {
        guard case .established = state else { return }
        guard relay.chunkUploads.reserve(wanted.count * PeerMessage.maxSealedChunkBytes, for: space.hex) else {
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            context.eventLoop.scheduleTask(in: Self.budgetRetry) {
                let (connection, context) = bound.value
                connection.ask(for: wanted, space: space, context: context)
            }
            return
        }
        chunkRoom += wanted.count
        answeringOffer = false
        chunksExpected = Set(wanted)
        send(.chunkWant(wanted), context: context)
        guard !wanted.isEmpty else { return }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        uploadExpiry?.cancel()
        uploadExpiry = context.eventLoop.scheduleTask(in: Self.uploadWindow) {
            let (connection, context) = bound.value
            guard !connection.chunksExpected.isEmpty else { return }
            connection.relay.logger.info("A device did not send the chunks it offered in time; closing its connection")
            connection.close(context: context)
        }
    }

    /// Gives back the room of `count` chunks asked for (stored, not sent, or the connection closed).
    func releaseChunkRoom(_ count: Int, space: SpaceID) {
        let count = min(count, chunkRoom)
        guard count > 0 else { return }
        chunkRoom -= count
        relay.chunkUploads.release(count * PeerMessage.maxSealedChunkBytes, for: space.hex)
    }

    /// A device's `CHUNK_MISSING`: chunks the relay asked for that it no longer holds.
    func notHeld(_ ids: [ChunkID], space: SpaceID) {
        releaseChunkRoom(ids.filter { chunksExpected.remove($0) != nil }.count, space: space)
        if chunksExpected.isEmpty { uploadExpiry?.cancel() }
    }

    /// The device sends chunk `id`: only one the relay asked for, of a sealed chunk's shape, stored in order.
    func receivedChunk(_ id: ChunkID, sealed: [UInt8], space: SpaceID, context: ChannelHandlerContext) throws {
        guard chunksExpected.remove(id) != nil,
            SealedChunkLayout.isWellFormed(sealed, maximum: PeerMessage.maxSealedChunkBytes)
        else { throw SyncRejection.badChunk }
        if chunksExpected.isEmpty { uploadExpiry?.cancel() }
        receive(.chunk(id, sealed), space: space, context: context)
    }

    /// Stores a received chunk (from the inbox), then goes on with the next item.
    func store(chunk id: ChunkID, sealed: [UInt8], space: SpaceID, context: ChannelHandlerContext) {
        run(context: context, { relay in
            let outcome = try await relay.store.storeChunk(id, sealed: sealed, space: space)
            relay.record(.chunk(outcome, bytes: sealed.count))
            return outcome
        }) { connection, _, context in
            connection.releaseChunkRoom(1, space: space)
            connection.storing = false
            connection.resumeReading(context: context)
            connection.storeNext(space: space, context: context)
        }
    }

    /// The device asks for `ids`: a member is served them, anyone else is told none is held.
    func wantedChunks(_ ids: [ChunkID], space: SpaceID, context: ChannelHandlerContext) throws {
        guard !ids.isEmpty else { throw SyncRejection.malformed }
        guard chunkWants.count + ids.count <= Self.maxQueuedChunkWants else { throw SyncRejection.malformed }
        chunkWants.append(contentsOf: ids)
        serveChunk(space: space, context: context)
    }

    /// Reads and sends the next chunk asked for, once the one before is written and the relay's serving budget has
    /// room for it; a device the log does not list as a current member is told it is not held.
    private func serveChunk(space: SpaceID, context: ChannelHandlerContext) {
        guard !servingChunk, !chunkWants.isEmpty, case .established = state else { return }
        guard relay.chunkServing.reserve(PeerMessage.maxSealedChunkBytes) else {
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            context.eventLoop.scheduleTask(in: Self.budgetRetry) {
                let (connection, context) = bound.value
                connection.serveChunk(space: space, context: context)
            }
            return
        }
        servingChunk = true
        let id = chunkWants.removeFirst()
        let device = self.device
        run(context: context, { relay -> [UInt8]? in
            guard Self.listed(device, in: try await relay.membership(space), writes: false) else { return nil }
            return try await relay.store.chunk(id, space: space)
        }) { connection, sealed, context in
            let written: EventLoopFuture<Void>?
            if let sealed {
                connection.served(ChunkCopy(id: id, prefix: Array(sealed.prefix(SealedChunkLayout.headerCount))))
                connection.relay.record(.chunkServed(bytes: sealed.count))
                written = connection.send(.chunk(id: id, sealed: sealed[...]), context: context)
            } else {
                written = connection.send(.chunkMissing([id]), context: context)
            }
            let bound = NIOLoopBound((connection, context), eventLoop: context.eventLoop)
            (written ?? context.eventLoop.makeSucceededVoidFuture()).whenComplete { _ in
                let (connection, context) = bound.value
                connection.relay.chunkServing.release(PeerMessage.maxSealedChunkBytes)
                connection.servingChunk = false
                connection.serveChunk(space: space, context: context)
            }
        }
    }

    /// Remembers a copy served, the oldest of `maxServedChunks` going first.
    private func served(_ copy: ChunkCopy) {
        if chunksServed.updateValue(copy.prefix, forKey: copy.id) == nil { servedOrder.append(copy.id) }
        while servedOrder.count > Self.maxServedChunks { chunksServed[servedOrder.removeFirst()] = nil }
    }

    /// A writing member found copies this connection served it bad: those copies are dropped, if they are still the
    /// ones held (others are not the device's to judge).
    func badChunks(_ ids: [ChunkID], space: SpaceID, context: ChannelHandlerContext) {
        let copies = ids.compactMap { id in chunksServed.removeValue(forKey: id).map { ChunkCopy(id: id, prefix: $0) } }
        servedOrder.removeAll { id in ids.contains(id) }
        guard !copies.isEmpty else { return }
        let device = self.device
        run(context: context, { relay in
            guard Self.listed(device, in: try await relay.membership(space), writes: true) else { return 0 }
            let dropped = try await relay.store.dropChunks(copies, space: space)
            relay.record(.chunksDropped(dropped))
            relay.logger.warning(
                "A member found chunk copies this relay served bad; dropped them",
                metadata: ["space": "\(space.hex)", "chunks": "\(dropped)"])
            return dropped
        }) { _, _, _ in }
    }
}
