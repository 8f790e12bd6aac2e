import BlazeProtocol
import BlazeStore
import BlazeWire
import NIOCore
import Synchronization

/// Fetches the blob chunks a database lacks from the sources serving it (ARCHITECTURE.md, "Blobs"; SYNC.md §12).
///
/// Sources are a database's sessions with member devices (peers) and its folder links. Callers ask for chunks they
/// found missing (`fetch`), at most `maxPerFetch` at once; each chunk wanted is asked of one source at a time, the
/// least busy one that has not lacked it, with at most `maxInFlightPerSource` chunks outstanding per source, so a blob
/// comes from several sources at once and a source moves at most that many chunks' memory.
///
/// - A source that says it lacks a chunk, sends a bad one or closes is not asked for that chunk again; the chunk goes
///   to the next source. A chunk that no attached source can still give fails its callers (`blob_unavailable`).
/// - A source that does not answer within `askTimeout` is asked for nothing more meanwhile: the chunk stays owed by it
///   (its late answer is still taken, and a new caller of the chunk waits for it) and is asked of another source too
///   while a caller waits for it.
/// - While no peer is attached (a link reconnecting), callers that wait for a source wait, up to their deadline
///   (`blob_fetch_timeout`).
///
/// Chunks arrive one by one and are stored as they come, so a fetch cut off by a disconnect or a restart asks only for
/// what is still missing.
final class ChunkFetcher: Sendable {
    /// Chunks outstanding per source (a chunk is at most 4 MiB).
    static let maxInFlightPerSource = 4
    /// Chunks one caller may wait for at once (callers fetch large blobs in windows).
    static let maxPerFetch = 256
    /// How long a source has to answer for a chunk before it is asked of another as well.
    let askTimeout: TimeAmount
    private let group: any EventLoopGroup
    private let state = Mutex(State())

    /// A chunk of a database.
    private struct Key: Hashable { let db: String, id: ChunkID }

    private struct Want {
        /// The source it is asked of now, and which asking this is (a late timer of an earlier one does nothing).
        var asked: (source: Int, round: Int)?
        /// Sources that lacked it or failed it: never asked for it again.
        var tried: Set<Int> = []
        /// The callers waiting for it.
        var callers: Set<Int> = []
        /// Whether a caller waits while no peer is attached (else it fails at once).
        var waitsForSource = false
    }

    private struct Source {
        let db: String
        /// A folder link: it does not count as a peer a reconnecting link would bring back.
        let folder: Bool
        let ask: @Sendable ([ChunkID]) -> Void
        /// Chunks asked of it and not answered (those it timed out on included: it still owes them).
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
        /// Wants not asked of any source now, oldest first.
        var unassigned: [Key] = []
        var sources: [Int: Source] = [:]
        var callers: [Int: Caller] = [:]
        var next = 1, round = 0
        /// Asks that sources did not answer in time, since start.
        var timeouts = 0
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

    /// Attaches a source for database `db` (`folder` for a folder link): `ask` asks it for chunks (from any thread).
    /// Returns its token.
    func attach(db: String, folder: Bool = false, ask: @escaping @Sendable ([ChunkID]) -> Void) -> Int {
        var effects = Effects()
        let token = state.withLock { s in
            let token = s.next
            s.next += 1
            s.sources[token] = Source(db: db, folder: folder, ask: ask)
            schedule(&s, &effects)
            return token
        }
        run(effects)
        return token
    }

