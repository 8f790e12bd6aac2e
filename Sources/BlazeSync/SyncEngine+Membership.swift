import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import Foundation
import NIOCore
import Synchronization

/// An established session as the engine reaches it: its database, and how to tell it the membership changed.
struct SessionHandle: Sendable {
    let db: String
    let notify: @Sendable () -> Void
}

/// A member of a space as `db.members` lists it.
public struct MemberInfo: Sendable {
    /// Node id (hex).
    public let device: String
    /// Role name.
    public let role: String
    /// Node id (hex) of the admin who added it; nil for the creator.
    public let addedBy: String?
    /// When it was added (the adder's clock, Unix ms).
    public let addedAtMs: UInt64
    /// Node id (hex) of the admin who removed it, and when; nil while it is a member.
    public let removedBy: String?
    /// When it was removed (the remover's clock, Unix ms).
    public let removedAtMs: UInt64?
    /// True for this device.
    public let isSelf: Bool
}

/// Unix time in milliseconds, as membership operations carry it.
func nowMsUnsigned() -> UInt64 { UInt64(max(0, nowMs())) }

/// Membership (SYNC.md §9): invites, joining, revocation, and telling every session when the log changes.
extension SyncEngine {
    // MARK: Sessions

    /// Registers an established session of `db`; returns its registration for `unregister`.
    func register(db: String, notify: @escaping @Sendable () -> Void) -> Int {
        let id = sessionCounter.add(1, ordering: .relaxed).newValue
        sessions.withLock { $0[id] = SessionHandle(db: db, notify: notify) }
        return id
    }

    /// Forgets a closed session.
    func unregister(_ id: Int) {
        _ = sessions.withLock { $0.removeValue(forKey: id) }
    }

    /// Tells every session of `db` that its space's membership changed: each sends the operations its peer lacks,
    /// and closes when the device at the other end was removed.
    func membershipChanged(db: String) {
        for handle in sessions.withLock({ $0.values.filter { $0.db == db } }) { handle.notify() }
    }

    /// Stores operations a peer sent (already merged into `space`) and then tells the database's sessions.
    func persist(_ ops: [MembershipOp], space: SharedSpace) {
        let engine = self
        let db = space.db
        pool.submit { _ in
            do {
                try db.addMembershipOps(ops)
                try engine.grantMissingKeys(space: space)
            } catch {
                engine.logger.error("Cannot store membership operations", metadata: ["db": "\(db.name)", "error": "\(error)"])
            }
            engine.membershipChanged(db: db.name)
        }
    }

    /// Most envelopes one `grant` carries; a larger backlog takes several (each merge runs this again).
    static let maxGrantEnvelopes = 1024

    /// When this device is a current admin, seals to each current member the epoch keys it holds that the log never
    /// sealed to that member (`MembershipState.missingKeys`: an add concurrent with a rotation) and records them as one
    /// `grant`. Several admins may grant the same key; the copies are harmless.
    func grantMissingKeys(space: SharedSpace) throws {
        try grantLock.withLock { _ in try grantMissingKeysNow(space: space) }
    }

    private func grantMissingKeysNow(space: SharedSpace) throws {
        let snapshot = space.snapshot
        guard let membership = snapshot.membership, let me = membership.member(identity.nodeID), me.isCurrent,
            me.role == .admin
        else { return }
        var envelopes: [KeyEnvelope] = []
        for (member, keys) in membership.missingKeys {
            for key in keys {
                guard let secret = snapshot.held[key], envelopes.count < Self.maxGrantEnvelopes else { continue }
                envelopes.append(try KeyEnvelope(sealing: secret, space: space.id, epoch: key.epoch, keyOp: key.op, to: member.keys))
            }
        }
        guard !envelopes.isEmpty else { return }
        try recordGrant(envelopes, space: space)
        logger.info(
            "Sync granted epoch keys to members that missed a rotation",
            metadata: ["db": "\(space.db.name)", "envelopes": "\(envelopes.count)"])
    }

