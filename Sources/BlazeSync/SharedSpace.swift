import BlazeCrypto
import BlazeProtocol
import BlazeStore
import Synchronization

/// What a space's membership allows a device that proved the space's capability in the handshake.
enum Admission: Equatable {
    /// A member (any device in a legacy space, which has no log).
    case member(MemberRole)
    /// Not in the log: a relay, or a device joining with an invite. It receives only ciphertext, and no member
    /// accepts an entry it signs.
    case outsider
    /// Removed from the space: its connections are closed and its handshakes refused.
    case revoked
}

/// One shared database as sync sees it: the database, its space's keys and membership, rebuilt whenever the
/// membership log grows. Sessions read the current `snapshot` each time they seal, open or admit, so a rotation
/// takes effect on every connection at once.
public final class SharedSpace: Sendable {
    /// The database.
    public let db: BlazeDatabase
    /// The space id.
    public let id: SpaceID
    let identity: DeviceIdentity
    private let state: Mutex<Snapshot>
    /// Held by a merge from reading the state to replacing it, so merges do not overlap; the state's own lock is held
    /// only to read or swap it, never while operations are stored or the log resolved (readers on event loops).
    private let merging = Mutex<Void>(())
    /// The invite this device is joining with, until it is a member.
    let joining: Mutex<JoinWait?>

    /// The space's keys and membership at one moment.
    public struct Snapshot: Sendable {
        /// The keys this device holds (the capability only, while joining).
        public let key: SpaceKey
        /// The resolved log; nil for a legacy space (shared with a secret token, no log).
        public let membership: MembershipState?
        /// Every operation held, by hash.
        let ops: [EntryHash: MembershipOp]
        /// The epoch keys this device opened from the log's envelopes.
        let held: [EpochKeyID: [UInt8]]
        /// The legacy key (a space without a log), when held.
        let stored: SpaceKey?
        /// This device's node id.
        let node: [UInt8]
        /// Every envelope to this device opened so far, with what it opened to (empty when it did not open): a later
        /// resolution opens only the new ones.
        var opened: [KeyEnvelope: [UInt8]] = [:]

        /// What the space allows `device`.
        func admits(_ device: DevicePublicKeys) -> Admission {
            guard let membership else { return stored == nil ? .outsider : .member(.writer) }
            guard let m = membership.member(device.nodeID), m.keys == device else { return .outsider }
            return m.isCurrent ? .member(m.role) : .revoked
        }

        /// The operations that prove `device` was removed: the applied removal of it and all that operation's past.
        func proofOfRemoval(of device: [UInt8]) -> [MembershipOp] {
            membership?.proofOfRemoval(of: device, ops: ops) ?? []
        }

        /// Why this device may not write, nil when it may.
        func writeRefusal(db: String) -> String? {
            guard let membership else { return stored == nil ? "database \(db) is still joining its space" : nil }
            return Self.refusal(membership.member(node), db: db)
        }


        static func refusal(_ me: Member?, db: String) -> String? {
            guard let me else { return "this device is not a member of the space of database \(db)" }
            guard me.isCurrent else { return "this device was removed from the space of database \(db)" }
            guard me.role.writes else {
                return "this device is a reader in the space of database \(db): members refuse its writes"
            }
            return nil
        }
    }

    /// Builds the space of `db` from its stored log (every key this device holds is sealed to it there), its legacy
    /// key (a space shared before membership), or the capability alone while joining.
    init(db: BlazeDatabase, id: SpaceID, identity: DeviceIdentity, ops: [MembershipOp], stored: SpaceKey?, capability: [UInt8]?) {
        self.db = db
        self.id = id
        self.identity = identity
        self.joining = Mutex(nil)
        self.state = Mutex(
            Self.resolve(id: id, identity: identity, ops: Dictionary(ops.map { ($0.hash, $0) }, uniquingKeysWith: { a, _ in a }),
                stored: stored, capability: capability))
    }

    /// The current keys and membership.
    public var snapshot: Snapshot { state.withLock { $0 } }

    /// The current keys.
    public var key: SpaceKey { snapshot.key }

