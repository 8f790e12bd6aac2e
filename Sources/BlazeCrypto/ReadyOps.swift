import BlazeProtocol
import HeapModule

/// The operations ready to be applied while a log resolves, and the choice of the next (`MembershipState`): the
/// author ranking first (seniority), then the lowest hash; an author not yet a member ranks last until it is added.
/// A heap with each operation's rank fixed when it becomes ready, and pushed again with its author's seniority once
/// the author is added (the stale entry is skipped): O(log n) a choice instead of a scan of every ready operation.
struct ReadyOps {
    private struct Key: Comparable {
        let rank: Int
        let hash: EntryHash
        static func < (a: Key, b: Key) -> Bool { a.rank != b.rank ? a.rank < b.rank : a.hash < b.hash }
    }

    private let linear: Bool
    private var heap = Heap<Key>()
    /// Ready operations whose author was not a member when they became ready, by author.
    private var unranked: [String: [EntryHash]] = [:]
    /// Linear mode: every ready operation with its author.
    private var all: [(hash: EntryHash, author: String)] = []

    init(linear: Bool) { self.linear = linear }

    mutating func add(_ hash: EntryHash, author: String, members: [String: Member]) {
        if linear { return all.append((hash, author)) }
        if let m = members[author] {
            heap.insert(Key(rank: m.seniority, hash: hash))
        } else {
            heap.insert(Key(rank: Int.max, hash: hash))
            unranked[author, default: []].append(hash)
        }
    }

    /// `author` became a member: its waiting operations rank by its seniority.
    mutating func ranked(_ author: String, members: [String: Member]) {
        guard !linear, let rank = members[author]?.seniority else { return }
        for hash in unranked.removeValue(forKey: author) ?? [] { heap.insert(Key(rank: rank, hash: hash)) }
    }

    /// Takes the next operation to apply, nil when none is ready.
    mutating func next(members: [String: Member], done: Set<EntryHash>) -> EntryHash? {
        if linear {
            func key(_ i: Int) -> Key { Key(rank: members[all[i].author]?.seniority ?? Int.max, hash: all[i].hash) }
            guard let i = all.indices.min(by: { key($0) < key($1) }) else { return nil }
            return all.remove(at: i).hash
        }
        while let top = heap.popMin() {
            if !done.contains(top.hash) { return top.hash }
        }
        return nil
    }
}
