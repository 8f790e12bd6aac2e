import BlazeCRDT
import BlazeProtocol
import Synchronization

/// Decoded states of documents the writer wrote lately, each kept with the two texts it was stored as: a later
/// transaction that finds a document's row holding exactly those texts takes the decoded state instead of parsing
/// and decoding them again (`SQLStorage.document`).
///
/// An entry is used only when the row's state and body are byte for byte the texts it was written as, and decoding
/// is a function of those texts (and of the database's stamp coding, fixed for its life): whatever else writes the
/// row (compaction, a snapshot install, a restore, an older entry) leaves an entry that no longer matches, never a
/// wrong one. The property tests check that a state survives its texts unchanged (`MemoryReplica.saveDocument`).
///
/// Only states written through the general path enter (remote changes to existing documents, merges, conflicts):
/// local inserts and patches write texts without decoding, and stay out. So do the documents of a transaction whose
/// entries would take more than half of it (`admits`). Memory is bounded by `budget` (`Entry.cost`
/// estimates an entry from its texts and the parts of its decoded state); past it, entries are dropped in no
/// particular order.
final class StateCache: Sendable {
    /// A document's state as written, with the texts of its row.
    struct Entry: Sendable {
        let stateText: String
        let bodyText: String
        let state: DocumentState

        /// What the entry counts against the budget: its texts, and the decoded state at a generous 192 bytes per
        /// field and per write, tag or loser it holds (a key, a stamp, a value's box, dictionary slots) besides the
        /// value bytes the texts already count.
        let cost: Int

        init(stateText: String, bodyText: String, state: DocumentState) {
            self.stateText = stateText
            self.bodyText = bodyText
            self.state = state
            let parts = state.fields.values.reduce(state.fields.count) {
                $0 + $1.losers.count + $1.increments.count + $1.additions.count + ($1.winner == nil ? 0 : 1)
            }
            cost = Self.cost(stateText: stateText, bodyText: bodyText, parts: parts)
        }

        /// The cost of an entry with these texts and `parts` parts; with the state's field count for `parts`, the
        /// least it can cost, found without walking the fields.
        static func cost(stateText: String, bodyText: String, parts: Int) -> Int {
            2 * (stateText.utf8.count + bodyText.utf8.count) + 192 * parts + 128
        }
    }

    private let entries = Mutex<(map: [DocKey: Entry], cost: Int)>(([:], 0))
    /// Lookups answered from the cache since it was made (for tests and profiles).
    let hits = Atomic<Int>(0)
    /// The most the entries may count.
    let budget: Int

    /// A cache of at most `budget` (0: keeps nothing).
    init(budget: Int) {
        self.budget = budget
    }

    /// The entry of `key` if its row holds exactly `state` and `body`.
    func entry(_ key: DocKey, state: String, body: String) -> Entry? {
        // Bytes, not `String ==` (canonical equivalence): the entry is for exactly these texts.
        guard budget > 0, let e = entries.withLock({ $0.map[key] }), e.stateText.utf8.elementsEqual(state.utf8),
            e.bodyText.utf8.elementsEqual(body.utf8)
        else {
            return nil
        }
        hits.add(1, ordering: .relaxed)
        return e
    }

    /// Whether a transaction whose documents' entries would cost at least `leastCost` (`Entry.cost` with each state's
    /// field count, summed) fills the cache: only when that is at most half of it. A larger one, such as a catch-up group rewriting ten thousand documents,
    /// would push out as many entries as it puts in, and the next group's reads would mostly miss anyway: filling
    /// costs more than it saves (measured: W6.store 42,400–43,900 changes/s with the cache filled by every
    /// transaction, 45,300–48,800 with none).
    func admits(leastCost: Int) -> Bool {
        budget > 0 && leastCost <= budget / 2
    }

    /// Entries held, and what they count against the budget.
    var usage: (count: Int, cost: Int) { entries.withLock { ($0.map.count, $0.cost) } }

    /// Keeps `written` (documents whose rows a transaction that committed wrote), dropping others past the budget.
    func insert(_ written: [(key: DocKey, entry: Entry)]) {
        guard budget > 0, !written.isEmpty else { return }
        entries.withLock { e in
            for (key, entry) in written where entry.cost <= budget / 8 {
                if let old = e.map.updateValue(entry, forKey: key) { e.cost -= old.cost }
                e.cost += entry.cost
            }
            guard e.cost > budget else { return }
            // Down to three quarters, so that a full cache does not drop entries on every commit.
            var drop: [DocKey] = []
            var freed = 0
            for (key, entry) in e.map where e.cost - freed > budget / 4 * 3 {
                drop.append(key)
                freed += entry.cost
            }
            for key in drop { e.map.removeValue(forKey: key) }
            e.cost -= freed
        }
    }

    /// Forgets every entry.
    func removeAll() {
        entries.withLock { $0 = ([:], 0) }
    }
}