    /// Signs a `grant` of `envelopes` by this device, stores it and merges it into `space`.
    func recordGrant(_ envelopes: [KeyEnvelope], space: SharedSpace) throws {
        let op = try MembershipOp(
            space: space.id, author: identity, timeMs: nowMsUnsigned(), parents: try mergedHeads(space), action: .grant,
            envelopes: envelopes)
        try space.db.addMembershipOps([op])
        _ = space.merge([op])
    }

    /// The parents of this device's next operation: the log's heads, first joined by `grant`s naming at most
    /// `MembershipOp.maxParents` of them each while there are more (a senior admin's operations made concurrently
    /// with its removal take effect, and can leave that many heads). Call outside a transaction of the database: the
    /// joining grants are stored.
    func mergedHeads(_ space: SharedSpace) throws -> [EntryHash] {
        while true {
            let heads = space.snapshot.membership?.heads ?? []
            guard heads.count > MembershipOp.maxParents else { return heads }
            let join = try MembershipOp(
                space: space.id, author: identity, timeMs: nowMsUnsigned(), parents: Array(heads.prefix(MembershipOp.maxParents)),
                action: .grant)
            try space.db.addMembershipOps([join])
            guard space.merge([join]).count == 1 else {
                throw StoreError(.syncFailure, kind: "log_full", "the membership log of database \(space.db.name) took no more operations")
            }
        }
    }

    /// Counts an invite refused, by reason.
    func countInviteRefusal(_ reason: String) {
        invitesRefused.withLock { $0[reason, default: 0] += 1 }
    }

    /// Invites refused since start, by reason (`invite_used`, `invite_expired`, `invite_unknown`,
    /// `inviter_not_admin`).
    public var invitesRefusedCounts: [String: Int] { invitesRefused.withLock { $0 } }

    // MARK: Members

    /// The space of `db` with its membership log, or a clear error when it has none.
    func membershipSpace(_ db: BlazeDatabase) throws -> (SharedSpace, SharedSpace.Snapshot, MembershipState) {
        guard let space = try space(db: db) else {
            throw StoreError(.syncFailure, kind: "not_shared", "database \(db.name) is not shared; run db.share or db.join first")
        }
        let snapshot = space.snapshot
        guard let membership = snapshot.membership else {
            throw StoreError(
                .syncFailure, kind: "legacy_space",
                "database \(db.name) was shared with a secret token before membership existed: every holder of the "
                    + "token is a member and none can be invited or removed; share a new database to use membership")
        }
        return (space, snapshot, membership)
    }

    /// Refuses unless this device is a current admin of the space.
    private func requireAdmin(_ membership: MembershipState, db: BlazeDatabase) throws {
        guard let me = membership.member(identity.nodeID), me.isCurrent, me.role == .admin else {
            throw StoreError(
                .syncFailure, kind: "not_an_admin", "this device is not an admin of the space of database \(db.name)")
        }
    }

    /// Every device ever added to `db`'s space, in order of addition, removed ones included.
    public func members(db: BlazeDatabase) throws -> [MemberInfo] {
        let (_, _, membership) = try membershipSpace(db)
        return membership.members.values.sorted { $0.seniority < $1.seniority }.map { m in
            MemberInfo(
                device: m.keys.nodeIDHex, role: m.role.name, addedBy: m.addedBy.map(hexString), addedAtMs: m.addedAtMs,
                removedBy: m.removal.map { hexString($0.by) }, removedAtMs: m.removal?.atMs,
                isSelf: m.keys.nodeID == identity.nodeID)
        }
    }

    /// Why a local write to `db` would be refused by the space's members, nil when it would not (or `db` is not
    /// shared).
    public func writeRefusal(db name: String) -> String? {
        guard let space = served.withLock({ $0[name] }) else { return nil }
        return space.snapshot.writeRefusal(db: name)
    }

    /// The relay capability of `db`'s space (SYNC.md §9, "Relay capability"): any member may hand it to a relay.
    public func relayCapability(db: BlazeDatabase) throws -> RelayCapability {
        let (_, snapshot, _) = try membershipSpace(db)
        return RelayCapability(key: snapshot.key)
    }

    // MARK: Invites

