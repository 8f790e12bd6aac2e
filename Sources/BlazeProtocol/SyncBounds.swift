/// Bounds every sequence number read from a peer, a relay, a folder or a backup is held to before any arithmetic.
public enum SyncBounds {
    /// Sequence numbers are below 2^62: a run's last seq (`first + count - 1`) and a gap (`theirs - mine`) then fit in
    /// `Int64` and `Int`, and no real log comes near it (a million changes a second for 146,000 years).
    public static let maxSeq: UInt64 = 1 << 62

    /// True for a sequence number a real log can hold: from 1, below `maxSeq`.
    public static func isValidSeq(_ seq: UInt64) -> Bool { seq > 0 && seq < maxSeq }
}
