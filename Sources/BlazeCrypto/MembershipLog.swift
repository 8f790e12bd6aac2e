import BlazeProtocol

/// What a space's log keeps of the operations it is sent (SYNC.md §9, "What the log keeps"): the same rule on every
/// member and on the relay, so that no device holding a key the log once added (a reader, a writer, a removed admin)
/// can grow every member's log with operations that never take effect.
public enum MembershipLog {
    /// Most operations a log holds that do not take effect (void, or waiting for a parent), in all.
    public static let maxOps = 100_000
    /// Most operations that do not take effect a log holds on one author's account: a removed admin can still sign
    /// operations concurrent with its removal, so each author's share is bounded.
    public static let maxOpsPerAuthor = 10_000
    /// Most bytes of such operations on one author's account.
    public static let maxBytesPerAuthor = 64 << 20

    /// The operations of `incoming` that a log holding `held` keeps, in `incoming`'s order (SYNC.md §9, "What the log
    /// keeps"). `resolvedHeld` is `held` resolved, when the caller has it.
    ///
    /// - Every operation that takes effect in the log with the new ones, and everything in its past, is kept: an
    ///   admin's work is never dropped, whatever its size.
    /// - So is the past of a held operation still waiting for its parents (it may name anyone's operation: logs
    ///   written before this rule did).
    /// - Another operation is kept only when its author is an admin there (removed or not) or an admin's kept
    ///   operation has it in its past; these count against that admin's quota (`maxOpsPerAuthor`,
    ///   `maxBytesPerAuthor`) and the log's (`maxOps`).
    ///
    /// Operations of authors who are no admin in `held`, whom no incoming `create` or `add` makes one, and that no
    /// candidate or waiting operation has in its past, are set aside before the log is resolved: a flood of them costs
    /// a hash each, not a resolution.
    public static func kept(
        _ incoming: [MembershipOp], held: [MembershipOp], space: SpaceID, resolvedHeld: MembershipState? = nil
    ) -> [MembershipOp] {
        taken(incoming, held: held, space: space, resolvedHeld: resolvedHeld).kept
    }

    /// `kept(_:held:space:resolvedHeld:)`, with the log resolved once the kept operations are added (nil when none
    /// is): the resolution made to decide is reused when every candidate was kept, so a merge resolves once, not twice.
    ///
    /// `aside` holds operations the same sender sent before that were not kept then (`dropped`): one that an arrived
    /// operation, or a held one still waiting, has in its past is taken again as if it arrived now. A sender marks
    /// what it sent as held by the receiver, so within one exchange it never sends those again; an admin's operation
    /// naming one (a log written before this rule) would otherwise wait for it until the next connection.
    public static func taken(
        _ incoming: [MembershipOp], held: [MembershipOp], space: SpaceID, resolvedHeld: MembershipState? = nil,
        aside: [EntryHash: MembershipOp] = [:]
    ) -> (kept: [MembershipOp], resolved: MembershipState?, dropped: [MembershipOp]) {
        // Whether an operation is held: the resolution of `held` says so, without hashing the whole log again.
        let heldHashes = resolvedHeld == nil ? Set(held.map(\.hash)) : nil
        var seen = Set<EntryHash>()
        func isNew(_ hash: EntryHash) -> Bool {
            !(heldHashes?.contains(hash) ?? resolvedHeld!.holds(hash)) && seen.insert(hash).inserted
        }
        var arrived: [MembershipOp] = []
        for op in incoming where op.space == space && isNew(op.hash) { arrived.append(op) }
        guard !arrived.isEmpty else { return ([], nil, []) }
        let before = resolvedHeld ?? MembershipState(space: space, ops: held)
        if !aside.isEmpty {
            let waitingHeld = before.waiting.isEmpty ? [] : held.filter { before.waiting.contains($0.hash) }
            var stack = (arrived + waitingHeld).flatMap(\.parents)
            var again: [MembershipOp] = []
            while let hash = stack.popLast() {
                guard let op = aside[hash], op.space == space, isNew(hash) else { continue }
                again.append(op)
                stack += op.parents
            }
            arrived = again.reversed() + arrived
        }
        // Keys an arrived operation may make an admin: the creator of this very space (only while the log holds no
        // one: its id binds the creator's key), and a device an admin (or such a key) adds as one, in arrival order
        // (parents come first). Anything else claiming to promote a key is ignored here, so a stranger's own
        // operations never become candidates whose signatures and past are checked.
        var promoted = Set<[UInt8]>()
        func mayBeAdmin(_ op: MembershipOp) -> Bool {
            if promoted.contains(op.author.signing) { return true }
            guard let m = before.member(op.author.nodeID) else { return false }
            return m.keys == op.author && m.role == .admin
        }
        for op in arrived {
            switch op.action {
            case .create(let salt) where before.members.isEmpty && MembershipOp.spaceID(creator: op.author, salt: salt) == space:
                promoted.insert(op.author.signing)
            case .add(let device, .admin) where mayBeAdmin(op):
                promoted.insert(device.signing)
            default: break
            }
        }
        let arrivedByHash = Dictionary(arrived.map { ($0.hash, $0) }, uniquingKeysWith: { a, _ in a })
        let heldByHash = before.waiting.isEmpty ? [:] : Dictionary(held.map { ($0.hash, $0) }, uniquingKeysWith: { a, _ in a })
        /// The arrived operations in the past of `roots` (through arrived operations: held ones have their past held).
        func past(of roots: some Sequence<EntryHash>) -> Set<EntryHash> {
            var seen = Set<EntryHash>()
            var stack = roots.flatMap { (arrivedByHash[$0] ?? heldByHash[$0])?.parents ?? [] }
            while let hash = stack.popLast() {
                guard let op = arrivedByHash[hash], seen.insert(hash).inserted else { continue }
                stack += op.parents
            }
            return seen
        }
        // Signatures are checked here, for what could be kept only (`MembershipOp(unverified:)`): an operation
        // claiming an admin's key that does not verify pulls nothing in.
        let candidates = arrived.filter { mayBeAdmin($0) && $0.signaturesVerify }
        let candidateHashes = Set(candidates.map(\.hash))
        let pulled = past(of: candidates.map(\.hash) + before.waiting)
        let fresh = arrived.filter { candidateHashes.contains($0.hash) || (pulled.contains($0.hash) && $0.signaturesVerify) }
        guard !fresh.isEmpty else { return ([], nil, arrived) }
        // Usually an admin's operations extend the log at its end: then the resolution is the held one's, extended.
        let resolved = before.extended(by: fresh) ?? MembershipState(space: space, ops: held + fresh)
        func isAdmin(_ op: MembershipOp) -> Bool {
            guard let m = resolved.member(op.author.nodeID) else { return false }
            return m.keys == op.author && m.role == .admin
        }
        let needed = past(of: arrived.lazy.map(\.hash).filter(resolved.isApplied) + before.waiting)
        // The remaining admin operations, each with the arrived past only it brings (charged to its author).
        // One walk over them all: an operation reached first from one admin's operation is on that admin's account.
        var account: [EntryHash: [UInt8]] = [:]
        for op in fresh where isAdmin(op) && !resolved.isApplied(op.hash) && !needed.contains(op.hash) {
            guard account[op.hash] == nil else { continue }
            account[op.hash] = op.author.signing
            var stack = op.parents
            while let hash = stack.popLast() {
                guard let parent = arrivedByHash[hash], account[hash] == nil, !resolved.isApplied(hash), !needed.contains(hash)
                else { continue }
                account[hash] = op.author.signing
                stack += parent.parents
            }
        }
        // What held operations that do not take effect already use (read only when some operation is on an account).
        var count = before.void.count + before.waiting.count
        var usage: [[UInt8]: (ops: Int, bytes: Int)] = [:]
        if !account.isEmpty {
            for op in held where before.void[op.hash] != nil || before.waiting.contains(op.hash) {
                usage[op.author.signing, default: (0, 0)].ops += 1
                usage[op.author.signing]!.bytes += op.bytes.count
            }
        }
        var kept: [MembershipOp] = []
        for op in fresh {
            if resolved.isApplied(op.hash) || needed.contains(op.hash) {
                kept.append(op)
                continue
            }
            guard let payer = account[op.hash], count < maxOps else { continue }
            let used = usage[payer, default: (0, 0)]
            guard used.ops < maxOpsPerAuthor, used.bytes + op.bytes.count <= maxBytesPerAuthor else { continue }
            usage[payer] = (used.ops + 1, used.bytes + op.bytes.count)
            count += 1
            kept.append(op)
        }
        let keptHashes = Set(kept.map(\.hash))
        let dropped = arrived.filter { !keptHashes.contains($0.hash) }
        guard !kept.isEmpty else { return ([], nil, dropped) }
        let resolvedKept = kept.count == fresh.count ? resolved : before.extended(by: kept) ?? MembershipState(space: space, ops: held + kept)
        return (kept, resolvedKept, dropped)
    }
}

