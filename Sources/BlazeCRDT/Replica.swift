import BlazeProtocol

/// The last-writer-wins state of one user index definition.
public struct IndexState: Hashable, Sendable {
    /// The winning definition's stamp.
    public let stamp: Stamp
    /// Collection it covers.
    public let collection: String
    /// Indexed fields; nil when the index is dropped.
    public let fields: [String]?
    /// For a vector index, its dimensions and metric; nil for an index of values.
    public let vector: IndexVector?

    /// Creates a state.
    public init(stamp: Stamp, collection: String, fields: [String]?, vector: IndexVector? = nil) {
        self.stamp = stamp
        self.collection = collection
        self.fields = fields
        self.vector = vector
    }
}

/// What makes an index a vector index: the dimensions of the vectors it holds and the metric it is searched by.
///
/// Kept as the JSON the author wrote (`{"d": dimensions, "m": metric}`, and whatever a newer build adds): a definition
/// this build cannot read (another shape, a metric it does not know) is held as it came — the register converges,
/// the change is not refused — and not built.
public struct IndexVector: Hashable, Sendable {
    /// The JSON form in index operations and stored states, as written.
    public let jsonValue: JSONValue

    /// A vector index's shape.
    public init(dimensions: Int, metric: String) {
        jsonValue = ["d": .int(Int64(dimensions)), "m": .string(metric)]
    }

    /// Any JSON value as a vector index's shape (an object is expected; anything else is held and not built).
    public init(json: JSONValue) {
        jsonValue = json
    }

    /// Components of each vector; 0 when the shape does not say (not built).
    public var dimensions: Int {
        guard case .int(let d)? = jsonValue["d"], d >= 1, d <= 1 << 20 else { return 0 }
        return Int(d)
    }

    /// The metric's name (`cosine`, `l2`, `ip`); "" when the shape does not say (not built).
    public var metric: String { jsonValue["m"]?.stringValue ?? "" }
}

/// Where a replica keeps its state; the SQLite store and the in-memory test replica implement it.
///
/// Every call happens inside one transaction of the caller; the engine never does I/O itself.
public protocol ReplicaStorage {
    /// The highest applied sequence per origin.
    func versionVector() throws -> VersionVector
    /// Appends an applied change to the op log and advances the version vector to it.
    func recordApplied(_ change: Change) throws
    /// A document's state, nil if never seen.
    func document(_ key: DocKey) throws -> DocumentState?
    /// Stores a document's state (and its materialized form).
    func saveDocument(_ key: DocKey, _ state: DocumentState) throws
    /// Loads a document's state (empty if never seen), lets `edit` change it in place, and saves it.
    func updateDocument(_ key: DocKey, _ edit: (inout DocumentState) -> Void) throws
    /// Applies operation `index` of `change`, a document creation (`DocOp.isPlainCreation`), without building the
    /// document's state, when no state exists for its key; false when one does (the caller then applies it).
    func createIfNew(_ op: DocOp, index: Int, of change: Change) throws -> Bool
    /// An index definition's state, nil if never seen.
    func index(_ name: String) throws -> IndexState?
    /// Stores an index definition's state (and creates or drops the index).
    func saveIndex(_ name: String, _ state: IndexState) throws
    /// Keeps a change that is not yet causally ready.
    func park(_ change: Change) throws
    /// All parked changes.
    func parked() throws -> [Change]
    /// Forgets a parked change.
    func unpark(origin: NodeID, seq: UInt64) throws
    /// The parked changes that are next from their origin under `vv` (`seq == vv[origin] + 1`): the only ones that
    /// can have become ready.
    func parkedNext(_ vv: VersionVector) throws -> [Change]
    /// How many changes are parked.
    func parkedCount() throws -> Int
    /// Whether any change is parked.
    func hasParked() throws -> Bool
    /// Records that `change` deleted `key` (raised its causal length to an even one): compaction drops the tombstone
    /// once that change is stable.
    func noteDeleted(_ key: DocKey, by change: Change) throws
}

extension ReplicaStorage {
    /// Default: filters `parked()`.
    public func parkedNext(_ vv: VersionVector) throws -> [Change] {
        try parked().filter { $0.seq == vv[$0.origin] + 1 }
    }

    /// Default: counts `parked()`.
    public func parkedCount() throws -> Int { try parked().count }

    /// Default: nothing (a storage that never drops tombstones need not know who made them).
    public func noteDeleted(_ key: DocKey, by change: Change) throws {}

