import CoreMetrics

/// What a store reports through swift-metrics (the daemon backs it with a Prometheus registry): each group commit's
/// size and duration, and each local write transaction's `COMMIT` (the WAL append and its fsync).
public final class StoreMetrics: Sendable {
    /// Writes carried by each group commit (a lone commit is a group of one).
    let groupSize: Recorder
    /// Each group commit, from its first write's apply to its commit's return.
    let groupDuration: Timer
    /// Each local write transaction's `COMMIT` statement: the WAL append and, with `synchronous = FULL`, its fsync.
    let commitDuration: Timer

    /// Compaction runs.
    let compactions: Counter
    /// Rows compaction removed (changes, tombstones, entries, heads).
    let compactedRows: Counter
    /// Each compaction run's duration.
    let compactionDuration: Timer

    /// The label of the group size histogram (for a backend that takes buckets per label).
    public static let groupSizeLabel = "blazed_write_group_size"

    /// Instruments made by `factory`: `blazed_write_group_size`, `blazed_write_group_seconds`, `blazed_commit_seconds`,
    /// `blazed_compactions_total`, `blazed_compacted_rows_total` and `blazed_compaction_seconds`.
    public init(factory: any MetricsFactory) {
        compactions = Counter(label: "blazed_compactions_total", dimensions: [], factory: factory)
        compactedRows = Counter(label: "blazed_compacted_rows_total", dimensions: [], factory: factory)
        compactionDuration = Timer(label: "blazed_compaction_seconds", dimensions: [], factory: factory)
        groupSize = Recorder(label: Self.groupSizeLabel, dimensions: [], aggregate: true, factory: factory)
        groupDuration = Timer(label: "blazed_write_group_seconds", dimensions: [], factory: factory)
        commitDuration = Timer(label: "blazed_commit_seconds", dimensions: [], factory: factory)
    }

    /// Records one group commit of `size` writes that took from `started` until now.
    func recordGroup(size: Int, started: ContinuousClock.Instant) {
        groupSize.record(size)
        groupDuration.recordNanoseconds(Self.nanoseconds(since: started))
    }

    /// Records one compaction run that took from `started` until now.
    func recordCompaction(_ report: CompactionReport, started: ContinuousClock.Instant) {
        compactions.increment()
        compactedRows.increment(by: report.rows)
        compactionDuration.recordNanoseconds(Self.nanoseconds(since: started))
    }

    /// Nanoseconds from `started` until now.
    static func nanoseconds(since started: ContinuousClock.Instant) -> Int64 {
        let d = ContinuousClock.now - started
        return d.components.seconds * 1_000_000_000 + d.components.attoseconds / 1_000_000_000
    }
}
