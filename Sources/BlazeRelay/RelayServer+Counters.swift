import Synchronization

/// What a relay counts, for `counters` (tests, operators) and `GET /metrics`.
extension RelayServer {
    /// Something a connection did, counted for `counters` and `/metrics`.
    enum Event {
        case established, refusedHandshake
        case stored(entries: Int, bytes: Int)
        case sent(entries: Int, bytes: Int)
        case rejected(String)
        /// A store operation failed (`timedOut`: did not finish within `timeout`) and closed its connection.
        case storeFailed(timedOut: Bool)
        /// Acknowledgements kept (newer than those held of their signers).
        case acksKept(Int)
        /// A snapshot a member uploaded was kept; one was sent to a device; an upload was declined (its pieces ignored).
        case snapshotKept, snapshotSent, snapshotDropped
        /// A blob chunk a device sent was stored, held already or left out over the quota; one was served; copies
        /// members found bad were dropped.
        case chunk(ChunkStored, bytes: Int)
        case chunkServed(bytes: Int)
        case chunksDropped(Int)
    }

    /// Counts `event`.
    func record(_ event: Event) {
        switch event {
        case .established:
            stats.withLock { $0.connections += 1 }
            metrics.connectionsEstablished.increment()
        case .refusedHandshake:
            stats.withLock { $0.refused += 1 }
            metrics.handshakesRefused.increment()
        case .stored(let entries, let bytes):
            stats.withLock { $0.entriesStored += entries }
            metrics.entriesStored.increment(by: entries)
            metrics.bytesStored.increment(by: bytes)
        case .sent(let entries, let bytes):
            stats.withLock { $0.entriesSent += entries }
            metrics.entriesForwarded.increment(by: entries)
            metrics.bytesForwarded.increment(by: bytes)
        case .rejected(let reason):
            stats.withLock { $0.rejected[reason, default: 0] += 1 }
            metrics.rejected(reason)
        case .snapshotKept:
            stats.withLock { $0.snapshotsKept += 1 }
            metrics.snapshotsKept.increment()
        case .snapshotSent:
            stats.withLock { $0.snapshotsSent += 1 }
            metrics.snapshotsSent.increment()
        case .snapshotDropped:
            stats.withLock { $0.snapshotsDropped += 1 }
            metrics.snapshotsDropped.increment()
        case .acksKept(let n):
            stats.withLock { $0.acksKept += n }
            metrics.acksKept.increment(by: n)
        case .storeFailed(let timedOut):
            stats.withLock { timedOut ? ($0.storeTimeouts += 1) : ($0.storeErrors += 1) }
            (timedOut ? metrics.storeTimeouts : metrics.storeErrors).increment()
        case .chunk(.stored, let bytes):
            stats.withLock { $0.chunksStored += 1 }
            metrics.chunksStored.increment()
            metrics.chunkBytesStored.increment(by: bytes)
        case .chunk(.held, _):
            break
        case .chunk(.overQuota, _):
            stats.withLock { $0.chunksOverQuota += 1 }
            metrics.chunksOverQuota.increment()
        case .chunkServed(let bytes):
            stats.withLock { $0.chunksServed += 1 }
            metrics.chunksServed.increment()
            metrics.chunkBytesServed.increment(by: bytes)
        case .chunksDropped(let n):
            stats.withLock { $0.chunksDropped += n }
            metrics.chunksDropped.increment(by: n)
        }
    }

    /// What the relay counted since start.
    public var counters: RelayCounters {
        var c = stats.withLock { $0 }
        c.refusedOverLimit = gate.refused.load(ordering: .relaxed)
        return c
    }
}

/// What a relay counted since start.
public struct RelayCounters: Sendable {
    /// Connections that passed the handshake.
    public var connections = 0
    /// Connections refused at the handshake (no served capability proven, or none in time).
    public var refused = 0
    /// Connections closed at once because a listener limit was reached.
    public var refusedOverLimit = 0
    /// Entries stored, and sent to devices.
    public var entriesStored = 0, entriesSent = 0
    /// Batches refused, by reason.
    public var rejected: [String: Int] = [:]
    /// Store operations that failed, and those that did not finish within the relay's timeout (each closed its
    /// connection).
    public var storeErrors = 0, storeTimeouts = 0
    /// Acknowledgements kept and passed on (SYNC.md §11).
    public var acksKept = 0
    /// Snapshots members uploaded that were kept, snapshots sent to devices (SYNC.md §11), and uploads declined (too
    /// large, over the relay's staging room, or slower than its window).
    public var snapshotsKept = 0, snapshotsSent = 0, snapshotsDropped = 0
    /// Blob chunks stored, served, left out because their space was at its quota, and dropped as bad copies.
    public var chunksStored = 0, chunksServed = 0, chunksOverQuota = 0, chunksDropped = 0
}
