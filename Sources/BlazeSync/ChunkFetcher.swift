import BlazeProtocol
import BlazeStore
import BlazeWire
import NIOCore
import Synchronization

/// Fetches the blob chunks a database lacks from the sync sessions serving it (ARCHITECTURE.md, "Blobs").
///
/// A session attaches as a **source** for its database once established. Callers ask for chunks they found missing
/// (`fetch`); each chunk wanted is asked of one source at a time, the least busy one that has not failed it, with at
/// most `maxInFlightPerSource` chunks outstanding per source, so a blob comes from several peers at once and a source
/// moves at most that many chunks' memory. A source that says it lacks a chunk, sends a bad one or closes is not asked
/// for that chunk again; the chunk goes to the next source. One that does not answer within `askTimeout` loses the
/// chunk to another source too, but its slot stays taken until it answers (its late answer is still taken), so a slow
/// peer is never asked for more than it can serve. A chunk every attached source lacks fails its callers
/// (`blob_unavailable`); while no source is attached (a link reconnecting) chunks wait, up to their caller's deadline
/// (`blob_fetch_timeout`). Chunks arrive one by one and are stored as they come, so a fetch cut off by a disconnect or
/// a restart asks only for what is still missing.
final class ChunkFetcher: Sendable {
    /// Chunks outstanding per source (a chunk is at most 4 MiB).
    static let maxInFlightPerSource = 4
    /// Chunks one caller may wait for at once (callers fetch large blobs in windows of this many).
    static let maxPerFetch = 256
    /// How long a source has to answer for a chunk before it is asked of another.
    let askTimeout: TimeAmount
    private let group: any EventLoopGroup
    private let state = Mutex(State())

    private struct Key: Hashable {
        let db: String
        let id: ChunkID
    }

    private struct Want {
        /// The source it is asked of now, and which asking this is (a late timer of an earlier one does nothing).
        var asked: (source: Int, round: Int)?
        /// Sources that lacked it, failed it or timed out.
        var tried: Set<Int> = []
        /// The callers waiting for it.
        var callers: Set<Int> = []
        /// Whether a caller waits while no source is attached (else it fails at once).
        var waitsForSource = false
    }

    private struct Source {
        let db: String
        let ask: @Sendable ([ChunkID]) -> Void
        /// Chunks asked of it and not answered (including those given to another source after a timeout).
        var inFlight: Set<ChunkID> = []
        /// Chunks of it being opened and stored now: a second copy of one is not taken.
        var receiving: Set<ChunkID> = []
    }

    private struct Caller {
        let db: String
        var left: Set<ChunkID>
        let done: @Sendable (Result<Void, StoreError>) -> Void
        var timeout: Scheduled<Void>?
    }

    private struct State {
        var wants: [Key: Want] = [:]
        /// Wants not asked of any source, oldest first.
        var unassigned: [Key] = []
        var sources: [Int: Source] = [:]
        var callers: [Int: Caller] = [:]
        var next = 1
        var round = 0
    }

    /// Work to do once the lock is released: asks to send, callers to complete, timers to start.
    private struct Effects {
        var asks: [(ask: @Sendable ([ChunkID]) -> Void, ids: [ChunkID])] = []
        var done: [(@Sendable (Result<Void, StoreError>) -> Void, Result<Void, StoreError>)] = []
        var timers: [(key: Key, source: Int, round: Int)] = []
    }

    /// A fetcher timing sources out after `askTimeout`, its timers on `group`.
    init(group: any EventLoopGroup, askTimeout: TimeAmount) {
        self.group = group
        self.askTimeout = askTimeout
    }

    /// Attaches a source for database `db`: `ask` sends it a `CHUNK_WANT` (from any thread). Returns its token.
    func attach(db: String, ask: @escaping @Sendable ([ChunkID]) -> Void) -> Int {
        var effects = Effects()
        let token = state.withLock { s in
            let token = s.next
            s.next += 1
            s.sources[token] = Source(db: db, ask: ask)
            schedule(&s, &effects)
            return token
        }
        run(effects)
        return token
    }

    /// Detaches source `token` (its session ended): what it was asked goes to other sources.
    func detach(_ token: Int) {
        var effects = Effects()
        state.withLock { s in
            guard let source = s.sources.removeValue(forKey: token) else { return }
            for id in source.inFlight { release(Key(db: source.db, id: id), from: token, &s) }
            schedule(&s, &effects)
        }
        run(effects)
    }

    /// Takes source `token`'s answer for chunk `id` for opening and storing: true once per asking (a copy sent again
    /// while the first is being stored, or a chunk never asked of it, is not taken).
    func accept(_ token: Int, _ id: ChunkID) -> Bool {
        state.withLock { s in
            guard var source = s.sources[token], source.inFlight.contains(id), !source.receiving.contains(id) else { return false }
            source.receiving.insert(id)
            s.sources[token] = source
            return true
        }
    }

    /// Whether source `token` was asked for chunk `id` and has not answered it.
    func expects(_ token: Int, _ id: ChunkID) -> Bool {
        state.withLock { $0.sources[token]?.inFlight.contains(id) ?? false }
    }

