import BlazeCrypto
import BlazeProtocol
import NIOPosix

/// Each space's membership log as this relay process holds it (SYNC.md §9): read and resolved once, off the event
/// loops, grown by merges, forgotten when another process stores operations.
extension RelayServer {
    /// The resolved log of `space`, nil while it holds none.
    func membership(_ space: SpaceID) async throws -> MembershipState? { try await heldLog(space)?.state }

    /// The log of `space` as this process holds it (nil while the space has none), read from the store and resolved
    /// once, off the event loops, then kept until it grows: a merge or a device's catch-up does not read, verify and
    /// resolve every operation again.
    func heldLog(_ space: SpaceID) async throws -> HeldLog? {
        let id = space.hex
        let (cached, forgotten) = logs.withLock { ($0.held[id], $0.forgotten) }
        if let cached { return cached }
        let ops = try await store.ops(space: space)
        guard !ops.isEmpty else { return nil }
        let state = try await NIOThreadPool.singleton.runIfActive { MembershipState(space: space, ops: ops) }
        let log = HeldLog(ops: ops, state: state, version: logVersions.add(1, ordering: .relaxed).newValue)
        logs.withLock { if $0.forgotten == forgotten && $0.held[id] == nil { $0.held[id] = log } }
        return log
    }

    /// The resolved log of `space` if this process holds it now (nil: not read yet, or none), without waiting.
    func cachedMembership(_ space: SpaceID) -> MembershipState? { logs.withLock { $0.held[space.hex]?.state } }

    /// Forgets the log of `space` held here (another process stored operations, or the space was dropped).
    func forgetLog(_ space: SpaceID) {
        logs.withLock { $0 = ($0.held.filter { $0.key != space.hex }, $0.forgotten + 1) }
    }

    /// Stores the operations of `ops` that members keep (`MembershipLog.kept`, SYNC.md §9: anyone holding the
    /// capability, and every device the log ever added, could send others, which could never take effect), deciding
    /// off the event loops. Returns whether the log grew, and `aside` (what the connection's device sent and was not
    /// kept) updated. The log held here becomes the grown one when nothing else changed it meanwhile.
    func merge(_ ops: [MembershipOp], space: SpaceID, aside: SetAsideOps) async throws -> (grew: Bool, aside: SetAsideOps) {
        let forgotten = logs.withLock { $0.forgotten }
        let base = try await heldLog(space)
        let held = base?.ops ?? [], state = base?.state, setAside = aside.ops
        let (kept, resolved, dropped) = try await NIOThreadPool.singleton.runIfActive {
            MembershipLog.taken(ops, held: held, space: space, resolvedHeld: state, aside: setAside)
        }
        var aside = aside
        aside.update(kept: kept, dropped: dropped)
        let fresh = try await store.addOps(kept, space: space)
        guard !fresh.isEmpty else { return (false, aside) }
        let id = space.hex
        let grown = resolved.map { HeldLog(ops: held + kept, state: $0, version: logVersions.add(1, ordering: .relaxed).newValue) }
        logs.withLock { l in
            if fresh.count == kept.count, let grown, l.held[id]?.version == base?.version, base != nil || l.forgotten == forgotten {
                l.held[id] = grown
            } else {
                l = (l.held.filter { $0.key != id }, l.forgotten + 1)
            }
        }
        return (true, aside)
    }
}

/// A space's membership log as one relay process holds it: its operations and their resolution.
struct HeldLog: Sendable {
    /// The operations stored.
    let ops: [MembershipOp]
    /// Their resolution.
    let state: MembershipState
    /// Which reading or merge made it (`RelayServer.merge` replaces only the log it started from).
    let version: UInt64
}
