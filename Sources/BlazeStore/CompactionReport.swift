import BlazeCRDT
import BlazeProtocol
import Foundation

/// What a compaction removed (Protocol/SYNC.md §11).
public struct CompactionReport: Sendable, Equatable {
    /// Op-log rows (`changes`) dropped.
    public var changes = 0
    /// Tombstones dropped.
    public var tombstones = 0
    /// Sealed entries dropped.
    public var entries = 0
    /// Signed heads dropped.
    public var heads = 0
    /// Live documents whose strictly stable history was folded into one stamp (`DocumentState.folded`).
    public var folded = 0
    /// Pages returned to the file system by incremental vacuum.
    public var pagesFreed = 0
    /// Write transactions it took.
    public var steps = 0
    /// When it finished (Unix milliseconds).
    public var finishedAtMs: Int64 = 0
    /// How long it took (milliseconds).
    public var durationMs: Int64 = 0

    /// An empty report.
    public init() {}

    /// Rows removed in all.
    public var rows: Int { changes + tombstones + entries + heads }

    mutating func add(_ other: CompactionReport) {
        changes += other.changes
        tombstones += other.tombstones
        entries += other.entries
        heads += other.heads
        folded += other.folded
        pagesFreed += other.pagesFreed
        steps += other.steps
    }

    /// The report as stored in `meta` and shown by `db.info`.
    public var jsonValue: JSONValue {
        .object([
            "changes": .int(Int64(changes)), "tombstones": .int(Int64(tombstones)), "entries": .int(Int64(entries)),
            "heads": .int(Int64(heads)), "folded": .int(Int64(folded)), "pagesFreed": .int(Int64(pagesFreed)), "steps": .int(Int64(steps)),
            "finishedAtMs": .int(finishedAtMs), "durationMs": .int(durationMs),
        ])
    }

    /// Reads a stored report; nil when malformed.
    public init?(json: JSONValue) {
        guard case .object(let o) = json else { return nil }
        func int(_ k: String) -> Int64? { if case .int(let v)? = o[k] { return v } else { return nil } }
        guard let c = int("changes"), let t = int("tombstones"), let e = int("entries"), let h = int("heads"),
            let p = int("pagesFreed"), let s = int("steps"), let f = int("finishedAtMs"), let d = int("durationMs")
        else { return nil }
        (changes, tombstones, entries, heads, pagesFreed, steps) = (Int(c), Int(t), Int(e), Int(h), Int(p), Int(s))
        (finishedAtMs, durationMs) = (f, d)
        folded = int("folded").map(Int.init) ?? 0  // absent in reports stored before it was counted
    }
}