    /// Fetches `ids` (chunks of database `db` the caller found missing); `done` runs once every one is stored, when
    /// one cannot be had, or after `timeout`, on any thread. With `waitForSource` a chunk waits while no source is
    /// attached (a link reconnecting); without, it fails at once. Returns a token for `cancel`.
    @discardableResult
    func fetch(
        db: String, ids: [ChunkID], timeout: TimeAmount, waitForSource: Bool,
        done: @escaping @Sendable (Result<Void, StoreError>) -> Void
    ) -> Int {
        var effects = Effects()
        let loop = group.next()
        let token: Int = state.withLock { s in
            let token = s.next
            s.next += 1
            guard !ids.isEmpty else {
                effects.done.append((done, .success(())))
                return token
            }
            guard ids.count <= Self.maxPerFetch else {
                effects.done.append((done, .failure(StoreError(
                    .internalFailure, kind: "internal", "a fetch of \(ids.count) chunks: callers fetch at most \(Self.maxPerFetch) at once"))))
                return token
            }
            s.callers[token] = Caller(db: db, left: Set(ids), done: done)
            for id in Set(ids) {
                let key = Key(db: db, id: id)
                if s.wants[key] == nil {
                    s.wants[key] = Want()
                    s.unassigned.append(key)
                }
                s.wants[key]!.callers.insert(token)
                if waitForSource { s.wants[key]!.waitsForSource = true }
            }
            schedule(&s, &effects)
            return token
        }
        run(effects)
        let scheduled = loop.scheduleTask(in: timeout) { [self] in
            expire(token, seconds: timeout.nanoseconds / 1_000_000_000)
        }
        state.withLock { s in
            if s.callers[token] != nil { s.callers[token]!.timeout = scheduled } else { scheduled.cancel() }
        }
        return token
    }

    /// Caller `token` no longer waits: its wants no other caller shares are dropped (those asked already still arrive
    /// and are stored).
    func cancel(_ token: Int) {
        state.withLock { s in
            guard let caller = s.callers.removeValue(forKey: token) else { return }
            caller.timeout?.cancel()
            forget(caller: token, ids: caller.left, db: caller.db, &s)
        }
    }

    /// Chunk `id` of database `db` arrived from source `token` and is stored (its callers complete even when the
    /// source left meanwhile).
    func arrived(_ token: Int, db: String, _ id: ChunkID) {
        var effects = Effects()
        state.withLock { s in
            s.sources[token]?.inFlight.remove(id)
            s.sources[token]?.receiving.remove(id)
            let key = Key(db: db, id: id)
            if let want = s.wants.removeValue(forKey: key) {
                s.unassigned.removeAll { $0 == key }
                for c in want.callers {
                    guard var caller = s.callers[c] else { continue }
                    caller.left.remove(id)
                    if caller.left.isEmpty {
                        caller.timeout?.cancel()
                        s.callers[c] = nil
                        effects.done.append((caller.done, .success(())))
                    } else {
                        s.callers[c] = caller
                    }
                }
            }
            schedule(&s, &effects)
        }
        run(effects)
    }

    /// Source `token` does not hold `ids`, or failed them (a bad chunk, no key for its epoch): each goes to another
    /// source.
    func lacks(_ token: Int, _ ids: [ChunkID]) {
        var effects = Effects()
        state.withLock { s in
            guard let db = s.sources[token]?.db else { return }
            for id in ids where s.sources[token]!.inFlight.contains(id) {
                s.sources[token]!.inFlight.remove(id)
                s.sources[token]!.receiving.remove(id)
                release(Key(db: db, id: id), from: token, &s)
            }
            schedule(&s, &effects)
        }
        run(effects)
    }

    /// Storing chunk `id` of database `db` failed here (a full disk): its callers fail with `error`.
    func failed(db: String, _ id: ChunkID, source token: Int, error: StoreError) {
        var effects = Effects()
        state.withLock { s in
            s.sources[token]?.inFlight.remove(id)
            s.sources[token]?.receiving.remove(id)
            fail(Key(db: db, id: id), error, &s, &effects)
            schedule(&s, &effects)
        }
        run(effects)
    }

    /// Fails every caller with `error` and forgets every want (the engine is shutting down).
    func endAll(_ error: StoreError) {
        let ended: [Caller] = state.withLock { s in
            defer {
                s.callers = [:]
                s.wants = [:]
                s.unassigned = []
            }
            return Array(s.callers.values)
        }
        for caller in ended {
            caller.timeout?.cancel()
            caller.done(.failure(error))
        }
    }

    /// How many of `ids` (chunks of database `db`) are wanted and not yet stored.
    func wanted(db: String, among ids: [ChunkID]) -> Int {
        state.withLock { s in ids.reduce(0) { $0 + (s.wants[Key(db: db, id: $1)] == nil ? 0 : 1) } }
    }

    /// How many chunks are wanted and not yet stored (all databases).
    var wanted: Int { state.withLock { $0.wants.count } }

    // MARK: Under the lock

