import BlazeCRDT
import BlazeCrypto
import BlazeStore
import Logging
import NIOCore
import NIOPosix
import Synchronization

/// One peer connection, from handshake to close (SYNC.md, "Peer protocol").
///
/// After the handshake both sides send `STATE` (what they hold per origin, and their own signed head), then each
/// sends the other exactly the entries it lacks, per origin in sequence order, in batches that end at signed heads,
/// and keeps pushing new entries as changes commit. Received batches are verified and applied one at a time, in
/// order, on the I/O pool; reading pauses while a backlog of batches or bytes waits, so a fast sender cannot make
/// memory grow. A batch refused for what its origin signed is counted and that origin skipped for the session; any
/// other frame or entry that does not verify closes the connection after counting the reason, and the outbound side
/// reconnects. A handshake that does not finish within the handshake timeout, or a peer silent for the engine's
/// timeout, closes it too; a quiet connection sends `PING` so that it is never silent.
final class PeerSession: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    enum Phase {
        case awaitingHello(Handshake.Client)
        case awaitingAuth(Handshake.Server)
        case awaitingReply(Handshake.Client)
        case established
        case closed
    }

    let engine: SyncEngine
    let peer: String
    let direction: PeerDirection
    private var phase: Phase
    private var cipher: SessionCipher?
    private var db: BlazeDatabase?
    private var key: SpaceKey?
    /// What the peer holds, as far as this side knows (its STATE, plus what was sent or received since).
    private var peerVector: [NodeID: UInt64]?
    private var pumping = false
    private var pumpAgain = false
    /// Received batches in arrival order, each already being verified on the I/O pool.
    private var inbox: [(batch: EntryBatch, verified: EventLoopFuture<VerifiedBatch>)] = []
    /// Entry bytes of the batches in `inbox`.
    private var inboxBytes = 0
    private var applying = false
    /// Origins whose batches this session refuses: one of their batches was refused for what the origin signed
    /// (`SyncRejection.blamesOrigin`); later batches of theirs could not link to anything stored here.
    private var refusedOrigins: Set<NodeID> = []
    private var readPaused = false
    private var feedToken: Int?
    /// Bytes read but not yet decoded into frames.
    private var pending = ByteBuffer()
    /// The sealed body length of the frame being read, once its sealed length has opened.
    private var bodyLength: Int?
    private var lastRead = NIODeadline.now()
    private var lastWrite = NIODeadline.now()
    private var timer: RepeatedTask?
    /// Wire bytes sent and received since they were last added to the status book.
    private var unreported = (sent: 0, received: 0)
    /// Set by the feed listener (on the writer thread) so that a burst of commits schedules one pump.
    private let wake = WakeFlag()
    /// Fired once the handshake succeeds (outbound links reset their backoff).
    var onEstablished: (() -> Void)?

    /// Batches waiting to be applied before reading pauses.
    static let maxInbox = 4
    /// Bytes of received batches waiting to be applied before reading pauses: with one frame being read, a peer
    /// holds at most this plus `SessionCipher.maxBody` of the receiver's memory.
    static let maxInboxBytes = 8 << 20
    /// Entries per batch read for sending, and bytes read per pump round.
    static let batchEntries = 1000
    static let roundBytes = 4 << 20

    /// An outbound session for `db`, which proves it holds `key`.
    init(engine: SyncEngine, db: BlazeDatabase, key: SpaceKey, peer: String) {
        self.engine = engine
        self.peer = peer
        self.direction = .outbound
        self.db = db
        self.key = key
        self.phase = .awaitingHello(Handshake.Client(key: key))
    }

    /// An inbound session admitted by the engine's gate for `admitted` (its source address): the handshake decides
    /// which database it serves.
    init(engine: SyncEngine, admitted: String) {
        self.engine = engine
        self.peer = "inbound"
        self.direction = .inbound
        self.admitted = admitted
        self.phase = .awaitingAuth(Handshake.Server())
    }

    /// The source address the gate admitted this inbound connection for; nil for outbound sessions.
    private var admitted: String?
    /// Whether the gate still counts this connection as handshaking.
    private var handshaking = true
    private var handshakeDeadline: Scheduled<Void>?

    private var dbName: String? { db?.name }

    private func status(_ edit: (inout PeerStatus) -> Void) {
        guard let dbName else { return }
        let bytes = unreported
        unreported = (0, 0)
        engine.status.update(db: dbName, peer: peer, direction: direction) {
            $0.sentBytes += bytes.sent
            $0.receivedBytes += bytes.received
            edit(&$0)
        }
    }

    func channelActive(context: ChannelHandlerContext) {
        if case .awaitingAuth(let server) = phase {
            context.writeAndFlush(wrapOutboundOut(frame(server.hello)), promise: nil)
        }
        lastRead = .now()
        lastWrite = lastRead
        let tick = TimeAmount.nanoseconds(engine.timeout.nanoseconds / 3)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        timer = context.eventLoop.scheduleRepeatedTask(initialDelay: tick, delay: tick) { _ in
            let (session, context) = bound.value
            session.tick(context: context)
        }
        // The handshake has its own, short deadline (a stranger holding a connection open gains nothing).
        let limit = engine.handshakeTimeout
        handshakeDeadline = context.eventLoop.scheduleTask(in: limit) {
            let (session, context) = bound.value
            switch session.phase {
            case .established, .closed: break
            default: session.timedOut("handshake not finished within \(limit.nanoseconds / 1_000_000) ms", context: context)
            }
        }
        context.fireChannelActive()
    }

    /// Enforces the handshake deadline and the silence limit, and pings when this side has been quiet.
    private func tick(context: ChannelHandlerContext) {
        let now = NIODeadline.now()
        switch phase {
        case .closed:
            return
        case .established:
            // A peer is not silent while this side is not reading (a backlog being applied).
            let listening = !readPaused && !applying && inbox.isEmpty
            if listening && now - lastRead > engine.timeout {
                timedOut("peer silent for \(engine.timeout.nanoseconds / 1_000_000) ms", context: context)
            } else if (now - lastWrite).nanoseconds >= engine.timeout.nanoseconds / 3 {
                _ = send(.ping, context: context)
            }
            if unreported != (0, 0) { status { _ in } }
        default:
            break  // the handshake deadline has its own timer
        }
    }

    private func timedOut(_ what: String, context: ChannelHandlerContext) {
        if case .awaitingAuth = phase {
            // An inbound connection that never proved a key: refused like any stranger.
            engine.strangersRefused.add(1, ordering: .relaxed)
        } else {
            status { $0.errors += 1; $0.lastError = "timed out: \(what)" }
        }
        engine.logger.info("Sync connection timed out", metadata: ["db": "\(dbName ?? "-")", "peer": "\(peer)"])
        phase = .closed
        context.close(promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var bytes = unwrapInboundIn(data)
        lastRead = .now()
        pending.writeBuffer(&bytes)
        do {
            try drain(context: context)
        } catch let reason as SyncRejection {
            fail(reason, context: context)
        } catch {
            fail(.malformed, context: context)
        }
        if pending.readableBytes == 0 {
            pending.clear()
        } else if pending.readerIndex > 1 << 20 {
            pending.discardReadBytes()
        }
    }

    /// Decodes and handles every complete frame read so far.
    ///
    /// Handshake frames must have exactly their message's length; after the handshake a frame's length is sealed and
    /// opened before the receiver waits for its body, so damage anywhere in the stream is refused as soon as it arrives.
    private func drain(context: ChannelHandlerContext) throws {
        while true {
            switch phase {
            case .closed:
                return
            case .established:
                guard var c = cipher else { return }
                if bodyLength == nil {
                    guard pending.readableBytes >= SessionCipher.headerSize,
                        let header = pending.readBytes(length: SessionCipher.headerSize)
                    else { return }
                    bodyLength = try c.openLength(header[...])
                }
                guard let length = bodyLength, pending.readableBytes >= length,
                    let body = pending.readBytes(length: length)
                else { return }
                bodyLength = nil
                unreported.received += SessionCipher.headerSize + length
                let plain = try c.open(body[...])
                cipher = c
                try handle(try PeerMessage(decoding: plain), context: context)
            case .awaitingHello(var client):
                guard let body = try handshakeFrame(size: Handshake.helloSize) else { return }
                let auth = try client.respond(to: body)
                phase = .awaitingReply(client)
                write(frame(auth), context: context)
            case .awaitingAuth(let server):
                let next: [UInt8]?
                do { next = try handshakeFrame(size: Handshake.authSize) } catch {
                    refuseStranger(context: context)
                    return
                }
                guard let body = next else { return }
                let spaces = engine.servedSpaces()
                guard let (space, reply, session) = try? server.accept(body, spaces: spaces.map(\.key)),
                    let served = spaces.first(where: { $0.key.id == space.id })?.db
                else {
                    refuseStranger(context: context)
                    return
                }
                db = served
                key = space
                cipher = session
                write(frame(reply), context: context)
                establish(context: context)
            case .awaitingReply(let client):
                guard let body = try handshakeFrame(size: Handshake.replySize) else { return }
                cipher = try client.finish(body)
                establish(context: context)
            }
        }
    }

    /// The next handshake message if it has fully arrived; a frame of any other length is refused at once.
    private func handshakeFrame(size: Int) throws(SyncRejection) -> [UInt8]? {
        guard let length = pending.getInteger(at: pending.readerIndex, as: UInt32.self) else { return nil }
        guard Int(length) == size else { throw .badFrame }
        guard pending.readableBytes >= 4 + size else { return nil }
        pending.moveReaderIndex(forwardBy: 4)
        return pending.readBytes(length: size)
    }

    /// A stranger (or a peer of a paused database): close without a word.
    private func refuseStranger(context: ChannelHandlerContext) {
        engine.strangersRefused.add(1, ordering: .relaxed)
        phase = .closed
        context.close(promise: nil)
    }

    private func write(_ buffer: ByteBuffer, context: ChannelHandlerContext) {
        lastWrite = .now()
        context.writeAndFlush(wrapOutboundOut(buffer), promise: nil)
    }

    private func send(_ message: PeerMessage, context: ChannelHandlerContext) -> EventLoopFuture<Void> {
        // Entries are encoded on the I/O pool by `pump` and sent with `send(bytes:)`; control messages always encode.
        guard let bytes = try? message.encoded() else {
            return context.eventLoop.makeFailedFuture(SyncRejection.malformed)
        }
        return send(bytes: bytes, context: context)
    }

    /// Seals one encoded message into the next frame and writes it.
    private func send(bytes: [UInt8], context: ChannelHandlerContext) -> EventLoopFuture<Void> {
        guard var c = cipher else { return context.eventLoop.makeSucceededVoidFuture() }
        let sealed = c.seal(bytes)
        cipher = c
        lastWrite = .now()
        unreported.sent += sealed.count
        return context.writeAndFlush(wrapOutboundOut(ByteBuffer(bytes: sealed)))
    }

    /// Counts a rejection, tells the peer why, and closes; batches received after the refused one are dropped.
    private func fail(_ reason: SyncRejection, context: ChannelHandlerContext) {
        inbox = []
        inboxBytes = 0
        if let dbName {
            engine.status.reject(db: dbName, peer: peer, direction: direction, reason)
        } else {
            engine.strangersRefused.add(1, ordering: .relaxed)
        }
        engine.logger.warning(
            "Sync rejected", metadata: ["db": "\(dbName ?? "-")", "peer": "\(peer)", "reason": "\(reason.rawValue)"])
        if case .established = phase {
            _ = send(.error(reason.rawValue), context: context)
        }
        phase = .closed
        context.close(promise: nil)
    }

    private func establish(context: ChannelHandlerContext) {
        phase = .established
        handshakeDeadline?.cancel()
        if admitted != nil && handshaking {
            handshaking = false
            engine.gate.established()
        }
        onEstablished?()
        status { $0.connections += 1; $0.lastError = nil }
        guard let db else { return }
        // Wake the sender whenever a change commits (local writes and entries received from other peers alike).
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let wake = self.wake
        let loop = context.eventLoop
        while true {
            switch db.feed.attach(after: db.feed.lastSequence, { signal in
                switch signal {
                case .entries:
                    guard wake.set() else { return }
                    loop.execute {
                        let (session, context) = bound.value
                        session.wake.clear()
                        session.pump(context: context)
                    }
                case .ended:
                    loop.execute { bound.value.1.close(promise: nil) }
                }
            }) {
            case .attached(let token): feedToken = token
            case .behind: continue
            case .ended: context.close(promise: nil)
            }
            break
        }
        sendState(context: context)
    }

    private func sendState(context: ChannelHandlerContext) {
        guard let db, let key else { return }
        let identity = engine.identity
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        engine.pool.runIfActive(eventLoop: context.eventLoop) { () -> ([NodeID: UInt64], SignedHead?) in
            try db.sealLocal(key: key, identity: identity)
            return (try db.syncVector(), try db.latestHead(origin: db.node))
        }.whenComplete { result in
            let (session, context) = bound.value
            switch result {
            case .success(let (vector, head)): _ = session.send(.state(vector: vector, ownHead: head), context: context)
            case .failure(let error): session.broken(error, context: context)
            }
        }
    }

    /// A local failure (storage, shutdown): counted as an error, not as a rejection of the peer's data.
    private func broken(_ error: any Error, context: ChannelHandlerContext) {
        status { $0.errors += 1; $0.lastError = "\(error)" }
        phase = .closed
        context.close(promise: nil)
    }

    private func handle(_ message: PeerMessage, context: ChannelHandlerContext) throws {
        switch message {
        case .state(let vector, let ownHead):
            var known = peerVector ?? [:]
            for (o, s) in vector { known[o] = max(known[o] ?? 0, s) }
            peerVector = known
            status { $0.lastSyncMs = nowMs() }
            if let ownHead, let db, let key {
                let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
                engine.pool.runIfActive(eventLoop: context.eventLoop) { () throws -> SyncRejection? in
                    do {
                        try db.checkOwnHead(ownHead, key: key)
                        return nil
                    } catch SyncRejection.fork {
                        // The peer's own log forked: keep the evidence (which quarantines its origin) and go on
                        // syncing every other origin with it.
                        try db.recordFork(head: ownHead, seq: ownHead.seq, hash: ownHead.hash, key: key)
                        return .fork
                    } catch let reason as SyncRejection where reason == .rollback {
                        return reason
                    }
                }
                .whenComplete { result in
                    let (session, context) = bound.value
                    switch result {
                    case .success(nil):
                        break
                    case .success(let reason?):
                        // A fork is kept as evidence; a rollback means the peer lost entries it had published, and it
                        // gets them back from here like any missing entries. Both are counted and sync goes on.
                        session.status { $0.rejected[reason.rawValue, default: 0] += 1 }
                    case .failure(let reason as SyncRejection):
                        session.fail(reason, context: context)
                    case .failure(let error):
                        session.broken(error, context: context)
                    }
                }
            }
            pump(context: context)
        case .entries(let batch):
            guard let db, let key else { return }
            // Verification (signature, AEAD, decoding) needs no database: it starts at once and overlaps with
            // storing the batches before it, which happens strictly in order.
            let verified = engine.pool.runIfActive(eventLoop: context.eventLoop) { try db.verify(batch: batch, key: key) }
            inbox.append((batch, verified))
            inboxBytes += batch.byteCount
            if (inbox.count >= Self.maxInbox || inboxBytes >= Self.maxInboxBytes) && !readPaused {
                readPaused = true
                context.channel.setOption(ChannelOptions.autoRead, value: false).whenFailure { _ in }
            }
            applyNext(context: context)
        case .error(let reason):
            status { $0.lastError = "peer closed: \(reason)" }
            phase = .closed
            context.close(promise: nil)
        case .ping:
            break
        }
    }

    /// Notes that the peer holds `batch` (it sent it, or it was sent to it).
    private func peerHolds(_ batch: EntryBatch) {
        guard var v = peerVector else { return }
        v[batch.origin] = max(v[batch.origin] ?? 0, batch.head.seq)
        peerVector = v
    }

    /// Stores received batches one at a time, in arrival order, each once it has verified.
    private func applyNext(context: ChannelHandlerContext) {
        guard !applying, !inbox.isEmpty, let db, let key else { return }
        let (batch, verified) = inbox.removeFirst()
        inboxBytes -= batch.byteCount
        guard !refusedOrigins.contains(batch.origin) else {
            resumeReading(context: context)
            applyNext(context: context)
            return
        }
        applying = true
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let pool = engine.pool
        let loop = context.eventLoop
        verified.flatMap { v in pool.runIfActive(eventLoop: loop) { try db.store(v) } }
            .whenComplete { result in
                let (session, context) = bound.value
                session.applying = false
                switch result {
                case .success(let outcome):
                    session.peerHolds(batch)
                    session.status {
                        $0.receivedEntries += outcome.stored
                        $0.lastSyncMs = nowMs()
                    }
                    session.resumeReading(context: context)
                    session.applyNext(context: context)
                case .failure(let error as SyncRejection) where error.blamesOrigin:
                    session.refuse(batch, error, key: key, context: context)
                case .failure(let error as SyncRejection):
                    session.fail(error, context: context)
                case .failure(let error):
                    session.broken(error, context: context)
                }
            }
    }

    /// Turns reading back on once the backlog is below its limit.
    private func resumeReading(context: ChannelHandlerContext) {
        guard readPaused && inbox.count < Self.maxInbox && inboxBytes < Self.maxInboxBytes else { return }
        readPaused = false
        context.channel.setOption(ChannelOptions.autoRead, value: true).whenFailure { _ in }
    }

    /// Refuses a batch for what its origin signed: counts the reason, skips the origin for the rest of the session
    /// (a fork is also stored as evidence, which quarantines the origin for good), and goes on with other origins.
    private func refuse(_ batch: EntryBatch, _ reason: SyncRejection, key: SpaceKey, context: ChannelHandlerContext) {
        refusedOrigins.insert(batch.origin)
        status { $0.rejected[reason.rawValue, default: 0] += 1; $0.lastError = "rejected: \(reason.rawValue)" }
        engine.logger.warning(
            "Sync refused an origin's batch",
            metadata: ["db": "\(dbName ?? "-")", "peer": "\(peer)", "origin": "\(batch.origin)", "reason": "\(reason.rawValue)"])
        if reason == .fork, let db {
            _ = engine.pool.runIfActive(eventLoop: context.eventLoop) { try db.recordFork(batch: batch, key: key) }
        }
        resumeReading(context: context)
        applyNext(context: context)
    }

    /// Sends the peer what it lacks, one round of batches at a time; a round starts after the previous one is
    /// written, so the socket's buffer, not memory, holds what the peer has not read.
    func pump(context: ChannelHandlerContext) {
        guard case .established = phase, let peerVector, let db, let key else { return }
        if pumping {
            pumpAgain = true
            return
        }
        pumping = true
        pumpAgain = false
        let identity = engine.identity
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        // Reading, packing and encoding happen on the I/O pool; only sealing the frames (the cipher's counter) stays
        // on the event loop.
        engine.pool.runIfActive(eventLoop: context.eventLoop) {
            () -> (batches: [(batch: EntryBatch, message: [UInt8])], behind: Int, ahead: Int) in
            try db.sealLocal(key: key, identity: identity)
            let mine = try db.syncVector()
            var batches: [(batch: EntryBatch, message: [UInt8])] = []
            var bytes = 0
            var behind = 0
            // Counts saturate: a STATE may name many origins near the seq bound.
            for (origin, theirs) in peerVector where theirs > mine[origin] ?? 0 {
                behind = behind.saturatingAdd(theirs - (mine[origin] ?? 0))
            }
            var ahead = 0
            for (origin, seq) in mine.sorted(by: { $0.key < $1.key }) {
                var after = peerVector[origin] ?? 0
                guard seq > after else { continue }
                ahead = ahead.saturatingAdd(seq - after)
                while bytes < Self.roundBytes, let batch = try db.entryBatch(origin: origin, after: after, maxEntries: Self.batchEntries) {
                    let message = try PeerMessage.entries(batch).encoded()
                    // A span between two heads larger than a frame (signed before heads were cut by size) cannot
                    // travel; the receiver would refuse the frame and the link would only reconnect.
                    guard message.count <= SessionCipher.maxMessage else { break }
                    batches.append((batch, message))
                    bytes += message.count
                    after = batch.head.seq
                }
            }
            return (batches, behind, ahead)
        }.whenComplete { result in
            let (session, context) = bound.value
            switch result {
            case .success(let round):
                var last: EventLoopFuture<Void>?
                for (batch, message) in round.batches {
                    last = session.send(bytes: message, context: context)
                    session.peerHolds(batch)
                }
                let sent = round.batches.reduce(0) { $0 + $1.batch.entries.count }
                session.status {
                    $0.sentEntries += sent
                    $0.peerBehind = max(0, round.ahead - sent)
                    $0.selfBehind = round.behind
                    if sent > 0 { $0.lastSyncMs = nowMs() }
                }
                guard let last else {
                    session.pumping = false
                    if session.pumpAgain { session.pump(context: context) }
                    return
                }
                last.whenComplete { _ in
                    let (session, context) = bound.value
                    session.pumping = false
                    session.pump(context: context)
                }
            case .failure(let error):
                session.pumping = false
                session.broken(error, context: context)
            }
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        if let feedToken, let db { db.feed.detach(feedToken) }
        feedToken = nil
        timer?.cancel()
        timer = nil
        handshakeDeadline?.cancel()
        if let admitted {
            engine.gate.release(address: admitted, handshaking: handshaking)
            self.admitted = nil
        }
        if case .established = phase, pending.readableBytes > 0 {
            status { $0.errors += 1; $0.lastError = "connection lost mid-frame" }
        } else if unreported != (0, 0) {
            status { _ in }
        }
        phase = .closed
        if cipher != nil { status { $0.connections = max(0, $0.connections - 1) } }
        cipher = nil
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let reason = error as? SyncRejection {
            fail(reason, context: context)
        } else {
            status { $0.errors += 1; $0.lastError = "\(error)" }
            context.close(promise: nil)
        }
    }
}

/// A flag the feed listener sets without locks; true from `set()` means "first since the last clear".
final class WakeFlag: Sendable {
    private let flag = Atomic<Bool>(false)
    func set() -> Bool { !flag.exchange(true, ordering: .acquiringAndReleasing) }
    func clear() { flag.store(false, ordering: .releasing) }
}

extension Int {
    /// `self + n`, or `Int.max` when that does not fit.
    func saturatingAdd(_ n: UInt64) -> Int {
        guard n <= UInt64(Int.max) else { return .max }
        let (sum, overflow) = addingReportingOverflow(Int(n))
        return overflow ? .max : sum
    }
}
