import BlazeProtocol
import Crypto

/// A key of one epoch, named by the operation that created it (the log's `create` for epoch 1, else a `remove`).
public struct EpochKeyID: Sendable, Hashable {
    /// The epoch number entries carry in their header.
    public let epoch: UInt32
    /// Hash of the operation that created the key.
    public let op: [UInt8]

    /// The key of `epoch` that the operation hashed `op` created.
    public init(epoch: UInt32, op: [UInt8]) {
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
    public let space: [UInt8]
    /// Every device ever added (removed ones stay, with their removal), by node id hex.
    public private(set) var members: [String: Member] = [:]
    /// Hashes of the operations that took effect, in the order applied.
    public private(set) var applied: [[UInt8]] = []
    /// Hashes of every operation processed (applied or void), in order.
    public private(set) var order: [[UInt8]] = []
    /// Operations that were void, with the reason.
    public private(set) var void: [[UInt8]: String] = [:]
    /// Operations waiting for a parent not held yet.
    public private(set) var waiting: Set<[UInt8]> = []
    /// The applied operations no other applied operation names as a parent: the parents of the next operation made
    /// here. A void operation is never a head, so operations nobody could apply (a reader's, a removed admin's after
    /// its removal) cannot grow the parents of every later admin operation past `MembershipOp.maxParents`.
    public private(set) var heads: [[UInt8]] = []
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
    private var commitments: [EpochKeyID: [UInt8]] = [:]
    /// Every set of concurrent latest keys that was ever combined into one epoch (at a rotation made while they were
    /// concurrent, and the current frontier): entries sealed under those combined epochs stay readable.
    public private(set) var combinations: [[EpochKeyID]] = []

    /// The epoch new entries are sealed with: the single latest key's, or one past the latest when concurrent
    /// rotations are combined.
    public var currentEpoch: UInt32 { Self.epoch(of: frontier) }

    /// The epoch a set of latest keys seals under: the key's own, or one past the highest when they are combined.
    static func epoch(of keys: [EpochKeyID]) -> UInt32 {
        keys.count == 1 ? keys[0].epoch : (keys.map(\.epoch).max() ?? 0) + 1
    }

    /// The current members (not removed).
    public var current: [Member] { members.values.filter(\.isCurrent).sorted { $0.seniority < $1.seniority } }

    /// The member with node id `node`, removed or not.
    public func member(_ node: [UInt8]) -> Member? { members[hexString(node)] }

    /// The operations that prove `device` was removed, from `ops` (this log's, by hash): the applied removal of it and
    /// all that operation's past, nothing later. Empty when the log does not remove it.
    public func proofOfRemoval(of device: [UInt8], ops: [[UInt8]: MembershipOp]) -> [MembershipOp] {
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
    public init(space: [UInt8], ops: [MembershipOp]) {
        self.init(space: space, ops: ops, linearChoice: false)
    }

    /// Among operations ready at the same time, the next is the one whose author ranks first (seniority; not a member
    /// yet ranks last), then the lowest hash. With `linearChoice` each choice scans every ready operation, as
    /// versions before the heap did: the tests' reference for the order every version must agree on.
    package init(space: [UInt8], ops: [MembershipOp], linearChoice: Bool) {
        self.space = space
        var byHash: [[UInt8]: MembershipOp] = [:]
        for op in ops where op.space == space { byHash[op.hash] = op }
        var children: [[UInt8]: [[UInt8]]] = [:]
        var missing: [[UInt8]: Int] = [:]
        for (hash, op) in byHash {
            missing[hash] = op.parents.count
            for p in op.parents { children[p, default: []].append(hash) }
        }
        // Rotation knowledge per operation: the latest epoch keys in its past (after it, for a rotation itself).
        var latestAfter: [[UInt8]: Set<EpochKeyID>] = [:]
        var ancestors: [EpochKeyID: Set<EpochKeyID>] = [:]
        var done = Set<[UInt8]>()
        var seniorityCounter = 0
        // Each author's node id once (hashing it in every comparison made the choice quadratic in concurrent ops).
        let authors = byHash.mapValues { $0.author.nodeIDHex }
        var choice = ReadyOps(linear: linearChoice)
        for op in byHash.values where op.parents.isEmpty { choice.add(op.hash, author: authors[op.hash]!, members: members) }

        func maximal(_ keys: Set<EpochKeyID>) -> Set<EpochKeyID> {
            keys.filter { k in !keys.contains { other in other != k && ancestors[other]?.contains(k) == true } }
        }

        while let hash = choice.next(members: members, done: done) {
            let op = byHash[hash]!
            done.insert(op.hash)
            let memberCount = members.count
            order.append(op.hash)
            let before = maximal(op.parents.reduce(into: Set<EpochKeyID>()) { $0.formUnion(latestAfter[$1] ?? []) })
            var after = before
            if let reason = apply(op, knownKeys: before, seniority: &seniorityCounter) {
                void[op.hash] = reason
            } else {
                applied.append(op.hash)
                if let created = createdKey(op) {
                    if before.count > 1 { combinations.append(before.sorted { $0.op.lexicographicallyPrecedes($1.op) }) }
                    ancestors[created] = before.reduce(into: before) { $0.formUnion(ancestors[$1] ?? []) }
                    epochKeys.append(created)
                    after = [created]
                }
                for e in op.envelopes {
                    envelopes.append((e, EpochKeyID(epoch: e.epoch, op: e.keyOp == KeyEnvelope.thisOp ? op.hash : e.keyOp)))
                }
            }
            latestAfter[op.hash] = after
            // A member added here ranks its waiting operations from now on.
            if members.count != memberCount, let added = Self.addedDevice(op) { choice.ranked(added, members: members) }
            for child in children[op.hash] ?? [] {
                missing[child]! -= 1
                if missing[child] == 0, byHash[child] != nil { choice.add(child, author: authors[child]!, members: members) }
            }
        }
        let namedByApplied = Set(applied.flatMap { byHash[$0]?.parents ?? [] })
        heads = applied.filter { !namedByApplied.contains($0) }.sorted { $0.lexicographicallyPrecedes($1) }
        waiting = Set(byHash.keys).subtracting(done)
        frontier = maximal(Set(epochKeys)).sorted { $0.op.lexicographicallyPrecedes($1.op) }
        if frontier.count > 1 { combinations.append(frontier) }
        var seen = Set<[EpochKeyID]>()
        combinations = combinations.filter { seen.insert($0).inserted }
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
            guard epoch == Self.epoch(of: known) + 1 else { return "epoch is not one past the author's latest" }
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

    /// The epoch keys `identity` can open from the envelopes addressed to it, plus `initial` (the space's secret at
    /// epoch 1, which the creator and legacy members hold already).
    public func keys(for identity: DeviceIdentity, initial: [UInt8]? = nil) -> [EpochKeyID: [UInt8]] {
        var opened: [KeyEnvelope: [UInt8]] = [:]
        return keys(for: identity, initial: initial, opened: &opened)
    }

    /// `keys(for:initial:)` with the envelopes `identity` opened before, each with what it opened to (empty when it
    /// did not open): an envelope is opened with HPKE once, however often the log is resolved again.
    public func keys(for identity: DeviceIdentity, initial: [UInt8]? = nil, opened: inout [KeyEnvelope: [UInt8]]) -> [EpochKeyID: [UInt8]] {
        var out: [EpochKeyID: [UInt8]] = [:]
        if let initial, let genesis = epochKeys.first(where: { $0.epoch == 1 }), commits(initial, to: genesis) {
            out[genesis] = initial
        }
        let created = Set(epochKeys)
        // Once: a device identity derives its node id from its private key (an Ed25519 scalar multiplication).
        let me = identity.nodeID
        for (envelope, key) in envelopes where envelope.recipient == me && out[key] == nil && created.contains(key) {
            // Only keys an applied operation created are taken (an envelope naming any other operation, or its own
            // `add` or `grant`, delivers nothing), and a key its operation committed to only as committed: an envelope
            // sealing another one (an admin handing this member a key the others do not hold) is ignored.
            let secret = opened[envelope] ?? envelope.open(space: space, identity: identity) ?? []
            opened[envelope] = secret
            if !secret.isEmpty, commits(secret, to: key) { out[key] = secret }
        }
        return out
    }

    /// Whether `secret` is the key `key` names, as far as its operation committed to it (true without a commitment).
    func commits(_ secret: [UInt8], to key: EpochKeyID) -> Bool {
        commitments[key].map { $0 == KeyEnvelope.commitment(secret: secret, space: space, epoch: key.epoch) } ?? true
    }

    /// The secret of the current epoch from `keys`, nil when one of its parts is missing. Concurrent latest keys are
    /// combined (HKDF over their secrets in the order of their operations' hashes), so only a device that received
    /// every one of them, a member of all their recipient sets, can seal or read the combined epoch.
    public func currentSecret(_ keys: [EpochKeyID: [UInt8]]) -> [UInt8]? {
        combined(frontier, keys)
    }

    /// The secret of the epoch that `latest` keys seal under, nil when one of its parts is missing from `keys`.
    func combined(_ latest: [EpochKeyID], _ keys: [EpochKeyID: [UInt8]]) -> [UInt8]? {
        guard !latest.isEmpty else { return nil }
        var parts: [UInt8] = []
        for k in latest {
            guard let secret = keys[k] else { return nil }
            parts += secret
        }
        if latest.count == 1 { return parts }
        var info = Array("blazedb combined epoch v1".utf8)
        info.appendBE(Self.epoch(of: latest))
        return HKDF<SHA256>.deriveKey(inputKeyMaterial: SymmetricKey(data: parts), salt: space, info: info, outputByteCount: 32)
            .withUnsafeBytes { Array($0) }
    }

    /// Every (epoch, secret) that opens entries, from `keys`: each key, and each combination whose parts are all held.
    public func ring(_ keys: [EpochKeyID: [UInt8]]) -> [(epoch: UInt32, secret: [UInt8])] {
        var out = keys.sorted { $0.key.op.lexicographicallyPrecedes($1.key.op) }.map { ($0.key.epoch, $0.value) }
        for set in combinations {
            if let secret = combined(set, keys) { out.append((Self.epoch(of: set), secret)) }
        }
        return out
    }
}