/// The operations one sender sent that a log did not keep, held for the rest of the exchange so that a later operation
/// naming one takes it (`MembershipLog.taken(_:held:space:resolvedHeld:aside:)`). Bounded: the oldest go first, and
/// a new connection sends everything again anyway.
public struct SetAsideOps: Sendable {
    /// Most operations held, by default.
    public static let maxOps = 1_024
    /// Most bytes of operations held, by default.
    public static let maxBytes = 4 << 20

    /// The operations held, by hash.
    public private(set) var ops: [EntryHash: MembershipOp] = [:]
    /// Hashes in the order they were set aside, oldest first (may name operations taken since).
    private var order: [EntryHash] = []
    /// Bytes of the operations held.
    private var bytes = 0
    /// This one's bounds.
    private let most: (ops: Int, bytes: Int)

    /// None held, at most `maxOps` operations and `maxBytes` bytes.
    public init(maxOps: Int = SetAsideOps.maxOps, maxBytes: Int = SetAsideOps.maxBytes) {
        most = (maxOps, maxBytes)
    }

    /// Forgets what a merge kept and holds what it dropped, evicting the oldest past the bounds. An operation held
    /// already that a merge took again and dropped again goes: each is tried again once, so operations that name a
    /// chain of them cost its checks once, not at every message.
    public mutating func update(kept: [MembershipOp], dropped: [MembershipOp]) {
        for op in kept {
            if let gone = ops.removeValue(forKey: op.hash) { bytes -= gone.bytes.count }
        }
        for op in dropped where op.bytes.count <= most.bytes {
            if let gone = ops.removeValue(forKey: op.hash) {
                bytes -= gone.bytes.count
                continue
            }
            ops[op.hash] = op
            order.append(op.hash)
            bytes += op.bytes.count
        }
        var first = 0
        while ops.count > most.ops || bytes > most.bytes, first < order.count {
            if let gone = ops.removeValue(forKey: order[first]) { bytes -= gone.bytes.count }
            first += 1
        }
        if first > 0 || order.count > 2 * most.ops {
            order = order[first...].filter { ops[$0] != nil }
        }
    }
}
