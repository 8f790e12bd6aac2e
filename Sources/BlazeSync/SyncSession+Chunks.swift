import BlazeBlob
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeWire
import NIOCore

/// Blob chunks over a session (ARCHITECTURE.md, "Blobs"): the session is a source the engine's `ChunkFetcher` asks
/// for chunks its database lacks (`CHUNK_WANT`), and it serves the chunks the peer asks for, sealed under the space's
/// current epoch key (`CHUNK`, or `CHUNK_MISSING` for those it does not hold).
///
/// A member device of the space is asked and served; a relay this device dialed is asked, and is offered the chunks
/// held here (`SyncSession+Offers`), served only those it takes; a device not (or no longer) in the log, or one of an
/// older version, is neither. Serving reads and seals at most `servingAtOnce` chunks at a time, the next
/// once the last was written, so a peer that reads slowly holds at most that many sealed chunks here. A peer may have
/// `maxQueuedWants` chunks asked and not yet served; more is refused. Received chunks are opened, checked against
/// their id and stored off the event loop, each asked chunk once; one this session did not ask for (or a copy of one
/// being stored), or one that does not open as its id, is refused (`bad_chunk`).
extension SyncSession {
    /// Chunks read and sealed for the peer at once.
    static let servingAtOnce = 2
    /// Chunks the peer may have asked for and not been served (a fetcher asks for at most 4 at a time).
    static let maxQueuedWants = 2 * PeerMessage.maxChunkWants

    /// Whether the device at the other end may ask for chunks and be asked: a current member of the space, not a
    /// relay this device dialed.
    var chunkPeer: Bool {
        guard let link, !servesUnlisted, !peerRemoved else { return false }
        if case .member = link.space.snapshot.admits(link.device) { return true }
        return false
    }

    /// Whether chunks may be asked of the other end: a current member's device, or a relay this device dialed.
    var chunkSourcePeer: Bool { servesUnlisted ? link != nil : chunkPeer }

    /// Attaches this session to the engine's fetcher as a source for its database.
    func attachChunkSource(context: ChannelHandlerContext) {
        guard let link, chunkSource == nil, chunkSourcePeer else { return }
        guard !engine.withoutChunks.withLock({ $0.contains(link.device.nodeIDHex) }) else { return }
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let loop = context.eventLoop
        chunkSource = engine.chunks.attach(db: link.db.name) { ids in
            loop.execute {
                let (session, context) = bound.value
                guard !session.closed else { return }
                session.sentChunkWant = true
                session.send(.chunkWant(ids), context: context)
            }
        }
    }

    /// Attaches or detaches this session as a chunk source as the peer's membership now says.
    func refreshChunkSource(context: ChannelHandlerContext) {
        if chunkSourcePeer { attachChunkSource(context: context) } else { detachChunkSource() }
    }

    /// Detaches this session from the fetcher: what it was asked goes to other sources.
    func detachChunkSource() {
        if let chunkSource { engine.chunks.detach(chunkSource) }
        chunkSource = nil
    }

    /// The peer asks for `ids` (a relay: those it takes of this side's offer).
    func wanted(_ ids: [ChunkID], context: ChannelHandlerContext) {
        guard link != nil else { return }
        if servesUnlisted {
            taken(ids, context: context)
            return
        }
        // A member never sends an empty `CHUNK_WANT` (only a relay answers an offer with one): nothing to serve.
        guard !ids.isEmpty else { return }
        guard chunkPeer else {
            // Not a member's device (a relay, one not admitted yet or removed): it learns nothing of what is held here.
            send(.chunkMissing(ids), context: context)
            return
        }
        guard chunkQueue.count + ids.count <= Self.maxQueuedWants else {
            errorCaught(context: context, error: SyncRejection.malformed)
            return
        }
        chunkQueue.append(contentsOf: ids)
        serveChunks(context: context)
    }

