import BlazeBlob
import BlazeCrypto
import BlazeProtocol
import BlazeWire
import Foundation
import NIOCore

/// Leaving blob chunks on a relay (SYNC.md §12, "Relays"): a device offers the relays it dialed the chunks it holds,
/// so a device that is never online at the same time can fetch them there. One offer of up to 16 ids at a time; the
/// relay answers with those it takes (possibly none), after a `CHUNK_MISSING` of those it lacks and cannot take now,
/// and the next offer goes once the taken ones are all written. Every chunk held is offered once per connection, new
/// ones as the store changes (a put, a fetch from elsewhere; listed at most every `relistInterval`), and those the
/// relay could not take yet again after a pause that doubles while nothing is taken. The chunks go sealed, as to any
/// peer: the relay learns their sizes (to within 4 KiB) and ids, never their content.
extension SyncSession {
    /// The shortest time between two listings of the chunk store for one relay.
    static let relistInterval = TimeAmount.seconds(5)
    /// The first and the longest pause before chunks a relay could not take are offered again.
    static let reofferFirst = TimeAmount.seconds(5), reofferLongest = TimeAmount.minutes(30)
    /// How often a relay is told again, on a long connection, every chunk this device holds (`CHUNK_KEEP`, which
    /// renews their leases there: Protocol/RELAY.md, "Blob chunks").
    static let keepInterval = TimeAmount.hours(12)

    /// Offers the relay the next chunks it has not been offered on this connection, once the last offer's chunks
    /// are written; lists the store again when it changed since it was last listed.
    func offerChunks(context: ChannelHandlerContext) {
        guard servesUnlisted, let link, !closed, offerOut == nil, !listingOffers, chunkQueue.isEmpty, chunksServing == 0
        else { return }
        guard !engine.withoutChunks.withLock({ $0.contains(link.device.nodeIDHex) }) else { return }
        if !offerList.isEmpty {
            let next = Array(offerList.prefix(PeerMessage.maxChunkOffer))
            offerList.removeFirst(next.count)
            offerOut = Set(next)
            offered.formUnion(next)
            sentChunkOffer = true
            send(.chunkOffer(next), context: context)
            return
        }
        // Checked here, without leaving the event loop, on every commit: a store unchanged since it was listed, or
        // none at all, has nothing new to offer (unless the relay is due to be told what is held again).
        if let store = engine.chunkStores.opened(for: link.db) {
            guard store.generation != offeredGeneration || keepDue else { return }
        } else if offerNoStore {
            return
        }
        let now = NIODeadline.now()
        if let last = lastListing, now < last + Self.relistInterval {
            guard !relistScheduled else { return }
            relistScheduled = true
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            context.eventLoop.scheduleTask(deadline: last + Self.relistInterval) {
                let (session, context) = bound.value
                session.relistScheduled = false
                session.offerChunks(context: context)
            }
            return
        }
        lastListing = now
        listingOffers = true
        let (db, stores, listed) = (link.db, engine.chunkStores, keepDue ? nil : offeredGeneration)
        let (engine, bound) = (self.engine, NIOLoopBound((self, context), eventLoop: context.eventLoop))
        engine.chunkPool.runIfActive(eventLoop: context.eventLoop) { () throws -> (Int, [ChunkID])? in
            // A database that never held a blob has no store: nothing to offer, and none is made for it here.
            guard FileManager.default.fileExists(atPath: ChunkStores.directory(of: db)) else { return nil }
            let store = try stores.store(for: db)
            let generation = store.generation
            guard generation != listed else { return nil }
            return (generation, store.all())
        }
        .whenComplete { result in
            let (session, context) = bound.value
            session.listingOffers = false
            if case .success(nil) = result, engine.chunkStores.opened(for: db) == nil { session.offerNoStore = true }
            guard case .success(let (generation, ids)?) = result, !session.closed else { return }
            session.offeredGeneration = generation
            if session.keepDue { session.keepHeld(ids, context: context) }
            session.offerList = ids.filter { !session.offered.contains($0) }
            if !session.offerList.isEmpty { session.offerChunks(context: context) }
        }
    }

    /// Tells the relay every chunk this device holds (`ids`), so it keeps them (renewing their leases, those fetched
    /// from it too), and again after `keepInterval`; never a relay that refused the message before (an older
    /// version: `SyncSession.channelRead`).
    func keepHeld(_ ids: [ChunkID], context: ChannelHandlerContext) {
        guard let link else { return }
        keepDue = false
        guard !engine.withoutChunkKeep.withLock({ $0.contains(link.device.nodeIDHex) }) else { return }
        if !ids.isEmpty { sentChunkKeep = true }
        for start in stride(from: 0, to: ids.count, by: PeerMessage.maxChunkKeep) {
            send(.chunkKeep(Array(ids[start..<min(ids.count, start + PeerMessage.maxChunkKeep)])), context: context)
        }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        keepTask = context.eventLoop.scheduleTask(in: Self.keepInterval) {
            let (session, context) = bound.value
            guard !session.closed else { return }
            session.keepDue = true
            session.offerChunks(context: context)
        }
    }

    /// The relay takes `ids` of the offer it answers: they are served (sealed) like any chunk asked for.
    func taken(_ ids: [ChunkID], context: ChannelHandlerContext) {
        guard let out = offerOut, ids.allSatisfy({ out.contains($0) }) else {
            // An answer to no offer, or naming chunks not offered: a relay learns nothing it was not offered.
            errorCaught(context: context, error: SyncRejection.malformed)
            return
        }
        answeredChunks = true
        offerOut = nil
        if !ids.isEmpty { reofferPause = nil }
        chunkQueue.append(contentsOf: ids)
        serveChunks(context: context)
        offerChunks(context: context)
    }

    /// The relay lacks `ids` of the offer it is answering and cannot take them now (no room, or no log of the space
    /// yet): they are offered again after a pause.
    func declined(_ ids: [ChunkID], context: ChannelHandlerContext) {
        guard let out = offerOut else { return }
        let later = ids.filter { out.contains($0) }
        guard !later.isEmpty else { return }
        let first = declinedChunks.isEmpty
        declinedChunks.append(contentsOf: later)
        guard first else { return }
        let pause = reofferPause.map { min($0 * 2, Self.reofferLongest) } ?? Self.reofferFirst
        reofferPause = pause
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        context.eventLoop.scheduleTask(in: pause) {
            let (session, context) = bound.value
            guard !session.closed else { return }
            session.offerList += session.declinedChunks
            session.declinedChunks = []
            session.offerChunks(context: context)
        }
    }
}
