import BlazeProtocol

/// What a space's log keeps of the operations it is sent (SYNC.md §9, "What the log keeps"): the same rule on every
/// member and on the relay, so that no device holding a key the log once added (a reader, a writer, a removed admin)
/// can grow every member's log with operations that never take effect.
public enum MembershipLog {
    /// Most operations a log holds in all.
    public static let maxOps = 100_000
    /// Most operations of one author a log holds: a removed admin can still sign operations its removal's senior
    /// position lets through (concurrent with its removal), so each author's share is bounded.
    public static let maxOpsPerAuthor = 10_000
    /// Most bytes of one author's operations a log holds.
    public static let maxBytesPerAuthor = 64 << 20

    /// The operations of `incoming` that a log holding `held` keeps, in `incoming`'s order: new ones of `space` whose
    /// author the log with them makes an admin (removed or not: only an admin's operation can ever take effect), or
    /// that a kept admin operation names as a parent (a log written before this rule may have named others), within
    /// `maxOps` and each author's quota. `resolvedHeld` is `held` resolved, when the caller has it.
    ///
    /// Operations whose author is no admin in `held` and whom no incoming `add` makes one are set aside before the log
    /// is resolved with the rest, so a flood of them costs a hash each, not a resolution.
    public static func kept(
        _ incoming: [MembershipOp], held: [MembershipOp], space: [UInt8], resolvedHeld: MembershipState? = nil
    ) -> [MembershipOp] {
        var known = Set(held.map(\.hash))
        var arrived: [MembershipOp] = []
        for op in incoming where op.space == space && known.insert(op.hash).inserted { arrived.append(op) }
        guard !arrived.isEmpty, held.count < maxOps else { return [] }
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
        // What an arrived admin operation, or a held one still waiting, names as a parent may be anyone's.
        var named = Set(arrived.filter(mayBeAdmin).flatMap(\.parents))
        if !before.waiting.isEmpty {
            let byHash = Dictionary(held.map { ($0.hash, $0) }, uniquingKeysWith: { a, _ in a })
            for hash in before.waiting { named.formUnion(byHash[hash]?.parents ?? []) }
        }
        let fresh = arrived.filter { mayBeAdmin($0) || named.contains($0.hash) }
        guard !fresh.isEmpty else { return [] }
        let resolved = MembershipState(space: space, ops: held + fresh)
        func isAdmin(_ op: MembershipOp) -> Bool {
            guard let m = resolved.member(op.author.nodeID) else { return false }
            return m.keys == op.author && m.role == .admin
        }
        let parentsOfAdmins = Set((held + fresh).filter(isAdmin).flatMap(\.parents))
        var count = held.count
        var usage: [[UInt8]: (ops: Int, bytes: Int)] = [:]
        for op in held { usage[op.author.signing, default: (0, 0)].ops += 1; usage[op.author.signing]!.bytes += op.bytes.count }
        var kept: [MembershipOp] = []
        for op in fresh where count < maxOps && (isAdmin(op) || parentsOfAdmins.contains(op.hash)) {
            let used = usage[op.author.signing, default: (0, 0)]
            guard used.ops < maxOpsPerAuthor, used.bytes + op.bytes.count <= maxBytesPerAuthor else { continue }
            usage[op.author.signing] = (used.ops + 1, used.bytes + op.bytes.count)
            count += 1
            kept.append(op)
        }
        return kept
    }
}