    /// Reads, seals and sends queued chunks, `servingAtOnce` at a time; once all are, a relay is offered more.
    func serveChunks(context: ChannelHandlerContext) {
        guard let link else { return }
        while chunksServing < Self.servingAtOnce, !chunkQueue.isEmpty, !closed {
            let id = chunkQueue.removeFirst()
            chunksServing += 1
            let (db, key, stores) = (link.db, link.key, engine.chunkStores)
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            engine.chunkPool.runIfActive(eventLoop: context.eventLoop) { () throws -> [UInt8]? in
                guard let sealing = key.chunkSealing else { return nil }
                // Read into the buffer it is sealed from, and sealed into the message: no other copy of the chunk.
                return try SealedChunk.seal(
                    reading: id, from: try stores.store(for: db), space: key.id, epoch: sealing.epoch.value, secret: sealing.secret,
                    after: PeerMessage.chunkHeader(id))
            }
            .whenComplete { result in
                let (session, context) = bound.value
                guard !session.closed else { return }
                let sent: EventLoopFuture<Void>
                switch result {
                case .success(let bytes?):
                    session.report.update { $0.chunksSent += 1 }
                    sent = session.send(bytes: bytes, context: context)
                case .success(nil), .failure:
                    sent = session.send(.chunkMissing([id]), context: context)
                }
                sent.whenComplete { _ in
                    let (session, context) = bound.value
                    session.chunksServing -= 1
                    session.serveChunks(context: context)
                    session.offerChunks(context: context)
                }
            }
        }
    }

    /// The peer sent chunk `id`: opened, checked and stored off the loop, then the fetcher learns it arrived.
    func received(chunk id: ChunkID, sealed: ArraySlice<UInt8>, context: ChannelHandlerContext) {
        answeredChunks = true
        guard let link, let source = chunkSource, engine.chunks.accept(source, id) else {
            // Not asked of this session, or a copy of one being stored: a peer cannot fill a device's disk or memory.
            errorCaught(context: context, error: SyncRejection.badChunk)
            return
        }
        let (engine, db, key) = (self.engine, link.db, link.key)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        engine.chunkPool.runIfActive(eventLoop: context.eventLoop) { () -> ChunkOutcome in
            let keys = try engine.blobKeys(db: db)
            guard let epoch = SealedChunk.epoch(of: sealed) else { return .refused }
            let secrets = key.secrets(epoch: Epoch(epoch))
            // A chunk sealed under an epoch this device holds no key for is not the peer's fault (keys may be on
            // their way): another source is asked.
            guard !secrets.isEmpty else { return .noKey }
            let store: ChunkStore
            do { store = try engine.chunkStores.store(for: db) } catch { return .storeFailed(ChunkStores.storeError(error)) }
            // Opened, checked and stored from where the opened content lies (no copy of it).
            let put: Result<Int, ChunkStoreError>
            do {
                put = try SealedChunk.open(sealed, id: id, keys: keys, secrets: secrets, maximum: keys.chunker.sizes.maximum) { content in
                    Result { () throws(ChunkStoreError) -> Int in
                        _ = try store.put(id, content)
                        return content.count
                    }
                }
            } catch {
                return .refused
            }
            switch put {
            case .success(let count): return .stored(count)
            case .failure(let error): return .storeFailed(ChunkStores.storeError(error))
            }
        }
        .whenComplete { result in
            let (session, context) = bound.value
            switch result {
            case .success(.stored(let bytes)):
                session.report.update { $0.chunksReceived += 1; $0.chunkBytesReceived += bytes }
                // A relay that served it holds it: it is not offered back.
                if session.servesUnlisted { session.offered.insert(id) }
                engine.chunks.arrived(source, db: db.name, id)
            case .success(.noKey):
                engine.chunks.lacks(source, db: db.name, [id])
            case .success(.refused) where session.servesUnlisted:
                // A relay cannot check what members upload: its copy is bad, not the relay. It drops it, and a
                // member's next offer brings a good one; this fetch asks elsewhere.
                engine.chunks.lacks(source, db: db.name, [id])
                session.report.reject(.badChunk)
                if !session.closed { session.send(.chunkBad([id]), context: context) }
            case .success(.refused):
                engine.chunks.lacks(source, db: db.name, [id])
                session.errorCaught(context: context, error: SyncRejection.badChunk)
            case .success(.storeFailed(let error)):
                engine.chunks.failed(db: db.name, id, source: source, error: error)
            case .failure(let error):
                engine.chunks.failed(db: db.name, id, source: source, error: ChunkStores.storeError(error))
            }
        }
    }

    /// The peer lacks `ids` it was asked for (a relay: or of the offer it is answering, that it cannot take now).
    func peerLacks(_ ids: [ChunkID], context: ChannelHandlerContext) {
        answeredChunks = true
        if servesUnlisted, offerOut != nil { declined(ids, context: context) }
        guard let chunkSource, let db = link?.db.name else { return }
        engine.chunks.lacks(chunkSource, db: db, ids)
    }
}

/// What became of a received chunk.
enum ChunkOutcome: Sendable {
    /// Stored; its content's length.
    case stored(Int)
    /// This device holds no key for the epoch it is sealed under.
    case noKey
    /// It does not open as the chunk asked for.
    case refused
    /// Storing it failed here.
    case storeFailed(StoreError)
}
