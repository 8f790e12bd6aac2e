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
        _ incoming: [MembershipOp], held: [MembershipOp], space: [UInt8], resolvedHeld: MembershipState? = nil
    ) -> [MembershipOp] {
        taken(incoming, held: held, space: space, resolvedHeld: resolvedHeld).kept
    }

    /// `kept(_:held:space:resolvedHeld:)`, with the log resolved once the kept operations are added (nil when none
    /// is): the resolution made to decide is reused when every candidate was kept, so a merge resolves once, not twice.
    public static func taken(
        _ incoming: [MembershipOp], held: [MembershipOp], space: [UInt8], resolvedHeld: MembershipState? = nil
    ) -> (kept: [MembershipOp], resolved: MembershipState?) {
        var known = Set(held.map(\.hash))
        var arrived: [MembershipOp] = []
        for op in incoming where op.space == space && known.insert(op.hash).inserted { arrived.append(op) }
        guard !arrived.isEmpty else { return ([], nil) }
        let before = resolvedHeld ?? MembershipState(space: space, ops: held)
        var promoted = Set<[UInt8]>()
        for op in arrived {
            switch op.action {
            case .create: promoted.insert(op.author.signing)
            case .add(let device, .admin): promoted.insert(device.signing)
            default: break
            }
        }
        func mayBeAdmin(_ op: MembershipOp) -> Bool {
            if promoted.contains(op.author.signing) { return true }
            guard let m = before.member(op.author.nodeID) else { return false }
            return m.keys == op.author && m.role == .admin
        }
        let arrivedByHash = Dictionary(arrived.map { ($0.hash, $0) }, uniquingKeysWith: { a, _ in a })
        let heldByHash = before.waiting.isEmpty ? [:] : Dictionary(held.map { ($0.hash, $0) }, uniquingKeysWith: { a, _ in a })
        /// The arrived operations in the past of `roots` (through arrived operations: held ones have their past held).
        func past(of roots: some Sequence<[UInt8]>) -> Set<[UInt8]> {
            var seen = Set<[UInt8]>()
            var stack = roots.flatMap { (arrivedByHash[$0] ?? heldByHash[$0])?.parents ?? [] }
            while let hash = stack.popLast() {
                guard let op = arrivedByHash[hash], seen.insert(hash).inserted else { continue }
                stack += op.parents
            }
            return seen
        }
        let candidates = arrived.filter(mayBeAdmin)
        let pulled = past(of: candidates.map(\.hash) + before.waiting)
        let fresh = arrived.filter { mayBeAdmin($0) || pulled.contains($0.hash) }
        guard !fresh.isEmpty else { return ([], nil) }
        let resolved = MembershipState(space: space, ops: held + fresh)
        func isAdmin(_ op: MembershipOp) -> Bool {
            guard let m = resolved.member(op.author.nodeID) else { return false }
            return m.keys == op.author && m.role == .admin
        }
        let applied = Set(resolved.applied)
        let needed = past(of: resolved.applied.filter { arrivedByHash[$0] != nil } + before.waiting)
        // The remaining admin operations, each with the arrived past only it brings (charged to its author).
        // One walk over them all: an operation reached first from one admin's operation is on that admin's account.
        var account: [[UInt8]: [UInt8]] = [:]
        for op in fresh where isAdmin(op) && !applied.contains(op.hash) && !needed.contains(op.hash) {
            guard account[op.hash] == nil else { continue }
            account[op.hash] = op.author.signing
            var stack = op.parents
            while let hash = stack.popLast() {
                guard let parent = arrivedByHash[hash], account[hash] == nil, !applied.contains(hash), !needed.contains(hash)
                else { continue }
                account[hash] = op.author.signing
                stack += parent.parents
            }
        }
        // What held operations that do not take effect already use.
        var count = before.void.count + before.waiting.count
        var usage: [[UInt8]: (ops: Int, bytes: Int)] = [:]
        for op in held where before.void[op.hash] != nil || before.waiting.contains(op.hash) {
            usage[op.author.signing, default: (0, 0)].ops += 1
            usage[op.author.signing]!.bytes += op.bytes.count
        }
        var kept: [MembershipOp] = []
        for op in fresh {
            if applied.contains(op.hash) || needed.contains(op.hash) {
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
        guard !kept.isEmpty else { return ([], nil) }
        return (kept, kept.count == fresh.count ? resolved : MembershipState(space: space, ops: held + kept))
    }
}
