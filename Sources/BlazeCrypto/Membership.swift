import BlazeProtocol
import Crypto

/// A key of one epoch, named by the operation that created it (the log's `create` for epoch 1, else a `remove`).
public struct EpochKeyID: Sendable, Hashable {
    /// The epoch number entries carry in their header.
    public let epoch: Epoch
    /// Hash of the operation that created the key.
    public let op: EntryHash

    /// The key of `epoch` that the operation hashed `op` created.
    public init(epoch: Epoch, op: EntryHash) {
        self.epoch = epoch
        self.op = op
    }
}

/// A device of a space's membership as the log resolves it.
public struct Member: Sendable, Equatable {
    /// Its public keys.
    public let keys: DevicePublicKeys
    /// Its role.
    public let role: MemberRole
    /// Node id of the admin who added it; nil for the creator.
    public let addedBy: [UInt8]?
    /// When it was added (the adding admin's clock, Unix ms).
    public let addedAtMs: UInt64
    /// Its rank among admins when concurrent operations are ordered: the creator is 0, then in order of addition.
    public let seniority: Int
    /// Set once removed: whose removal, when, the last sequence number of its entries members accept, and (in a log
    /// that commits to its cutoffs) the hash of its entry at that sequence, which it signed.
    public var removal: (by: [UInt8], atMs: UInt64, cutoff: UInt64, cutoffHash: [UInt8]?)?

    /// True until removed.
    public var isCurrent: Bool { removal == nil }

    /// Compares every field (the removal tuple included).
    public static func == (a: Member, b: Member) -> Bool {
        a.keys == b.keys && a.role == b.role && a.addedBy == b.addedBy && a.addedAtMs == b.addedAtMs
            && a.seniority == b.seniority && a.removal?.by == b.removal?.by && a.removal?.atMs == b.removal?.atMs
            && a.removal?.cutoff == b.removal?.cutoff && a.removal?.cutoffHash == b.removal?.cutoffHash
    }

    /// Whether this member's entries up to `last` are accepted: all of a current member's; a removed one's up to
    /// its cutoff, and then only the entry it signed there (`hashAt` gives the hash of an entry at a sequence, nil
    /// when that entry is not at hand; the chain links every earlier one to it).
    public func acceptsEntries(upTo last: UInt64, hashAt: (UInt64) -> [UInt8]?) -> Bool {
        guard let removal else { return true }
        guard last <= removal.cutoff else { return false }
        guard let expected = removal.cutoffHash, let hash = hashAt(removal.cutoff) else { return true }
        return hash == expected
    }
}

/// The membership of a space resolved from its log: a pure function of the set of operations held, so every device
/// holding the same operations computes the same members, roles, removals and epochs, whatever order they arrived
/// in (SYNC.md §9).
///
/// Operations are applied in a topological order of their parent links; among operations ready at the same time
/// (concurrent ones), the one whose author is the most senior admin goes first, then the lowest hash. An operation
/// takes effect only if, at that point, its author is a current admin and it is valid there; otherwise it is void.
/// So when two admins remove each other concurrently, the senior one's removal applies and the junior one's is void.
public struct MembershipState: Sendable {
    /// The space.
    public let space: SpaceID
    /// Every device ever added (removed ones stay, with their removal), by node id hex.
    public private(set) var members: [String: Member] = [:]
    /// Hashes of the operations that took effect, in the order applied.
    public private(set) var applied: [EntryHash] = []
    /// Hashes of every operation processed (applied or void), in order.
    public private(set) var order: [EntryHash] = []
    /// Operations that were void, with the reason.
    public private(set) var void: [EntryHash: String] = [:]
    /// Operations waiting for a parent not held yet.
    public private(set) var waiting: Set<EntryHash> = []
    /// The applied operations no other applied operation names as a parent: the parents of the next operation made
    /// here. A void operation is never a head, so operations nobody could apply (a reader's, a removed admin's after
    /// its removal) cannot grow the parents of every later admin operation past `MembershipOp.maxParents`.
    public private(set) var heads: [EntryHash] = []
    /// Every epoch key created by an applied operation.
    public private(set) var epochKeys: [EpochKeyID] = []
    /// The latest epoch keys: those no later key was created with knowledge of. One in a quiet log; several after
    /// concurrent rotations, whose combination is the current key (`currentEpoch`).
    public private(set) var frontier: [EpochKeyID] = []
    /// Envelopes of applied operations, with their key resolved (an envelope naming its own operation resolved to it).
    public private(set) var envelopes: [(envelope: KeyEnvelope, key: EpochKeyID)] = []
    /// Whether the log commits to its keys and its removals' cutoffs: its create is version 2 (SYNC.md §9,
    /// "Logs that commit"). In such a log a remove that does not is void, and a key is taken only as committed.
    public private(set) var commitsKeys = false
    /// The commitment of each key whose operation published one (`KeyEnvelope.commitment`).
    private(set) var commitments: [EpochKeyID: [UInt8]] = [:]
    /// Every set of concurrent latest keys that was ever combined into one epoch (at a rotation made while they were
    /// concurrent, and the current frontier): entries sealed under those combined epochs stay readable.
    public private(set) var combinations: [[EpochKeyID]] = []
    /// The sets combined at rotations, in order (`combinations` without the current frontier).
    private var rotationCombinations: [[EpochKeyID]] = []
    /// Per operation processed, the latest epoch keys known after it (the key it created, for a rotation).
    private var latestAfter: [EntryHash: Set<EpochKeyID>] = [:]
    /// Per epoch key, every key created before it in its creator's knowledge.
    private var ancestors: [EpochKeyID: Set<EpochKeyID>] = [:]
    /// The next member's seniority.
    private var seniorityCounter = 0
    /// The operations processed (applied or void) that no processed operation names: every other one is in their
    /// past, so an operation naming all of them ranks after everything (`extended(by:)`).
    private var tips: Set<EntryHash> = []

