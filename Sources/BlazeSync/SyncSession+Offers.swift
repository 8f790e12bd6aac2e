import BlazeBlob
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeWire
import Foundation
import NIOCore
import Synchronization

/// Leaving blob chunks on a relay (SYNC.md §12, "Relays"): a device offers the relays it dialed the chunks it holds,
/// so a device that is never online at the same time can fetch them there. One offer of up to 16 ids at a time; the
/// relay answers with those it takes (possibly none), after a `CHUNK_MISSING` of those it lacks and cannot take now,
/// and the next offer goes once the taken ones are all written. Every chunk held is offered once per connection, new
/// ones as the store changes (a put, a fetch from elsewhere; listed at most every `relistInterval`), and those the
/// relay could not take yet again after a pause that doubles while nothing is taken. The chunks go sealed, as to any
/// peer: the relay learns their sizes (to within 4 KiB) and ids, never their content.
/// What each database's documents referred to when last read for a relay (`SyncSession.referredChunks`), by file.
private let lastReferred = Mutex<
    [String: (db: ObjectIdentifier, generation: Int?, sequence: Int64, at: NIODeadline, referred: SyncSession.Referred)]
>([:])

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
        } else if offerNoStore && !keepDue {
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
        let (db, stores, keep) = (link.db, engine.chunkStores, keepDue)
        // A relay that refused a `CHUNK_KEEP` (an older version) is told nothing, so nothing is read for it.
        let refers = keep && !engine.withoutChunkKeep.withLock { $0.contains(link.device.nodeIDHex) }
        let listed = keep ? nil : offeredGeneration
        let (engine, bound) = (self.engine, NIOLoopBound((self, context), eventLoop: context.eventLoop))
        engine.chunkPool.runIfActive(eventLoop: context.eventLoop) { () throws -> Listing? in
            // A database that never held a blob has no store: nothing to offer, and none is made for it here.
            let store = FileManager.default.fileExists(atPath: ChunkStores.directory(of: db)) ? try stores.store(for: db) : nil
            let referred = refers ? try Self.referredChunks(db: db, store: store, generation: store?.generation) : nil
            guard let store else { return keep ? Listing(generation: nil, held: [], referred: referred) : nil }
            let generation = store.generation
            guard generation != listed else { return nil }
            return Listing(generation: generation, held: store.all(), referred: referred)
        }
        .whenComplete { result in
            let (session, context) = bound.value
            session.listingOffers = false
            if case .success(let listing) = result, listing?.generation == nil, engine.chunkStores.opened(for: db) == nil {
                session.offerNoStore = true
            }
            guard case .success(let listing?) = result, !session.closed else { return }
            if keep {
                session.keepHeld(Array(Set(listing.held).union(listing.referred?.named ?? [])), context: context)
                session.keepUnheld(listing.referred?.unheld ?? [], context: context)
            }
            guard let generation = listing.generation else { return }
            session.offeredGeneration = generation
            session.offerList = listing.held.filter { !session.offered.contains($0) }
            if !session.offerList.isEmpty { session.offerChunks(context: context) }
        }
    }

    /// What one listing for a relay found: the chunk store's generation and the chunks held (no generation: the
    /// database has no store), and when the relay is due to be told what to keep, what the documents refer to.
    struct Listing: Sendable {
        let generation: Int?
        let held: [ChunkID]
        let referred: Referred?
    }

    /// The chunks a database's live documents refer to that this device can name: every blob's manifest, and the
    /// pieces of each manifest held here (`named`); and the blobs whose manifest is not held here (`unheld`, at most
    /// `maxManifestsPerRound`).
    struct Referred: Sendable {
        let named: Set<ChunkID>
        let unheld: [ChunkID]
    }

    /// The chunks `db`'s live documents refer to (see `Referred`), their manifests read from `store` (at
    /// `generation`). Reused for `referredReuse` while neither the database (its feed's last sequence) nor the store
    /// changed: every relay connection asks, and reading means parsing every document that mentions a blob.
    static func referredChunks(db: BlazeDatabase, store: ChunkStore?, generation: Int?) throws -> Referred {
        let (now, sequence) = (NIODeadline.now(), db.feed.lastSequence)
        if let last = lastReferred.withLock({ $0[db.path] }), last.db == ObjectIdentifier(db), last.generation == generation,
            last.sequence == sequence, now < last.at + referredReuse
        {
            return last.referred
        }
        let blobs = Array(Set(try db.documentBlobReferences().map(\.reference.id)).prefix(maxNamed))
        var named = Set(blobs)
        var unheld: [ChunkID] = []
        let reader = store.map { BlobReader(store: $0, maxSize: .max) }
        for blob in blobs where named.count < maxNamed {
            // A manifest held but unreadable (damaged) names nothing; one not held is fetched to be read.
            guard let reader, reader.store.contains(blob) else {
                unheld.append(blob)
                continue
            }
            guard let manifest = try? reader.manifest(blob) else { continue }
            for piece in manifest.pieces {
                guard named.count < maxNamed else { break }
                named.insert(piece.id)
            }
        }
        // In no fixed order, so that blobs no device holds (or references made up by a member) cannot keep the same
        // others waiting round after round.
        let referred = Referred(named: named, unheld: Array(unheld.shuffled().prefix(maxManifestsPerRound)))
        // Kept only while small: a library of millions of chunks is read again rather than held for ten minutes.
        lastReferred.withLock { $0[db.path] = named.count <= 1 << 16 ? (ObjectIdentifier(db), generation, sequence, now, referred) : nil }
        return referred
    }

    /// How long what a database's documents refer to is reused, and the most chunk ids named from them (32 MiB of
    /// `CHUNK_KEEP`s; a made-up manifest can list a hundred thousand pieces).
    static let referredReuse = TimeAmount.minutes(10), maxNamed = 1 << 20

    /// Forgets what the database whose file is `path` referred to (it was dropped).
    static func forgetReferred(path: String) { _ = lastReferred.withLock { $0.removeValue(forKey: path) } }

    /// Fetches the manifests of `blobs` (referred to here, not held), `manifestBatch` at a time, from whichever
    /// devices hold them, and tells the relay the pieces those that arrived list: a blob that only devices not
    /// holding its content still refer to stays on the relay while they connect (RELAY.md, "Leases").
    func keepUnheld(_ blobs: [ChunkID], context: ChannelHandlerContext) {
        guard let link, !closed, !blobs.isEmpty,
            !engine.withoutChunkKeep.withLock({ $0.contains(link.device.nodeIDHex) })
        else { return }
        let batch = Array(blobs.prefix(Self.manifestBatch))
        let rest = Array(blobs.dropFirst(batch.count))
        let (db, engine, loop) = (link.db, self.engine, context.eventLoop)
        let bound = NIOLoopBound((self, context), eventLoop: loop)
        engine.fetchChunks(db: db, ids: batch, timeout: Self.manifestTimeout, waitForSource: false) { _ in
            // Whichever arrived (one no source holds ends the fetch early: the rest wait for the next round).
            engine.chunkPool.runIfActive(eventLoop: loop) { () throws -> [ChunkID] in
                let reader = BlobReader(store: try engine.chunkStores.store(for: db), maxSize: .max)
                var named: [ChunkID] = []
                for blob in batch {
                    guard let manifest = try? reader.manifest(blob) else { continue }
                    named += manifest.pieces.map(\.id)
                }
                return Array(Set(named))
            }
            .whenComplete { result in
                let (session, context) = bound.value
                guard !session.closed else { return }
                if case .success(let named) = result { session.sendKeep(named, context: context) }
                session.keepUnheld(rest, context: context)
            }
        }
    }

    /// Manifests fetched at once by `keepUnheld`, how long one such fetch may take, and the most fetched in one round
    /// (a connection, or `keepInterval` on a long one); the rest wait for the next. A reference made up by a member
    /// may name any chunk, so a round may fetch up to that many chunks of content.
    static let manifestBatch = 256, maxManifestsPerRound = 1_000
    static let manifestTimeout = TimeAmount.seconds(120)

    /// Tells the relay every chunk this device holds or can name as referred to (`ids`), so it keeps them (renewing
    /// their leases, those fetched from it too), and again after `keepInterval`; never a relay that refused the
    /// message before (an older version: `SyncSession.channelRead`).
    func keepHeld(_ ids: [ChunkID], context: ChannelHandlerContext) {
        keepDue = false
        sendKeep(ids, context: context)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        keepTask = context.eventLoop.scheduleTask(in: Self.keepInterval) {
            let (session, context) = bound.value
            guard !session.closed else { return }
            session.keepDue = true
            session.offerChunks(context: context)
        }
    }

    /// Sends `ids` in `CHUNK_KEEP` messages, unless the relay refused one before.
    func sendKeep(_ ids: [ChunkID], context: ChannelHandlerContext) {
        guard let link, !engine.withoutChunkKeep.withLock({ $0.contains(link.device.nodeIDHex) }) else { return }
        if !ids.isEmpty { sentChunkKeep = true }
        for start in stride(from: 0, to: ids.count, by: PeerMessage.maxChunkKeep) {
            send(.chunkKeep(Array(ids[start..<min(ids.count, start + PeerMessage.maxChunkKeep)])), context: context)
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
