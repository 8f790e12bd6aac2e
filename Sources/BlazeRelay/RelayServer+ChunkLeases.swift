import BlazeProtocol
import Foundation

/// Chunk leases (Protocol/RELAY.md, "Blob chunks"): a relay cannot tell which chunks a space's documents still refer
/// to, so it keeps each chunk while members say they need it. A chunk is kept (its lease starts again) when it is
/// stored, when a writing member offers it, and when a member names it in a `CHUNK_KEEP` (devices tell every relay
/// they use every chunk they hold, at each connection and every 12 hours); one nobody kept for the lease goes.
extension RelayServer {
    /// Chunks dropped per store call (up to 128 MiB: SQLite walks a deleted row's pages), so one sweep never holds
    /// the store's writer long.
    static let leaseSweepBatch = 32

    /// Drops chunks nobody kept for `lease`, checking every hour (or every quarter of `lease`, if shorter), from now
    /// until shutdown.
    public func leaseChunks(for lease: Duration) {
        let relay = self
        let every = min(lease / 4, .seconds(3600))
        let task = Task(executorPreference: executor) {
            while !Task.isCancelled {
                try? await Task.sleep(for: every)
                if Task.isCancelled { return }
                await relay.dropUnkeptChunks(olderThan: lease)
            }
        }
        leaser.withLock { $0?.cancel(); $0 = task }
    }

    /// Drops every chunk nobody kept for `age`; returns how many went.
    @discardableResult
    public func dropUnkeptChunks(olderThan age: Duration) async -> Int {
        let (seconds, attoseconds) = age.components
        let cutoff = Self.nowMs() - seconds * 1000 - attoseconds / 1_000_000_000_000_000
        var total = 0
        do {
            while true {
                let (chunks, bytes) = try await store.dropUnkeptChunks(keptBeforeMs: cutoff, limit: Self.leaseSweepBatch)
                if chunks > 0 {
                    total += chunks
                    record(.chunksDropped(chunks))
                    logger.info("Relay dropped chunks nobody kept", metadata: ["chunks": "\(chunks)", "bytes": "\(bytes)"])
                }
                if chunks < Self.leaseSweepBatch { return total }
            }
        } catch {
            logger.error("Relay chunk lease sweep failed", metadata: ["error": "\(error)"])
            return total
        }
    }
}