    /// Detaches source `token` (its session ended): what it owes goes to other sources, except chunks being stored
    /// now (their outcome still comes, by `arrived`, `lacks` or `failed`).
    func detach(_ token: Int) {
        var effects = Effects()
        state.withLock { s in
            guard let source = s.sources.removeValue(forKey: token) else { return }
            for id in source.inFlight.subtracting(source.receiving) { release(Key(db: source.db, id: id), from: token, &s) }
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

    /// Fetches `ids` (at most `maxPerFetch` chunks of database `db` the caller found missing); `done` runs once every
    /// one is stored, when one cannot be had, or after `timeout`, on any thread. With `waitForSource` a chunk waits
    /// while no peer is attached (a link reconnecting); without, it fails at once. Returns a token for `cancel`.
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

    /// Caller `token` no longer waits: its wants no other caller shares and no source owes are dropped.
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

    /// Source `token` does not hold `ids` of database `db`, or failed them (a bad chunk, no key for its epoch): each
    /// goes to another source.
    func lacks(_ token: Int, db: String, _ ids: [ChunkID]) {
        var effects = Effects()
        state.withLock { s in
            for id in ids {
                if var source = s.sources[token] {
                    guard source.inFlight.contains(id) else { continue }
                    source.inFlight.remove(id)
                    source.receiving.remove(id)
                    s.sources[token] = source
                }
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
            defer { (s.callers, s.wants, s.unassigned) = ([:], [:], []) }
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

    /// Asks that sources did not answer within `askTimeout`, since start.
    var asksTimedOut: Int { state.withLock { $0.timeouts } }

    /// How many chunks are wanted and not yet stored (all databases).
    var wanted: Int { state.withLock { $0.wants.count } }
    /// Whether source `token` was asked for chunk `id` and has not answered it (it owes it).
    func expects(_ token: Int, _ id: ChunkID) -> Bool {
        state.withLock { $0.sources[token]?.inFlight.contains(id) ?? false }
    }

    // MARK: Under the lock

    /// Puts a want back to be asked of another source than `source`, which lacked it or left (nothing changes when
    /// it is asked of another already but `source`).
    private func release(_ key: Key, from source: Int, _ s: inout State) {
        guard var want = s.wants[key] else { return }
        want.tried.insert(source)
        if want.asked?.source == source {
            want.asked = nil
            if want.callers.isEmpty {
                s.wants[key] = nil  // nobody waits for it any more
                return
            }
            s.unassigned.append(key)
        }
        s.wants[key] = want
    }

    /// Asks sources for unassigned wants, as their room allows; fails wants no attached source can still give.
    private func schedule(_ s: inout State, _ effects: inout Effects) {
        guard !s.unassigned.isEmpty else { return }
        var byDB: [String: [Int]] = [:]
        for (token, source) in s.sources { byDB[source.db, default: []].append(token) }
        var asks: [Int: [ChunkID]] = [:]
        var waiting: [Key] = []
        for key in s.unassigned {
            guard var want = s.wants[key], want.asked == nil else { continue }
            let sources = byDB[key.db] ?? []
            // Sources that may still give it: not lacking it. One that owes it already is waited for, not asked again.
            let open = sources.filter { !want.tried.contains($0) }
            let owing = open.contains { s.sources[$0]!.inFlight.contains(key.id) }
            let free = open.filter { s.sources[$0]!.inFlight.count < Self.maxInFlightPerSource && !s.sources[$0]!.inFlight.contains(key.id) }
            if let token = free.min(by: { s.sources[$0]!.inFlight.count < s.sources[$1]!.inFlight.count }) {
                s.round += 1
                want.asked = (token, s.round)
                s.wants[key] = want
                s.sources[token]!.inFlight.insert(key.id)
                asks[token, default: []].append(key.id)
                effects.timers.append((key, token, s.round))
                continue
            }
            let peers = sources.contains { !s.sources[$0]!.folder }
            if owing || !open.isEmpty || (want.waitsForSource && !peers) {
                // A source owes it, every source that may give it is busy, or no peer is attached (a link may come
                // back before the caller's deadline).
                waiting.append(key)
            } else {
                fail(key, StoreError(
                    .notFound, kind: "blob_unavailable",
                    "no connected device of database \(key.db) holds chunk \(key.id) (each lacked it or sent a bad copy)"),
                    &s, &effects)
            }
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

    /// Source `source` did not answer for `key` in time: it still owes the chunk, which is asked of another source
    /// unless nobody waits for it any more (its get was cancelled or ran out of time).
    private func timedOut(_ key: Key, source: Int, round: Int) {
        var effects = Effects()
        state.withLock { s in
            guard var want = s.wants[key], let asked = want.asked, asked.source == source, asked.round == round else { return }
            s.timeouts += 1
            want.asked = nil
            s.wants[key] = want.callers.isEmpty ? nil : want
            guard !want.callers.isEmpty else { return }
            s.unassigned.append(key)
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
            "the blob's chunks did not arrive within \(seconds) s from the devices connected now (is a peer holding them online?)")))
    }
}
