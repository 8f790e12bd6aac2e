import BlazeCrypto
import NIOCore
import NIOPosix
import Synchronization

/// Snapshots a member built for peers that lack entries compacted away (SYNC.md §11), kept for `lifetime` per
/// database: however many sessions ask meanwhile — a capability holder presenting an empty `STATE` on connection
/// after connection — a database builds at most one snapshot per `lifetime`, and sessions asking while it is being
/// built wait for that build without holding a thread. A compaction, an installed snapshot or a drop of the database
/// forgets its snapshot (the entries after it may be gone).
final class SnapshotCache: Sendable {
    /// A snapshot as sessions send it: its manifest, its pieces' encoded messages and their bytes.
    struct Built: Sendable {
        let manifest: SnapshotManifest
        let messages: [[UInt8]]
        let byteCount: Int
        let at: ContinuousClock.Instant
    }

    /// How long a built snapshot is reused.
    static let lifetime: Duration = .seconds(60)

    private struct State {
        var held: [String: Built] = [:]
        /// Builds under way, by database, with the generation of the database's cache they started in.
        var building: [String: (promise: EventLoopPromise<Built?>, generation: Int)] = [:]
        /// Bumped by `forget`: a build that started before does not store what it made.
        var generation: [String: Int] = [:]
    }
    private let state = Mutex(State())

    /// The snapshot of `db` built less than `lifetime` ago, the build under way, or a new build by `build` on `pool`
    /// (nil: none can be made); snapshots past their lifetime are dropped on the way.
    func snapshot(
        db: String, pool: NIOThreadPool, on loop: any EventLoop, now: ContinuousClock.Instant = .now,
        build: @escaping @Sendable () throws -> Built?
    ) -> EventLoopFuture<Built?> {
        let (existing, started): (EventLoopFuture<Built?>?, (EventLoopPromise<Built?>, Int)?) = state.withLock { s in
            s.held = s.held.filter { now - $0.value.at < Self.lifetime }
            if let fresh = s.held[db] { return (loop.makeSucceededFuture(fresh), nil) }
            if let running = s.building[db] { return (running.promise.futureResult, nil) }
            let promise = loop.makePromise(of: Built?.self)
            let generation = s.generation[db, default: 0]
            s.building[db] = (promise, generation)
            return (nil, (promise, generation))
        }
        if let existing { return existing.hop(to: loop) }
        let (promise, generation) = started!
        pool.runIfActive(eventLoop: loop, build).whenComplete { result in
            self.state.withLock { s in
                s.building[db] = nil
                if case .success(let built?) = result, s.generation[db, default: 0] == generation { s.held[db] = built }
            }
            promise.completeWith(result)
        }
        return promise.futureResult
    }

    /// Forgets the snapshot of `db`, and what a build under way makes of it.
    func forget(db: String) {
        state.withLock { s in
            s.held[db] = nil
            s.generation[db, default: 0] += 1
        }
    }

    /// Drops snapshots past their lifetime.
    func expire(now: ContinuousClock.Instant = .now) {
        state.withLock { s in s.held = s.held.filter { now - $0.value.at < Self.lifetime } }
    }
}
