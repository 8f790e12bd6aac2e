import BlazeProtocol
import Foundation

/// Names and stores a writer's chunks on threads of their own while the writer reads and cuts what follows, so the
/// disk's work (each chunk's synced file) overlaps the CPU's (cutting and naming) instead of following it.
///
/// Bounded: `submit` waits while the chunks handed over and not yet stored hold `limit` bytes or more. A thread starts
/// when a chunk waits and fewer than `threads` run, and ends when no chunk has come for `Shared.idle`, so a writer
/// that is not being fed (an upload its client left open) soon holds no thread and no chunk. Used by one writer, from one thread at a time.
final class ChunkLanes: Sendable {
    /// The state the lanes' threads share with the writer.
    private let shared: Shared
    /// How many threads name and store chunks.
    let threads: Int

    /// Lanes naming chunks with `keys` into `store`, pinning them with `pins`, holding at most `limit` bytes of chunks
    /// waiting or being stored (one chunk is always let in, whatever its size).
    init(keys: BlobKeys, store: ChunkStore, pins: ChunkPins, limit: Int, threads: Int = 4) {
        shared = Shared(keys: keys, store: store, pins: pins, limit: limit)
        self.threads = threads
    }

    // The pins go with the writer, not with the threads (which end a moment after their last chunk): a sweep right
    // after the writer is done must see its chunks unpinned.
    deinit { shared.releasePins() }

    /// Hands chunk number `index` of the blob (its content, `bytes`) to the lanes; waits while they hold `limit`
    /// bytes. Throws the first failure of a chunk handed over before (the writer then ends).
    func submit(_ index: Int, _ bytes: [UInt8]) throws(ChunkStoreError) {
        try shared.submit(index, bytes, threads: threads)
    }

    /// Waits until every chunk handed over is stored, and returns each one's id and whether it was new, by index;
    /// throws the first failure.
    func drain() throws(ChunkStoreError) -> [Int: (id: ChunkID, new: Bool)] {
        try shared.drain()
    }

    /// The lanes' state, guarded by `condition`.
    private final class Shared: @unchecked Sendable {
        // @unchecked: every mutable field below is read and written only while `condition` is locked.
        let keys: BlobKeys
        let store: ChunkStore
        /// The writer's pins, until the writer goes (`releasePins`).
        var pins: ChunkPins?
        let limit: Int
        let condition = NSCondition()
        /// Chunks handed over and not yet taken by a thread.
        var waiting: [(index: Int, bytes: [UInt8])] = []
        /// Bytes of chunks handed over and not yet stored.
        var held = 0
        /// Chunks handed over and not yet stored.
        var outstanding = 0
        /// Stored chunks by index.
        var done: [Int: (id: ChunkID, new: Bool)] = [:]
        /// The first chunk that failed.
        var failure: ChunkStoreError?
        /// Threads running.
        var running = 0

        init(keys: BlobKeys, store: ChunkStore, pins: ChunkPins, limit: Int) {
            self.keys = keys
            self.store = store
            self.pins = pins
            self.limit = limit
        }

        func submit(_ index: Int, _ bytes: [UInt8], threads: Int) throws(ChunkStoreError) {
            condition.lock()
            defer { condition.unlock() }
            while failure == nil && held > 0 && held + bytes.count > limit { condition.wait() }
            if let failure { throw failure }
            waiting.append((index, bytes))
            held += bytes.count
            outstanding += 1
            if running < threads && running < waiting.count {
                running += 1
                Thread { self.work() }.start()
            }
            condition.broadcast()
        }

        func drain() throws(ChunkStoreError) -> [Int: (id: ChunkID, new: Bool)] {
            condition.lock()
            defer { condition.unlock() }
            while failure == nil && outstanding > 0 { condition.wait() }
            if let failure { throw failure }
            let out = done
            done = [:]
            return out
        }

        /// How long a thread waits for the next chunk before it ends (a writer being fed keeps its threads; one
        /// whose client stopped sending lets them go).
        static let idle: TimeInterval = 0.2

        func releasePins() {
            condition.lock()
            pins = nil
            condition.unlock()
        }

        /// A thread's loop: takes the next chunk, names it and stores it, until none has waited for `idle`.
        func work() {
            condition.lock()
            while !waiting.isEmpty || (condition.wait(until: Date(timeIntervalSinceNow: Self.idle)) && !waiting.isEmpty) {
                let (index, bytes) = waiting.removeFirst()
                // Held only while this chunk is stored, and let go before its outcome is told.
                var pinning = pins
                condition.unlock()
                let outcome = Result { () throws(ChunkStoreError) -> (ChunkID, Bool) in
                    let id = keys.id(of: bytes)
                    return (id, try store.put(id, bytes, pinning: pinning))
                }
                pinning = nil
                condition.lock()
                held -= bytes.count
                outstanding -= 1
                switch outcome {
                case .success(let stored): done[index] = stored
                case .failure(let error): if failure == nil { failure = error }
                }
                condition.broadcast()
            }
            running -= 1
            condition.unlock()
        }
    }
}
