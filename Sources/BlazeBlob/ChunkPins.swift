import BlazeProtocol
import Synchronization

/// The chunks one put under way stored or found held (`BlobWriter`), or a backup is copying: pinned in their store,
/// so that a sweep leaves them, until this is released (when the last copy of what holds it goes).
public final class ChunkPins: Sendable {
    private let store: ChunkStore
    private let ids = Mutex<Set<ChunkID>>([])

    /// No pins yet, in `store`.
    public init(store: ChunkStore) { self.store = store }

    /// Records `id`; false when it was pinned already (by these pins).
    func add(_ id: ChunkID) -> Bool { ids.withLock { $0.insert(id).inserted } }

    deinit { store.unpin(Array(ids.withLock { $0 })) }
}
