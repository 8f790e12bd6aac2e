import BlazeCRDT
import BlazeProtocol

/// What one write transaction knows about the documents it read or wrote: `SQLStorage`'s per-document caches, kept
/// together so their rules can be stated (and, in debug builds, checked at every flush) in one place.
///
/// A document's current state lives in exactly one of three places. `states` holds decoded states (nil: "no such
/// document"). The two fast paths write rows without decoding a state: `created` (`SQLStorage.insertNew`) and
/// `patched` (`SQLStorage.patchInPlace`) keep what they wrote, and the first read moves it into `states`
/// (`SQLStorage.document`), so the general engine always sees the latest state.
///
/// Invariants:
/// 1. A key is in at most one of `states`, `created`, `patched`.
/// 2. `dirty` lists, once each and in first-write order, the keys whose state in `states` is newer than their rows;
///    each has a non-nil state there. `flush` writes exactly these. (Fast-path keys are never dirty: their rows are
///    already written.)
/// 3. `touched` lists, once each, the keys saved since the last recorded change; each has its state in `states`,
///    `created` or `patched`.
///    Recording a change empties it (`takeTouched`), and a flush requires it empty.
/// 4. `visible[key]` is the document as of the last recorded change (or as first read): the "before" of the next
///    feed event. No entry means the document did not exist.
/// 5. `locations[key]`, once known, is where the key's state is stored now; every created or patched key is `.row`
///    once it moves into `states`.
/// The `dirtySet`/`touchedSet` mirrors make membership O(1); they always equal their arrays as sets.
struct TransactionDocuments {
    /// A document's canonical text (nil when it does not exist). Only the text is kept: a filtering subscription
    /// parses it when it needs the document (`FeedEvent.after`).
    struct Visible {
        var text: String?
    }

    /// Where a document's state is stored.
    enum Location {
        /// Nowhere: the document was never seen.
        case absent
        /// Its `docs` row.
        case row(Int64)
        /// Its `tombstones` row.
        case tombstone
    }

    /// A document `insertNew` created: as given (with or without `_id`), its stored text (with `_id`), its stamp,
    /// its row.
    struct Created {
        var doc: [String: JSONValue]
        var text: String
        var stamp: Stamp
        var rowid: Int64

        /// The fields, without `_id`.
        var fields: [String: JSONValue] {
            var f = doc
            f.removeValue(forKey: "_id")
            return f
        }
    }

    /// A document `patchInPlace` rewrote: its new compact state text, its new body text (with `_id`), the stamp of
    /// the patch that did it, its row.
    struct Patched {
        var stateText: String
        var text: String
        var stamp: Stamp
        var rowid: Int64
    }

    /// Decoded states read or written in this transaction; a nil value caches "no such document".
    var states: [DocKey: DocumentState?] = [:]
    /// Documents created by the fast insert whose state was not needed since.
    var created: [DocKey: Created] = [:]
    /// Documents rewritten by the fast patch whose state was not needed since.
    var patched: [DocKey: Patched] = [:]
    /// Keys to write at flush, in first-write order.
    private(set) var dirty: [DocKey] = []
    private var dirtySet: Set<DocKey> = []
    /// Keys saved since the last recorded change, in first-touch order.
    private(set) var touched: [DocKey] = []
    private var touchedSet: Set<DocKey> = []
    /// Each document as of the last recorded change (or as loaded).
    var visible: [DocKey: Visible] = [:]
    /// Where each document read or written is stored.
    var locations: [DocKey: Location] = [:]

    /// Sizes the bookkeeping for a transaction that writes about `documents` documents, so it is not rehashed as it
    /// grows.
    mutating func reserve(documents: Int) {
        guard documents > 16 else { return }
        touched.reserveCapacity(documents)
        touchedSet.reserveCapacity(documents)
        created.reserveCapacity(documents)
        visible.reserveCapacity(documents)
    }

    /// True when nothing of `key` was read or written in this transaction (the fast paths' precondition).
    func untouched(_ key: DocKey) -> Bool {
        states[key] == nil && created[key] == nil && patched[key] == nil
    }

    /// Notes that `key` changed in the change being applied.
    mutating func touch(_ key: DocKey) {
        if touchedSet.insert(key).inserted { touched.append(key) }
    }

    /// Stores `state` as `key`'s latest, to be written at flush.
    mutating func save(_ key: DocKey, _ state: DocumentState) {
        states[key] = .some(state)
        if dirtySet.insert(key).inserted { dirty.append(key) }
        touch(key)
    }

    /// True when `key`'s state must still be written at flush.
    func isDirty(_ key: DocKey) -> Bool { dirtySet.contains(key) }

    /// The keys touched since the last recorded change; the list starts again empty.
    mutating func takeTouched() -> [DocKey] {
        defer {
            touched = []
            touchedSet = []
        }
        return touched
    }

    /// The keys to write, each with its state and visible body; nothing is dirty afterwards.
    mutating func takeDirty() -> [(key: DocKey, state: DocumentState, body: Visible)] {
        precondition(touched.isEmpty, "flush before the change was recorded")
        #if DEBUG
            checkInvariants()
        #endif
        defer {
            dirty = []
            dirtySet = []
        }
        return dirty.map { ($0, states[$0]!!, visible[$0] ?? Visible()) }
    }

    /// Traps when a rule above does not hold (debug builds check it at every flush; tests may call it any time).
    func checkInvariants() {
        for key in states.keys { precondition(created[key] == nil && patched[key] == nil, "\(key) cached twice") }
        for key in created.keys { precondition(patched[key] == nil, "\(key) created and patched") }
        precondition(dirty.count == dirtySet.count && Set(dirty) == dirtySet, "dirty list and set differ")
        precondition(touched.count == touchedSet.count && Set(touched) == touchedSet, "touched list and set differ")
        for key in dirty { precondition(states[key].map { $0 != nil } == true, "dirty \(key) has no state") }
        for key in touched {
            precondition(states[key] != nil || created[key] != nil || patched[key] != nil, "touched \(key) unsaved")
        }
    }
}
