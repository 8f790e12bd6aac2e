import BlazeCrypto
import Dispatch
import NIOCore
import NIOPosix
import Synchronization
import Testing

@testable import BlazeSync

/// `SnapshotCache`: a database builds at most one snapshot a minute for the peers that ask, and peers asking during a
/// build wait for that one.
@Suite struct SnapshotCacheTests {
    let manifest = SnapshotManifest(
        space: SpaceKey.generate().id, createdMs: 1, parts: 1, size: 1000, lastPart: SpaceKey.randomBytes(32), heads: [:],
        identity: DeviceIdentity())

    @Test func aSnapshotIsBuiltOnceAMinutePerDatabaseAndForgottenWhenCompacted() async throws {
        let pool = NIOThreadPool(numberOfThreads: 2)
        pool.start()
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let cache = SnapshotCache()
        let builds = Atomic(0)
        let start = ContinuousClock.now
        let manifest = self.manifest
        func ask(_ db: String, at offset: Duration) async throws -> [[UInt8]]? {
            try await cache.snapshot(db: db, pool: pool, on: loop, now: start + offset) {
                let n = builds.add(1, ordering: .relaxed).newValue
                return SnapshotCache.Built(manifest: manifest, messages: [[UInt8(n)]], byteCount: 1, at: start + offset)
            }.get()?.messages
        }
        #expect(try await ask("a", at: .zero) == [[1]])
        #expect(try await ask("a", at: .seconds(59)) == [[1]], "reused within its minute")
        #expect(try await ask("b", at: .seconds(1)) == [[2]], "another database builds its own")
        #expect(try await ask("a", at: .seconds(60)) == [[3]], "built again once its minute is over")
        cache.forget(db: "a")
        #expect(try await ask("a", at: .seconds(61)) == [[4]], "built again after a compaction")
        // A database that cannot seal one caches nothing: the next ask tries again.
        #expect(try await cache.snapshot(db: "c", pool: pool, on: loop, now: start) { nil }.get() == nil)
        #expect(try await ask("c", at: .seconds(1)) == [[5]])
        try await pool.shutdownGracefully()
    }

    @Test func sessionsAskingDuringABuildShareItAndAForgetMeanwhileKeepsItFromTheCache() async throws {
        let pool = NIOThreadPool(numberOfThreads: 2)
        pool.start()
        let loop = MultiThreadedEventLoopGroup.singleton.next()
        let cache = SnapshotCache()
        let builds = Atomic(0)
        let release = DispatchSemaphore(value: 0)
        let manifest = self.manifest
        let build: @Sendable () throws -> SnapshotCache.Built? = {
            builds.add(1, ordering: .relaxed)
            _ = release.wait(timeout: .now() + 30)
            return SnapshotCache.Built(manifest: manifest, messages: [[7]], byteCount: 1, at: .now)
        }
        let asks = (0..<10).map { _ in cache.snapshot(db: "a", pool: pool, on: loop, build: build) }
        // Compacted while it is built: what it makes is sent to those who asked, not kept for later ones.
        cache.forget(db: "a")
        release.signal()
        for ask in asks { #expect(try await ask.get()?.messages == [[7]]) }
        #expect(builds.load(ordering: .relaxed) == 1, "one build for ten sessions")
        let later = cache.snapshot(db: "a", pool: pool, on: loop, build: build)
        release.signal()
        _ = try await later.get()
        #expect(builds.load(ordering: .relaxed) == 2, "built again: the one made across the compaction was not kept")
        try await pool.shutdownGracefully()
    }
}
