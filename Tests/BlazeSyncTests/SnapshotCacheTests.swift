import BlazeCrypto
import Testing

@testable import BlazeSync

/// `SnapshotCache`: a database builds at most one snapshot a minute for the peers that ask.
@Suite struct SnapshotCacheTests {
    @Test func aSnapshotIsBuiltOnceAMinutePerDatabaseAndForgottenWhenCompacted() {
        let cache = SnapshotCache()
        let manifest = SnapshotManifest(
            space: SpaceKey.randomBytes(16), createdMs: 1, parts: 1, lastPart: SpaceKey.randomBytes(32), heads: [:],
            identity: DeviceIdentity())
        var builds = 0
        let start = ContinuousClock.now
        func ask(_ db: String, at offset: Duration) -> SnapshotCache.Built? {
            cache.snapshot(db: db, now: start + offset) {
                builds += 1
                return SnapshotCache.Built(manifest: manifest, messages: [[UInt8(builds)]], byteCount: 1, at: start + offset)
            }
        }
        #expect(ask("a", at: .zero)?.messages == [[1]])
        #expect(ask("a", at: .seconds(59))?.messages == [[1]], "reused within its minute")
        #expect(builds == 1)
        #expect(ask("b", at: .seconds(1))?.messages == [[2]], "another database builds its own")
        #expect(ask("a", at: .seconds(60))?.messages == [[3]], "built again once its minute is over")
        cache.forget(db: "a")
        #expect(ask("a", at: .seconds(61))?.messages == [[4]], "built again after a compaction")
        // A database that cannot seal one caches nothing: the next ask tries again.
        #expect(cache.snapshot(db: "c", now: start) { nil } == nil)
        #expect(ask("c", at: .seconds(1))?.messages == [[5]])
    }
}