    /// The epoch new entries are sealed with: the single latest key's, or one past the latest when concurrent
    /// rotations are combined.
    public var currentEpoch: Epoch { Self.epoch(of: frontier) }

    /// The epoch a set of latest keys seals under: the key's own, or one past the highest when they are combined.
    static func epoch(of keys: [EpochKeyID]) -> Epoch {
        keys.count == 1 ? keys[0].epoch : (keys.map(\.epoch).max() ?? 0).next
    }

    /// The current members (not removed).
    public var current: [Member] { members.values.filter(\.isCurrent).sorted { $0.seniority < $1.seniority } }

    /// The member with node id `node`, removed or not.
    public func member(_ node: [UInt8]) -> Member? { members[hexString(node)] }

    /// The operations that prove `device` was removed, from `ops` (this log's, by hash): the applied removal of it and
    /// all that operation's past, nothing later. Empty when the log does not remove it.
    public func proofOfRemoval(of device: [UInt8], ops: [EntryHash: MembershipOp]) -> [MembershipOp] {
        guard
            let removal = applied.compactMap({ ops[$0] }).first(where: {
                if case .remove(let d, _, _) = $0.action { return d == device } else { return false }
            })
        else { return [] }
        return Self.withPast(removal, ops: ops)
    }

    /// True when entries of `origin` up to `seq` are accepted: a writing member, or a removed writing member's entries
    /// up to its removal's cutoff.
    public func acceptsEntry(origin: [UInt8], seq: UInt64) -> Bool {
        guard let m = member(origin), m.role.writes else { return false }
        return m.removal.map { seq <= $0.cutoff } ?? true
    }

    /// True when a batch of `origin`'s entries ending at `head` is accepted (`Member.acceptsEntries`): a writing
    /// member's, or a removed one's up to its cutoff and through the entry it signed there.
    public func acceptsBatch(origin: [UInt8], head: UInt64, hashAt: (UInt64) -> [UInt8]?) -> Bool {
        guard let m = member(origin), m.role.writes else { return false }
        return m.acceptsEntries(upTo: head, hashAt: hashAt)
    }

    /// Resolves `ops` (any order, duplicates ignored) for `space`.
    public init(space: SpaceID, ops: [MembershipOp]) {
        self.init(space: space, ops: ops, linearChoice: false)
    }