    /// Issues a one-time invite into `db`'s space for a device with `role`, valid for `expiresInMs`; the token names
    /// `address` (default: the address this engine listens on) as the member to join through.
    public func invite(db: BlazeDatabase, role: MemberRole, expiresInMs: Int64, address: String?) throws
        -> (token: String, expiresAtMs: Int64)
    {
        let (space, snapshot, membership) = try membershipSpace(db)
        try requireAdmin(membership, db: db)
        guard let address = address ?? listeningAddress else {
            throw StoreError(
                .syncFailure, kind: "not_listening",
                "sync is not listening here, so a joiner could not reach this device; pass the address to join through")
        }
        let id = SpaceKey.randomBytes(16)
        let secret = SpaceKey.randomSecret()
        let token = try InviteToken(space: space.id, capability: snapshot.key.capability, id: id, secret: secret, address: address)
        let expires = Int64(nowMsUnsigned()) + expiresInMs
        try db.addInvite(id: id, verifier: InviteToken.verifier(secret), role: role.name, expiresAtMs: expires)
        return (token.text, expires)
    }

    /// Redeems an invite for `device` (the joiner, at the other end of a session or behind a relay), given its proof
    /// of the secret bound to its keys: adds it to the log with the invite's role and every epoch key sealed to it, in
    /// the transaction that marks the invite used.
    func admit(device: DevicePublicKeys, inviteID: [UInt8], proof: [UInt8], space: SharedSpace) throws -> MembershipOp {
        let snapshot = space.snapshot
        guard let membership = snapshot.membership, let me = membership.member(identity.nodeID), me.isCurrent,
            me.role == .admin
        else { throw InviteRefusal.inviterNotAdmin }
        guard membership.member(device.nodeID) == nil else { throw InviteRefusal.used }
        let parents = try mergedHeads(space)
        var made: MembershipOp?
        _ = try space.db.redeemInvite(
            id: inviteID,
            proves: { kept, version in
                InviteToken.checkJoinProof(proof, kept: kept, version: version, space: space.id, invite: inviteID, device: device)
            },
            device: device.nodeID, nowMs: Int64(nowMsUnsigned())
        ) { roleName in
            let role = MemberRole(name: roleName) ?? .reader
            let envelopes = try snapshot.held.sorted { $0.key.op < $1.key.op }.map {
                try KeyEnvelope(sealing: $0.value, space: space.id, epoch: $0.key.epoch, keyOp: $0.key.op, to: device)
            }
            let op = try MembershipOp(
                space: space.id, author: identity, timeMs: nowMsUnsigned(), parents: parents,
                action: .add(device: device, role: role), envelopes: envelopes)
            made = op
            return (op.hash.bytes, op.bytes)
        }
        let op = made!
        _ = space.merge([op])
        membershipChanged(db: space.db.name)
        return op
    }

    /// Joins a space with an invite as the new database `name`: connects to the inviting member, redeems the
    /// invite, and returns once this device is a member holding the space's keys (or throws, leaving nothing behind).
    func join(invite: InviteToken, name: String?, timeout: TimeAmount) throws -> BlazeDatabase {
        let idHex = invite.space.hex
        let name = name ?? "shared-" + idHex.prefix(8)
        guard let address = PeerAddress(invite.address) else {
            throw StoreError(.invalidArgument, kind: "invalid_token", "the invite names no usable address")
        }
        if let existing = served.withLock({ $0.values.first { $0.id == invite.space } }) {
            throw StoreError(.alreadyExists, kind: "already_joined", "database \(existing.db.name) already syncs in this space")
        }
        let db = try store.create(name)
        let outcome = Mutex<Result<Void, any Error>?>(nil)
        let done = DispatchSemaphore(value: 0)
        let space = SharedSpace(db: db, id: invite.space, identity: identity, ops: [], stored: nil, capability: invite.capability)
        space.joining.withLock {
            $0 = JoinWait(invite: invite) { result in
                outcome.withLock { $0 = result }
                done.signal()
            }
        }
        do {
            try db.setSpaceID(idHex)
            served.withLock { $0[name] = space }
            _ = try db.addPeer(address.description)
            refreshLinks(db: name)
            if done.wait(timeout: .now() + .nanoseconds(Int(timeout.nanoseconds))) == .timedOut {
                space.joining.withLock { $0 = nil }
                throw StoreError(
                    .syncFailure, kind: "join_timeout",
                    "could not join through \(address) within \(timeout.nanoseconds / 1_000_000_000) s: is that member "
                        + "running, listening there and reachable from here?")
            }
            try outcome.withLock { $0 }!.get()
            return db
        } catch {
            forget(db: name, spaceID: nil)
            try? store.drop(name)
            throw error
        }
    }

