/// The last entry of an origin a replica no longer holds (compacted away, or covered by a snapshot): the chain head
/// its later entries link to. Devices keep one per origin in `sync_pruned`, relays in `relay_bases` (SYNC.md §11).
public struct PrunedHead: Sendable, Equatable {
    /// Entries up to this sequence are not held.
    public var seq: UInt64
    /// The hash of the entry at `seq`; 32 zero bytes when the origin's chain starts after `seq`.
    public var hash: [UInt8]

    /// A pruned head.
    public init(seq: UInt64, hash: [UInt8]) {
        self.seq = seq
        self.hash = hash
    }

    /// The hash that marks a chain starting after `seq` (its first entry links to zeros).
    public static let chainStart = [UInt8](repeating: 0, count: 32)
}