    /// Among operations ready at the same time, the next is the one whose author ranks first (seniority; not a member
    /// yet ranks last), then the lowest hash. With `linearChoice` each choice scans every ready operation, as
    /// versions before the heap did: the tests' reference for the order every version must agree on.
    package init(space: SpaceID, ops: [MembershipOp], linearChoice: Bool) {
        self.space = space
        var byHash: [EntryHash: MembershipOp] = [:]
        for op in ops where op.space == space { byHash[op.hash] = op }
        var children: [EntryHash: [EntryHash]] = [:]
        var missing: [EntryHash: Int] = [:]
        for (hash, op) in byHash {
            missing[hash] = op.parents.count
            for p in op.parents { children[p, default: []].append(hash) }
        }
        var done = Set<EntryHash>()
        // Each author's node id once (hashing it in every comparison made the choice quadratic in concurrent ops).
        let authors = byHash.mapValues { $0.author.nodeIDHex }
        var choice = ReadyOps(linear: linearChoice)
        for op in byHash.values where op.parents.isEmpty { choice.add(op.hash, author: authors[op.hash]!, members: members) }

        while let hash = choice.next(members: members, done: done) {
            let op = byHash[hash]!
            done.insert(op.hash)
            let memberCount = members.count
            process(op)
            // A member added here ranks its waiting operations from now on.
            if members.count != memberCount, let added = Self.addedDevice(op) { choice.ranked(added, members: members) }
            for child in children[op.hash] ?? [] {
                missing[child]! -= 1
                if missing[child] == 0, byHash[child] != nil { choice.add(child, author: authors[child]!, members: members) }
            }
        }
        let namedByApplied = Set(applied.flatMap { byHash[$0]?.parents ?? [] })
        heads = applied.filter { !namedByApplied.contains($0) }.sorted()
        let namedByProcessed = Set(order.flatMap { byHash[$0]?.parents ?? [] })
        tips = Set(order.filter { !namedByProcessed.contains($0) })
        waiting = Set(byHash.keys).subtracting(done)
        finish()
    }

    /// This resolution with `ops` added, computed from it without resolving the log again, or nil when that cannot be
    /// done: some operation waits for its parents, or one of `ops` (taken in order) does not name every operation
    /// processed so far that nothing names yet. Such an operation has everything held in its past, so every
    /// topological order puts it last, whatever the rules among concurrent ones: applying it to this state gives
    /// exactly the full resolution of the log with it (`anExtendedResolutionIsTheFullOne`). The common case: an
    /// admin's operation, naming the log's heads, arriving at a member that holds the rest.
    public func extended(by ops: [MembershipOp]) -> MembershipState? {
        guard waiting.isEmpty, !order.isEmpty else { return nil }
        var s = self
        for op in ops {
            guard op.space == space, s.latestAfter[op.hash] == nil, s.tips.isSubset(of: op.parents),
                op.parents.allSatisfy({ s.latestAfter[$0] != nil })
            else { return nil }
            s.process(op)
            s.tips.subtract(op.parents)
            s.tips.insert(op.hash)
            if s.void[op.hash] == nil {
                s.heads = (s.heads.filter { !op.parents.contains($0) } + [op.hash]).sorted()
            }
        }
        s.finish()
        return s
    }

    /// Whether the operation hashed `hash` was resolved here (applied or void) or waits for its parents.
    public func holds(_ hash: EntryHash) -> Bool { latestAfter[hash] != nil || waiting.contains(hash) }

    /// Whether the operation hashed `hash` took effect here.
    public func isApplied(_ hash: EntryHash) -> Bool { latestAfter[hash] != nil && void[hash] == nil }

    /// The latest keys among `keys`: those no other one of them was created knowing.
    private func maximal(_ keys: Set<EpochKeyID>) -> Set<EpochKeyID> {
        keys.filter { k in !keys.contains { other in other != k && ancestors[other]?.contains(k) == true } }
    }

    /// Processes the next operation of the order: applies it, or records why it is void.
    private mutating func process(_ op: MembershipOp) {
        order.append(op.hash)
        let before = maximal(op.parents.reduce(into: Set<EpochKeyID>()) { $0.formUnion(latestAfter[$1] ?? []) })
        var after = before
        var seniority = seniorityCounter
        let refused = apply(op, knownKeys: before, seniority: &seniority)
        seniorityCounter = seniority
        if let reason = refused {
            void[op.hash] = reason
        } else {
            applied.append(op.hash)
            if let created = createdKey(op) {
                if before.count > 1 { rotationCombinations.append(before.sorted { $0.op < $1.op }) }
                ancestors[created] = before.reduce(into: before) { $0.formUnion(ancestors[$1] ?? []) }
                epochKeys.append(created)
                after = [created]
            }
            for e in op.envelopes {
                envelopes.append((e, EpochKeyID(epoch: e.epoch, op: e.keyOp == KeyEnvelope.thisOp ? op.hash : e.keyOp)))
            }
        }
        latestAfter[op.hash] = after
    }