    /// Called by a session of a space being joined when the log shows this device as a member.
    func finishJoin(_ space: SharedSpace) {
        let wait = space.joining.withLock { w in
            defer { w = nil }
            return w
        }
        wait?.finish(.success(()))
    }

    /// Called by a session of a space being joined when the inviting member refused the invite.
    func failJoin(_ space: SharedSpace, reason: String) {
        let wait = space.joining.withLock { w in
            defer { w = nil }
            return w
        }
        let message: String
        switch InviteRefusal(rawValue: reason) {
        case .used?: message = "this invite was used already; ask a member for a new one"
        case .expired?: message = "this invite has expired; ask a member for a new one"
        case .unknown?: message = "the member does not know this invite (wrong device, or a damaged token)"
        case .inviterNotAdmin?: message = "the device that issued this invite is no longer an admin"
        case nil: message = "the member refused to admit this device: \(reason)"
        }
        wait?.finish(.failure(StoreError(.syncFailure, kind: InviteRefusal(rawValue: reason)?.rawValue ?? "join_refused", message)))
    }

    // MARK: Revocation

    /// Removes `device` (node id hex) from `db`'s space: accepts its entries up to what this device holds, starts a
    /// new epoch whose key is sealed to every remaining member, and closes its connections here. Returns the new
    /// epoch. In a log that commits to its keys, the operation carries the new key's commitment, and the cutoff is the
    /// latest head of the device held here, which the operation carries (so no admin can set a cutoff past what the
    /// device signed).
    public func revoke(db: BlazeDatabase, device: String) throws -> Epoch {
        let (space, _, membership) = try membershipSpace(db)
        try requireAdmin(membership, db: db)
        guard let node = hexBytes(device), node.count == 16, let target = membership.member(node) else {
            throw StoreError(.notFound, kind: "unknown_member", "device \(device) is not a member of database \(db.name)'s space")
        }
        guard target.isCurrent else {
            throw StoreError(.syncFailure, kind: "already_removed", "device \(device) was removed already")
        }
        guard membership.current.contains(where: { $0.role == .admin && $0.keys != target.keys }) else {
            throw StoreError(.syncFailure, kind: "last_admin", "device \(device) is the space's last admin")
        }
        let head = membership.commitsKeys ? try db.latestHeadBytes(origin: NodeID(bytes: node)).map { try SignedHead(bytes: $0[...]) } : nil
        let cutoff = membership.commitsKeys ? head?.seq ?? 0 : try db.syncVector()[NodeID(bytes: node)] ?? 0
        let epoch = membership.currentEpoch.next
        let secret = SpaceKey.randomSecret()
        let envelopes = try membership.current.filter { $0.keys != target.keys }.map {
            try KeyEnvelope(sealing: secret, space: space.id, epoch: epoch, keyOp: KeyEnvelope.thisOp, to: $0.keys)
        }
        let op = try MembershipOp(
            space: space.id, author: identity, timeMs: nowMsUnsigned(), parents: try mergedHeads(space),
            action: .remove(device: node, cutoff: cutoff, epoch: epoch), envelopes: envelopes,
            commitment: membership.commitsKeys ? KeyEnvelope.commitment(secret: secret, space: space.id, epoch: epoch) : nil,
            cutoffHead: head)
        try db.addMembershipOps([op])
        _ = space.merge([op])
        membershipChanged(db: db.name)
        return space.snapshot.membership?.currentEpoch ?? epoch
    }
}
