import BlazeCrypto
import BlazeProtocol
import NIOCore
import Synchronization

/// Bounds on the snapshots members upload to a relay (Protocol/RELAY.md, "What it does"). Pieces are staged in the
/// store as they come, never held whole in memory; an upload past these bounds is declined, not refused.
public struct SnapshotUploadLimits: Sendable {
    /// The largest upload staged, by its manifest's declared size; a larger one is declined.
    public var maxBytes = 256 << 20
    /// How long an upload may take from its manifest to its last piece; a slower one is declined.
    public var window: TimeAmount = .minutes(5)
    /// What uploads under way may stage at once, by their manifests' declared sizes, across connections (and
    /// `maxBytes` per space); an upload that would go over it is declined.
    public var stagedBytes = 1 << 30

    /// The defaults: 256 MiB per upload, 5 minutes, 1 GiB staged at once.
    public init() {}

    /// How old (ms) staged pieces must be to belong to no upload under way: a connection drops what it staged at its
    /// window, and a keep under way ends within the store's timeout. Older ones a stopped process left go.
    var staleAfterMs: Int64 { window.nanoseconds / 1_000_000 + 5 * 60 * 1000 }
}

/// One snapshot upload on a relay connection (SYNC.md §11): its accepted manifest, and the pieces taken so far, each
/// checked against it before the relay writes it (the next index, naming the hash of the one before, within the
/// manifest's count and declared size, the last the one it names with the total it declares). A declined upload is
/// checked the same way: its pieces are read and ignored, no more than its manifest declares, and a piece out of
/// place is refused as for any upload.
struct SnapshotUpload {
    let manifest: SnapshotManifest
    /// Its key among the store's staged pieces: random, so uploads of one space on several connections never mix.
    let id: [UInt8]
    /// When it began (Unix ms), stored with each piece for age cleanup.
    let startedMs: Int64
    /// Set once what it staged is to go (declined, or its connection closed): a piece being written meanwhile drops
    /// the upload again once written, so none stays behind.
    let ended: UploadEnd
    /// Declared bytes reserved in the relay's `snapshotStaging` (0 once given back).
    var reserved = 0
    /// Why the relay declined it (nil: its pieces are staged).
    var declined: String?
    private(set) var next: UInt32 = 0
    private(set) var last = SealedEntry.genesis
    private(set) var seen: UInt64 = 0

    init(manifest: SnapshotManifest, startedMs: Int64) {
        self.manifest = manifest
        self.startedMs = startedMs
        id = SpaceKey.randomBytes(16)
        ended = UploadEnd()
    }

    /// Whether its last piece was taken.
    var complete: Bool { next == manifest.parts }

    /// Takes `part` when it is the next piece; returns whether it is the last. `badSnapshot` otherwise.
    mutating func take(_ part: SnapshotPart) throws(SyncRejection) -> Bool {
        let bytes = UInt64(part.bytes.count)
        guard next < manifest.parts, part.index == next, part.prev == last, bytes <= manifest.size - seen else {
            throw .badSnapshot
        }
        let isLast = next + 1 == manifest.parts
        guard !isLast || (part.hash == manifest.lastPart && seen + bytes == manifest.size) else { throw .badSnapshot }
        (next, last, seen) = (next + 1, part.hash, seen + bytes)
        return isLast
    }
}

/// Whether an upload's staged pieces are to go, seen from the task writing one (off the event loop).
final class UploadEnd: Sendable {
    private let flag = Atomic<Bool>(false)

    /// Marks the upload ended.
    func set() { flag.store(true, ordering: .sequentiallyConsistent) }

    /// Whether it ended.
    var isSet: Bool { flag.load(ordering: .sequentiallyConsistent) }
}
