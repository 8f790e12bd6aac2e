import Foundation
import Synchronization

/// Copies of one value, each behind a lock of its own, each thread using the copy its identity hashes to: state that
/// every request reads takes no lock that the other event loops take too.
///
/// A lock shared by every event loop costs little while the loops are as many as the cores, but a loop that is
/// descheduled while holding it makes the others wait in the kernel (Swift's `Mutex` is a priority-inheriting futex
/// on Linux): with 8 loops on 2 cores, one shared cache lock took 46% of an indexed find's time.
final class Sharded<Value: Sendable>: Sendable {
    /// Copies per instance: more than the event loops of most machines, so two loops rarely share one.
    static var count: Int { 16 }

    private let shards: [Shard]

    /// Makes every copy with `initial`.
    init(_ initial: @autoclosure () -> Value) {
        shards = (0..<Self.count).map { _ in Shard(initial()) }
    }

    /// Runs `body` on the calling thread's copy, holding its lock.
    func withLocal<R: Sendable>(_ body: (inout Value) throws -> R) rethrows -> R {
        try shards[threadShard(Self.count)].value.withLock { try body(&$0) }
    }

    /// Runs `body` on every copy in turn, holding each one's lock while it runs.
    func withEach(_ body: (inout Value) -> Void) {
        for shard in shards { shard.value.withLock { body(&$0) } }
    }

    /// One copy behind its lock.
    private final class Shard: Sendable {
        let value: Mutex<Value>
        /// Keeps the next copy's lock off this one's cache line.
        private let padding: (Int, Int, Int, Int, Int, Int, Int, Int) = (0, 0, 0, 0, 0, 0, 0, 0)

        init(_ value: Value) { self.value = Mutex(value) }
    }
}

/// Which of `count` shards the calling thread uses: a hash of its identity, so two threads rarely pick the same one.
func threadShard(_ count: Int) -> Int {
    let id = UInt64(UInt(bitPattern: Int(pthread_self())))
    return Int((id &* 0x9E37_79B9_7F4A_7C15) >> 58) % count
}
