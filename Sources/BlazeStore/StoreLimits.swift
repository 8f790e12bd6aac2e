import BlazeCRDT
import BlazeSettings

/// Limits the store enforces on every write and query; all configurable through the daemon.
public struct StoreLimits: Sendable, Equatable {
    /// Maximum size of one document's canonical JSON in bytes.
    public var maxDocumentBytes = BlazedSettings.maxDocumentBytes.defaultValue
    /// Maximum number of operations in one `tx.commit`.
    public var maxTransactionOps: Int = 10_000
    /// Maximum `limit` of one `query.find` page.
    public var maxQueryLimit: Int = 10_000
    /// `limit` used when a query gives none.
    public var defaultQueryLimit: Int = 100
    /// Maximum ids in one `doc.getMany`.
    public var maxGetMany: Int = 10_000
    /// Maximum fields in one user index.
    public var maxIndexFields: Int = 8
    /// Most indexes built per database, of every kind: each one costs every write that touches its collection, on
    /// every device. A local `index.create` past it is refused (`too_many_indexes`); a definition past it received
    /// from another device is kept, not built, and built once another is dropped.
    public var maxIndexes: Int = 64
    /// Most vector indexes built per database (within `maxIndexes`): each holds its vectors in memory once searched.
    public var maxVectorIndexes: Int = 8
    /// Bytes of vectors and graph links a database's vector indexes hold in memory (`max-vector-memory`); an index
    /// that would take it past this is searched exactly from its stored rows instead, one row at a time.
    public var maxVectorMemoryBytes = BlazedSettings.maxVectorMemory.defaultValue

    /// How far ahead of local wall time (milliseconds) the clock of a change from another device may be; a change
    /// further ahead is refused (`clock_ahead` in `sync.status`) until local time catches up.
    public var maxClockAheadMilliseconds: UInt64 = ChangeBounds.defaultMaxClockAheadMilliseconds
    /// Most changes of one origin parked at once, waiting for changes they depend on; a batch that would park more
    /// is refused (`too_many_parked` in `sync.status`) and comes again once what it waits for has arrived.
    public var maxParkedPerOrigin: Int = 100_000
    /// Maximum nesting depth of JSON from outside: requests, a document's values (remote changes as local writes),
    /// snapshots and restored backups (`max-depth`).
    public var maxDepth = BlazedSettings.maxDepth.defaultValue

    /// Document events (inserts, updates, deletes) kept in the durable change feed for `subscribe` with `since`;
    /// older ones are pruned (`feed-retention`).
    public var feedRetention = BlazedSettings.feedRetention.defaultValue

    /// WAL size in pages after which a commit asks for a background checkpoint (see `Checkpointer`).
    var walCheckpointPages: Int32 = 4000
    /// The writer connection's page cache, KiB (grown as pages are read, up to this). 16 MiB holds the pages a
    /// catch-up rewrites over ten thousand documents; it stored W6's patches 1.1× as fast as SQLite's 2 MiB default.
    var writerCacheKiB = 16 << 10
    /// What a database's cache of decoded document states may hold (`StateCache`: twice its texts' bytes).
    var stateCacheBytes = 16 << 20
    /// WAL size in pages after which the writer checkpoints itself, should background checkpoints fall behind.
    var walMaxPages: Int32 = 16000
    /// Pages written since a completed background checkpoint that the writer copies itself so the WAL can restart.
    var walFinishPages: Int32 = 1000

    /// Default limits.
    public init() {}
}