    /// Default: `parkedCount() > 0`.
    public func hasParked() throws -> Bool { try parkedCount() > 0 }

    /// Default: false (every operation takes the general path).
    public func createIfNew(_ op: DocOp, index: Int, of change: Change) throws -> Bool { false }

    /// Default: `document`, then `saveDocument`. Storages that cache states override it to edit without a copy.
    public func updateDocument(_ key: DocKey, _ edit: (inout DocumentState) -> Void) throws {
        var state = try document(key) ?? DocumentState()
        edit(&state)
        try saveDocument(key, state)
    }
}

/// What `Replica.receive` did with a batch of changes.
public struct ReceiveReport: Equatable, Sendable {
    /// Changes applied (including parked ones that became ready).
    public var applied = 0
    /// Changes already applied before.
    public var duplicates = 0
    /// Changes parked because a change they depend on is missing.
    public var parked = 0
    /// Changes whose clock was far ahead of wall time (accepted, counted).
    public var skewedClocks = 0

    /// Creates an empty report.
    public init() {}
}

/// The replication engine: applies local and remote changes to a storage with causal delivery.
public enum Replica {
    /// True when every change `change` depends on is applied and it is the next from its origin.
    public static func isReady(_ change: Change, _ vv: VersionVector) -> Bool {
        change.seq == vv[change.origin] + 1 && vv.includes(change.deps)
    }

    /// Applies remote changes in any order and with duplicates; unready ones wait until their dependencies arrive.
    public static func receive(
        _ changes: [Change], into storage: some ReplicaStorage, clock: inout HybridClock, now: UInt64
    ) throws -> ReceiveReport {
        var report = ReceiveReport()
        var vv = try storage.versionVector()
        var progressed = false
        // Parked changes are rare: when there are none, nothing below looks for them.
        var anyParked = try storage.hasParked()
        /// Applies a ready change, advances the vector and forgets any parked copy of it.
        func applyReady(_ c: Change) throws {
            try apply(c, to: storage)
            if clock.observe(c.hlc, now: now) { report.skewedClocks += 1 }
            vv[c.origin] = c.seq
            if anyParked { try storage.unpark(origin: c.origin, seq: c.seq) }
            report.applied += 1
        }
        for c in changes.sorted(by: { $0.origin != $1.origin ? $0.origin < $1.origin : $0.seq < $1.seq }) {
            if c.seq <= vv[c.origin] {
                report.duplicates += 1
            } else if isReady(c, vv) {
                // (A copy parked when it arrived too early is a duplicate from now on.)
                try applyReady(c)
                progressed = true
            } else {
                try storage.park(c)
                anyParked = true
                report.parked += 1
            }
        }
        guard anyParked, progressed || report.parked > 0 else { return report }
        // Drain parked changes that became ready, until nothing moves. Only a change that is next from its origin can
        // be ready, so each round reads at most one parked change per origin (not every parked change).
        while true {
            var moved = false
            for c in try storage.parkedNext(vv).sorted(by: { $0.origin < $1.origin }) where isReady(c, vv) {
                try applyReady(c)
                moved = true
            }
            if !moved { break }
        }
        report.parked = try storage.parkedCount()
        return report
    }

    /// Applies a causally ready change and records it.
    public static func apply(_ change: Change, to storage: some ReplicaStorage) throws {
        for (i, op) in change.ops.enumerated() {
            // A new document (the usual remote change) is written at once when the storage can.
            if case .doc(let d) = op, d.isPlainCreation, try storage.createIfNew(d, index: i, of: change) { continue }
            try applyOp(op, index: i, of: change, to: storage)
        }
        try storage.recordApplied(change)
    }

    /// Applies one operation of `change` (whose `ops` may still be incomplete while a local transaction builds it).
    public static func applyOp(_ op: CRDTOp, index: Int, of change: Change, to storage: some ReplicaStorage) throws {
        switch op {
        case .doc(let d):
            try storage.updateDocument(d.key) { $0.apply(d, change: change, index: index) }
        case .delete(let key, let cl):
            var raised = false
            try storage.updateDocument(key) {
                raised = cl > $0.cl
                $0.delete(cl: cl)
            }
            if raised { try storage.noteDeleted(key, by: change) }
        case .index(let name, let collection, let fields, let vector):
            let stamp = change.stamp(index)
            if let current = try storage.index(name), stamp < current.stamp { return }
            try storage.saveIndex(name, IndexState(stamp: stamp, collection: collection, fields: fields, vector: vector))
        }
    }
}