    /// The latest keys and the combinations, once the operations are processed.
    private mutating func finish() {
        frontier = maximal(Set(epochKeys)).sorted { $0.op < $1.op }
        var seen = Set<[EpochKeyID]>()
        combinations = (rotationCombinations + (frontier.count > 1 ? [frontier] : [])).filter { seen.insert($0).inserted }
    }

    /// The node id (hex) of the device an operation adds to the members when it applies: the creator, or the added one.
    private static func addedDevice(_ op: MembershipOp) -> String? {
        switch op.action {
        case .create: op.author.nodeIDHex
        case .add(let device, _): device.nodeIDHex
        case .remove, .grant: nil
        }
    }

    /// The key an applied operation created, if any.
    private func createdKey(_ op: MembershipOp) -> EpochKeyID? {
        switch op.action {
        case .create: EpochKeyID(epoch: 1, op: op.hash)
        case .remove(_, _, let epoch): EpochKeyID(epoch: epoch, op: op.hash)
        case .add, .grant: nil
        }
    }

    /// Applies `op` if it is valid here; returns why not otherwise.
    private mutating func apply(_ op: MembershipOp, knownKeys: Set<EpochKeyID>, seniority: inout Int) -> String? {
        let author = op.author.nodeIDHex
        if case .create(let salt) = op.action {
            guard op.parents.isEmpty, members.isEmpty else { return "a second create" }
            guard MembershipOp.spaceID(creator: op.author, salt: salt) == space else { return "a create of another space" }
            members[author] = Member(keys: op.author, role: .admin, addedBy: nil, addedAtMs: op.timeMs, seniority: seniority)
            seniority += 1
            commitsKeys = op.version == 2
            if let c = op.commitment { commitments[EpochKeyID(epoch: 1, op: op.hash)] = c }
            return nil
        }
        guard let signer = members[author], signer.isCurrent, signer.keys == op.author else { return "author is not a member" }
        guard signer.role == .admin else { return "author is not an admin" }
        switch op.action {
        case .create:
            return "a second create"
        case .add(let device, let role):
            guard members[device.nodeIDHex] == nil else { return "device was already added" }
            members[device.nodeIDHex] = Member(
                keys: device, role: role, addedBy: signer.keys.nodeID, addedAtMs: op.timeMs, seniority: seniority)
            seniority += 1
        case .remove(let device, let cutoff, let epoch):
            let target = hexString(device)
            guard var removed = members[target] else { return "device is not a member" }
            let known = Array(knownKeys)
            guard epoch == Self.epoch(of: known).next else { return "epoch is not one past the author's latest" }
            guard op.version == 2 || !commitsKeys else { return "a rotation without its key's commitment" }
            if let head = op.cutoffHead, head.publicKey != removed.keys.signing { return "a cutoff its device never signed" }
            if let c = op.commitment { commitments[EpochKeyID(epoch: epoch, op: op.hash)] = c }
            // A concurrent removal of the same device went first: this one keeps that removal (and its cutoff) and
            // only rotates, so entries its author sealed with the new key stay readable.
            guard removed.isCurrent else { return nil }
            guard members.values.contains(where: { $0.isCurrent && $0.role == .admin && $0.keys != removed.keys }) else {
                return "it would leave no admin"
            }
            removed.removal = (signer.keys.nodeID, op.timeMs, cutoff, op.cutoffHead?.hash)
            members[target] = removed
        case .grant:
            break
        }
        return nil
    }

    /// The epoch keys current members were never sealed, member by member: a device added concurrently with a
    /// rotation gets no envelope from the rotation (its author did not know the device), nor from its own `add` (that
    /// author did not know the key). A current admin holding such a key delivers it with a `grant` (SYNC.md §9).
    public var missingKeys: [(member: Member, keys: [EpochKeyID])] {
        var delivered: [String: Set<EpochKeyID>] = [:]
        for (envelope, key) in envelopes { delivered[hexString(envelope.recipient), default: []].insert(key) }
        let genesis = epochKeys.first { $0.epoch == 1 }
        return current.compactMap { m in
            let have = delivered[m.keys.nodeIDHex] ?? []
            // The creator made the genesis key; it needs no envelope for it.
            let missing = epochKeys.filter { !have.contains($0) && !(m.addedBy == nil && $0 == genesis) }
            return missing.isEmpty ? nil : (m, missing)
        }
    }
}
