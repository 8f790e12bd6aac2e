import Foundation
import Synchronization
import Testing

@testable import BlazeStore

@Suite struct ShardedState {
    /// Every thread reads a copy that `withEach` set, and updates through `withLocal` are kept and never lost.
    @Test func copiesAreSetTogetherAndUpdatedPerThread() {
        let sharded = Sharded<Int>(0)
        sharded.withEach { $0 = 5 }
        let seen = Mutex<[Int]>([])
        DispatchQueue.concurrentPerform(iterations: 64) { _ in
            let mine = sharded.withLocal { $0 }
            seen.withLock { $0.append(mine) }
        }
        #expect(seen.withLock { $0 } == [Int](repeating: 5, count: 64))

        DispatchQueue.concurrentPerform(iterations: 64) { _ in
            for _ in 0..<1000 { sharded.withLocal { $0 += 1 } }
        }
        var total = 0
        sharded.withEach { total += $0 - 5 }
        #expect(total == 64 * 1000)
    }

    /// A thread always lands on the same shard, within range.
    @Test func aThreadKeepsItsShard() {
        for count in [1, 6, 16] {
            let first = threadShard(count)
            #expect((0..<count).contains(first))
            #expect((0..<100).allSatisfy { _ in threadShard(count) == first })
        }
    }
}