    /// Resolves the log into keys and membership.
    static func resolve(
        id: SpaceID, identity: DeviceIdentity, ops: [EntryHash: MembershipOp], stored: SpaceKey?, capability: [UInt8]?,
        resolved: MembershipState? = nil, opened: [KeyEnvelope: [UInt8]] = [:]
    ) -> Snapshot {
        guard !ops.isEmpty else {
            let key = stored ?? (try? SpaceKey(id: id, capability: capability ?? [UInt8](repeating: 0, count: 32)))!
            return Snapshot(key: key, membership: nil, ops: ops, held: [:], stored: stored, node: identity.nodeID)
        }
        let membership = resolved ?? MembershipState(space: id, ops: Array(ops.values))
        let genesisID = membership.epochKeys.first { $0.epoch == 1 }
        var opened = opened
        let held = membership.keys(for: identity, opened: &opened)
        let genesis = genesisID.flatMap { held[$0] }
        let cap = genesis.map { SpaceKey.capability(id: id, genesis: $0) } ?? capability ?? stored?.capability
        let me = membership.member(identity.nodeID)
        let ring = membership.ring(held)
        var epoch = membership.currentEpoch
        var current: [UInt8]? = nil
        if Snapshot.refusal(me, db: "") == nil {
            current = membership.currentSecret(held)
            if current == nil, let latest = ring.max(by: { $0.epoch < $1.epoch }) {
                // A part of the current combination never reached this device: seal under the latest key it holds.
                (epoch, current) = (latest.epoch, latest.secret)
            }
        }
        let key =
            (try? SpaceKey(id: id, capability: cap ?? [UInt8](repeating: 0, count: 32), epoch: epoch, current: current, ring: ring))
            ?? (try! SpaceKey(id: id, capability: [UInt8](repeating: 0, count: 32)))
        return Snapshot(key: key, membership: membership, ops: ops, held: held, stored: stored, node: identity.nodeID, opened: opened)
    }

    /// Adds verified operations of this space; returns those that were new and kept (`MembershipLog.kept`: only
    /// operations an admin signed, or that an admin's operation names, within each author's quota). Anyone holding
    /// the capability, and every device the log ever added, could send others; they could never take effect.
    func merge(_ incoming: [MembershipOp]) -> [MembershipOp] {
        var aside = SetAsideOps()
        return merge(incoming, aside: &aside)
    }

    /// `merge(_:)` for one sender's exchange: `aside` holds what the sender sent before and was not kept, and is
    /// updated with this merge (`MembershipLog.taken(_:held:space:resolvedHeld:aside:)`).
    func merge(_ incoming: [MembershipOp], aside: inout SetAsideOps) -> [MembershipOp] {
        // Storing inside `merge(_:aside:storing:)` cannot fail when nothing is stored.
        (try? merge(incoming, aside: &aside, storing: false)) ?? []
    }

    /// `merge(_:aside:)` for what a peer or a folder sent: with `storing`, the new operations are stored durably
    /// before the space takes them. So no operation of this device's that names one (it takes its parents from the
    /// space) can be stored before it: after a crash the log never holds an operation waiting for a parent only a
    /// hostile peer had. Throws, taking nothing, when they cannot be stored.
    func merge(_ incoming: [MembershipOp], aside: inout SetAsideOps, storing: Bool) throws -> [MembershipOp] {
        let held = aside
        let (db, id, identity) = (self.db, self.id, self.identity)
        let (fresh, dropped): ([MembershipOp], [MembershipOp]) = try merging.withLock { _ in
            let s = state.withLock { $0 }
            // The resolution `taken` decides with is the new log's (one resolution a merge), and envelopes opened
            // before are not opened again.
            let (fresh, resolved, dropped) = MembershipLog.taken(
                incoming, held: Array(s.ops.values), space: id, resolvedHeld: s.membership, aside: held.ops)
            guard !fresh.isEmpty else { return ([], dropped) }
            if storing { _ = try db.addMembershipOps(fresh) }
            var ops = s.ops
            for op in fresh { ops[op.hash] = op }
            let next = Self.resolve(
                id: id, identity: identity, ops: ops, stored: s.stored, capability: s.key.capability, resolved: resolved, opened: s.opened)
            state.withLock { $0 = next }
            return (fresh, dropped)
        }
        aside.update(kept: fresh, dropped: dropped)
        return fresh
    }
}

/// A device joining a space with an invite: the token, and what to call once it is a member or refused.
final class JoinWait: Sendable {
    let invite: InviteToken
    private let done: Mutex<(@Sendable (Result<Void, any Error>) -> Void)?>

    init(invite: InviteToken, done: @escaping @Sendable (Result<Void, any Error>) -> Void) {
        self.invite = invite
        self.done = Mutex(done)
    }

    /// Reports the outcome, once.
    func finish(_ result: Result<Void, any Error>) {
        let callback = done.withLock { d in
            defer { d = nil }
            return d
        }
        callback?(result)
    }
}