    /// Puts a want asked of `source` back to be asked of another (nothing when it is asked of another already).
    private func release(_ key: Key, from source: Int, _ s: inout State) {
        guard var want = s.wants[key] else { return }
        guard want.asked?.source == source else {
            want.tried.insert(source)
            s.wants[key] = want
            return
        }
        guard !want.callers.isEmpty else {
            s.wants[key] = nil  // nobody waits for it any more
            return
        }
        want.asked = nil
        want.tried.insert(source)
        s.wants[key] = want
        s.unassigned.append(key)
    }

    /// Asks sources for unassigned wants, as their room allows; fails wants every attached source of their database
    /// lacks.
    private func schedule(_ s: inout State, _ effects: inout Effects) {
        guard !s.unassigned.isEmpty else { return }
        var asks: [Int: [ChunkID]] = [:]
        var waiting: [Key] = []
        for key in s.unassigned {
            guard var want = s.wants[key], want.asked == nil else { continue }
            let candidates = s.sources.filter {
                $0.value.db == key.db && !want.tried.contains($0.key) && !$0.value.inFlight.contains(key.id)
            }
            if candidates.isEmpty {
                if want.waitsForSource && !s.sources.contains(where: { $0.value.db == key.db }) {
                    waiting.append(key)  // no source now: a link may reconnect before the caller's deadline
                } else {
                    fail(key, StoreError(
                        .notFound, kind: "blob_unavailable",
                        "no connected device of database \(key.db) holds chunk \(key.id) (each lacked it, sent a bad copy or did not answer in time)"),
                        &s, &effects)
                }
                continue
            }
            guard let (token, _) = candidates.filter({ $0.value.inFlight.count < Self.maxInFlightPerSource })
                .min(by: { $0.value.inFlight.count < $1.value.inFlight.count })
            else {
                waiting.append(key)
                continue
            }
            s.round += 1
            want.asked = (token, s.round)
            s.wants[key] = want
            s.sources[token]!.inFlight.insert(key.id)
            asks[token, default: []].append(key.id)
            effects.timers.append((key, token, s.round))
        }
        s.unassigned = waiting
        for (token, ids) in asks {
            guard let ask = s.sources[token]?.ask else { continue }
            effects.asks.append((ask, ids))
        }
    }

    /// Fails every caller of `key` with `error` and drops the want.
    private func fail(_ key: Key, _ error: StoreError, _ s: inout State, _ effects: inout Effects) {
        guard let want = s.wants.removeValue(forKey: key) else { return }
        s.unassigned.removeAll { $0 == key }
        for c in want.callers {
            guard let caller = s.callers.removeValue(forKey: c) else { continue }
            caller.timeout?.cancel()
            forget(caller: c, ids: caller.left.subtracting([key.id]), db: caller.db, &s)
            effects.done.append((caller.done, .failure(error)))
        }
    }

    /// Removes caller `token` from the wants of `ids`; a want left with no caller and not asked of a source goes.
    private func forget(caller token: Int, ids: Set<ChunkID>, db: String, _ s: inout State) {
        for id in ids {
            let key = Key(db: db, id: id)
            guard var want = s.wants[key] else { continue }
            want.callers.remove(token)
            if want.callers.isEmpty && want.asked == nil {
                s.wants[key] = nil
            } else {
                s.wants[key] = want
            }
        }
        s.unassigned.removeAll { s.wants[$0] == nil }
    }

    // MARK: Outside the lock

    private func run(_ effects: Effects) {
        for (ask, ids) in effects.asks {
            for start in stride(from: 0, to: ids.count, by: PeerMessage.maxChunkWants) {
                ask(Array(ids[start..<min(ids.count, start + PeerMessage.maxChunkWants)]))
            }
        }
        for (done, result) in effects.done { done(result) }
        for timer in effects.timers {
            let (key, source, round) = timer
            group.next().scheduleTask(in: askTimeout) { [self] in
                timedOut(key, source: source, round: round)
            }
        }
    }

    /// Source `source` did not answer for `key` in time: it goes to another source.
    private func timedOut(_ key: Key, source: Int, round: Int) {
        var effects = Effects()
        state.withLock { s in
            guard let want = s.wants[key], let asked = want.asked, asked.source == source, asked.round == round else { return }
            // The source keeps the chunk in flight (it owes an answer, which is still taken when it comes), so it is
            // not asked for more meanwhile; the chunk goes to another source.
            release(key, from: source, &s)
            schedule(&s, &effects)
        }
        run(effects)
    }

    /// Caller `token`'s deadline passed.
    private func expire(_ token: Int, seconds: Int64) {
        let done: (@Sendable (Result<Void, StoreError>) -> Void)? = state.withLock { s in
            guard let caller = s.callers.removeValue(forKey: token) else { return nil }
            forget(caller: token, ids: caller.left, db: caller.db, &s)
            return caller.done
        }
        done?(.failure(StoreError(
            .unavailable, kind: "blob_fetch_timeout",
            "the blob's chunks did not arrive within \(seconds) s: no connected device sent them (is a peer holding them online?)")))
    }
}
