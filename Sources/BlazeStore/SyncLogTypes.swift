import BlazeCRDT
import BlazeProtocol
import Foundation

/// Two entries one origin signed for the same sequence number: proof that its log forked.
public struct ForkEvidence: Sendable, Equatable {
    /// The forked origin (quarantined).
    public var origin: NodeID
    /// The sequence number with two entries.
    public var seq: UInt64
    /// Hash of the entry held here.
    public var heldHash: [UInt8]
    /// Hash of the other entry, which a head signed by the origin covers.
    public var otherHash: [UInt8]
    /// When it was found (Unix milliseconds).
    public var detectedAtMs: Int64
}

/// What storing a batch of entries did.
public struct BatchOutcome: Sendable, Equatable {
    /// Entries stored for the first time.
    public var stored = 0
    /// Entries already held (same hash).
    public var duplicates = 0
    /// What applying their changes did.
    public var report = ReceiveReport()

    /// An outcome (all counts zero by default).
    public init(stored: Int = 0, duplicates: Int = 0, report: ReceiveReport = ReceiveReport()) {
        self.stored = stored
        self.duplicates = duplicates
        self.report = report
    }
}

/// One entry of a sync log as the store keeps it: opaque sealed bytes and their hash (BlazeSync seals and verifies).
public struct SyncLogEntry: Sendable, Equatable {
    /// The origin's sequence number.
    public var seq: UInt64
    /// The entry's hash (what the next entry links to).
    public var hash: [UInt8]
    /// The sealed bytes.
    public var bytes: [UInt8]

    /// An entry.
    public init(seq: UInt64, hash: [UInt8], bytes: [UInt8]) {
        self.seq = seq
        self.hash = hash
        self.bytes = bytes
    }
}

/// A verified batch of one origin's entries for `SyncLogStore.recordEntries(group:)`: the entries with their changes
/// (and the changes' texts as the entries carried them), the hash the first entry links to, and the head.
public struct ReceivedBatch: Sendable {
    /// The origin of every entry.
    public var origin: NodeID
    /// The entries, in sequence order.
    public var entries: [SyncLogEntry]
    /// The hash the first entry names as its previous one.
    public var firstPrev: [UInt8]
    /// Each entry's change.
    public var changes: [Change]
    /// Each change's text, when known.
    public var texts: [[UInt8]]?
    /// The head covering the last entry.
    public var head: (seq: UInt64, bytes: [UInt8])

    /// A batch (`texts`, when given, one per change).
    public init(
        origin: NodeID, entries: [SyncLogEntry], firstPrev: [UInt8], changes: [Change], texts: [[UInt8]]?,
        head: (seq: UInt64, bytes: [UInt8])
    ) {
        self.origin = origin
        self.entries = entries
        self.firstPrev = firstPrev
        self.changes = changes
        self.texts = texts
        self.head = head
    }
}

/// Why `recordEntries` stored nothing: the batch contradicts the log held here.
public enum SyncLogConflict: Error, Sendable, Equatable {
    /// The origin has forked before; nothing more of it is accepted.
    case quarantined
    /// The first entry does not continue the log held here (a gap, or another previous entry).
    case brokenChain
    /// An entry differs from the one held for the same sequence number.
    case fork
    /// Storing the batch would leave more of the origin's changes parked than `StoreLimits.maxParkedPerOrigin`.
    case tooManyParked
}

