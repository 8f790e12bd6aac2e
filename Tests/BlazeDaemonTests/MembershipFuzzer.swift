import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Crypto
import Foundation

/// A device the membership fuzzer speaks as (issue #49): each was admitted by the space's admin through the real
/// invite path; `removed` was a writer the admin revoked at once.
enum FuzzRole: String, CaseIterable, Sendable {
    case reader, writer, admin, removed

    /// The role its invite named.
    var inviteRole: String { self == .removed ? "writer" : rawValue }
}

/// What the membership fuzzer generates from its seed against a space with a membership log (SYNC.md §8, §9, §11):
/// `MEMBERS` with validly signed operations of every kind by the connected role, parents drawn from the log's real
/// heads, the fuzzer's own earlier operations, random hashes or none, up to the frame limit; `SNAPSHOT_PART`s without
/// a manifest and manifests that match nothing; `JOIN`s, direct and relayed, for invites nobody issued or used ones;
/// `STATE`s; pings; and structural damage to any of these. Device keys are fresh on every run; every choice is the
/// seed's.
///
/// The fuzzer's admin signs operations that may take effect, so they are kept computable: it adds only devices of
/// `adminPool` (each always with the same role; any other add of its is void), and its removals are void by
/// construction (version 1 in a log that commits to its keys, or an epoch no log reaches), so it never removes anyone.
/// (Were it to add a device the daemon's admin adds, its add could take effect first, with its role: concurrent
/// operations are ordered by their authors' seniority only once both are ready.) It signs at most `adminBudget` fresh
/// operations (an admin's operations stay in the log, which every member is sent on each connection); then it replays.
struct MembershipFuzzer {
    /// Every choice is drawn from it.
    var rng: SeededRandom
    /// The daemon's space.
    let space: SpaceID
    /// A key of the space (the reader's), which snapshot pieces are sealed with.
    let key: SpaceKey
    /// The role devices, unconnected: they sign operations, manifests and heads.
    let signers: [FuzzRole: HostileMember]
    /// Devices only the fuzzer's admin adds, each always with the same role.
    let adminPool: [(identity: DeviceIdentity, keys: DevicePublicKeys, role: MemberRole)]
    /// Devices only the other roles add: the log must never list one.
    let otherPool: [(identity: DeviceIdentity, keys: DevicePublicKeys)]
    /// Signers of heads for pool devices, made when first needed.
    private var poolSigners: [[UInt8]: HostileMember] = [:]
    /// Invites the real admin issued (used by now, or soon): `JOIN`s name them too.
    var issuedInvites: [[UInt8]] = []
    /// Messages generated, by kind.
    private(set) var counts: [String: Int] = [:]

    /// The log as the daemon last held it (`observe`): its heads are parents of new operations.
    private(set) var log: MembershipState
    /// Operations signed so far, by role, for replays (the latest 512 of each; every one of the admin's).
    private var sent: [FuzzRole: [MembershipOp]] = [:]
    /// Hashes of the latest 1,024 operations signed, of any role: parents of later ones.
    private var recent: [EntryHash] = []
    /// Fresh operations the fuzzer's admin may still sign.
    private var adminBudget = 300
    /// Made-up recipients of envelopes.
    private let madeUp: [DevicePublicKeys]
    /// The role devices' public and signing keys, derived once.
    private let publicKeys: [FuzzRole: DevicePublicKeys]
    private let signingKeys: [FuzzRole: Curve25519.Signing.PrivateKey]
    /// Encoded envelopes of random bytes (epochs of at least 1): the bulk of the largest operations, taken in runs.
    private let envelopePool: [UInt8]
    /// Envelopes sealed so far, by space, recipient, key operation and epoch; the fuzzer's secret of each epoch.
    private var envelopeCache: [[UInt8]: KeyEnvelope] = [:], epochSecrets: [Epoch: [UInt8]] = [:]
    /// Key operations no log holds, which envelopes name.
    private let bogusKeyOps: [EntryHash]

    /// Envelope bytes (SYNC.md §9) and the most an operation carries.
    static let envelopeSize = 16 + 4 + 32 + 32 + 48, maxEnvelopes = MembershipOp.maxEnvelopes

    /// A fuzzer for `space` speaking as the role devices `identities`, its choices drawn from `seed`.
    init(seed: UInt64, space: SpaceID, key: SpaceKey, identities: [FuzzRole: DeviceIdentity]) {
        rng = SeededRandom(seed: seed)
        self.space = space
        self.key = key
        signers = identities.mapValues { HostileMember(key: key, identity: $0) }
        publicKeys = identities.mapValues(\.publicKeys)
        signingKeys = identities.mapValues(\.signingKey)
        adminPool = (0..<24).map { i in
            let identity = DeviceIdentity()
            return (identity, identity.publicKeys, MemberRole.allCases[i % 3])
        }
        otherPool = (0..<12).map { _ in
            let identity = DeviceIdentity()
            return (identity, identity.publicKeys)
        }
        madeUp = (0..<6).map { _ in DeviceIdentity().publicKeys }
        log = MembershipState(space: space, ops: [])
        var pool: [UInt8] = []
        pool.reserveCapacity(Self.maxEnvelopes * Self.envelopeSize)
        var r = SeededRandom(seed: seed ^ 0x5EED)
        for _ in 0..<Self.maxEnvelopes {
            var envelope = (0..<(Self.envelopeSize / 8)).flatMap { _ in withUnsafeBytes(of: r.next()) { Array($0) } }
            envelope += [UInt8](repeating: 0, count: Self.envelopeSize - envelope.count)
            envelope[19] |= 1  // the epoch (bytes 16..<20, big-endian) is at least 1
            pool += envelope
        }
        envelopePool = pool
        bogusKeyOps = (0..<4).map { _ in EntryHash(bytes: (0..<32).map { _ in UInt8.random(in: 0...255, using: &r) })! }
    }

    /// Takes the daemon's log as it holds it now.
    mutating func observe(_ ops: [MembershipOp]) { log = MembershipState(space: space, ops: ops) }

    /// The role the fuzzer's admin adds the device with node id `hex` with, nil for a device not in its pool.
    func adminPoolRole(of hex: String) -> MemberRole? { adminPool.first { $0.keys.nodeIDHex == hex }?.role }

    /// The next message to send over a connection authenticated as `role`, and its kind.
    mutating func next(as role: FuzzRole) -> (kind: String, message: [UInt8]) {
        let roll = Int.random(in: 0..<1000, using: &rng)
        let (kind, message): (String, [UInt8])
        switch roll {
        case 0..<2: (kind, message) = ("limit", bulk(as: role, upTo: SessionCipher.maxMessage - 4096))
        case 2..<12: (kind, message) = ("bulk", bulk(as: role, upTo: [1 << 16, 1 << 19, 1 << 20, 2 << 20].randomElement(using: &rng)!))
        case 12..<560: (kind, message) = ("members", members(as: role))
        case 560..<660: (kind, message) = ("ping", [HostileMember.pingType])
        case 660..<750: (kind, message) = ("snapshot", snapshot(as: role))
        case 750..<860: (kind, message) = ("join", join(as: role))
        case 860..<900: (kind, message) = ("state", state())
        default: (kind, message) = ("damaged", SyncFuzzer.damage(anyMessage(as: role), rng: &rng))
        }
        counts[kind, default: 0] += 1
        return (kind, message)
    }

    /// A message of any kind but damaged ones, the largest ones and pings, to damage.
    private mutating func anyMessage(as role: FuzzRole) -> [UInt8] {
        switch Int.random(in: 0..<4, using: &rng) {
        case 0: return snapshot(as: role)
        case 1: return join(as: role)
        case 2: return state()
        default: return members(as: role)
        }
    }

    /// An unrequested snapshot piece, or a manifest signed by `role` that matches nothing (`SyncFuzzer`).
    private mutating func snapshot(as role: FuzzRole) -> [UInt8] {
        SyncFuzzer.snapshotMessage(signer: signers[role]!.identity, key: key, rng: &rng)
    }

    /// A `JOIN` for an invite nobody issued or one the admin issued, of this device (direct) or another (relayed: a
    /// made-up device, another role's, or one only non-admins add), with a proof made of nothing.
    private mutating func join(as role: FuzzRole) -> [UInt8] {
        let joiner: DevicePublicKeys
        switch Int.random(in: 0..<4, using: &rng) {
        case 0: joiner = publicKeys[role]!
        case 1: joiner = publicKeys[FuzzRole.allCases.randomElement(using: &rng)!]!
        case 2: joiner = otherPool.randomElement(using: &rng)!.keys
        default: joiner = madeUp.randomElement(using: &rng)!
        }
        let invite = issuedInvites.isEmpty || Bool.random(using: &rng) ? nil : issuedInvites.randomElement(using: &rng)
        return SyncFuzzer.joinMessage(joiner: joiner, invite: invite, rng: &rng)
    }

    /// A `STATE` claiming to hold every entry of the daemon's device (so it sends none) and of random origins; a
    /// removed device's ends its connection.
    private mutating func state() -> [UInt8] {
        var vector: [(origin: [UInt8], seq: UInt64)] = []
        if let creator = log.current.first { vector.append((creator.keys.nodeID, SyncBounds.maxSeq - 1)) }
        for _ in 0..<Int.random(in: 0..<3, using: &rng) { vector.append((random(16), SyncFuzzer.bigSeq(&rng))) }
        return HostileMember.state(vector)
    }

    /// A `MEMBERS` message of one to four operations signed by `role` (some of another space, some replays); once the
    /// admin's budget is spent, its earlier operations again.
    private mutating func members(as role: FuzzRole) -> [UInt8] {
        var ops: [MembershipOp] = []
        let replays = sent[role] ?? []
        if role == .admin && adminBudget <= 0 {
            ops = (0..<Int.random(in: 1...4, using: &rng)).compactMap { _ in replays.randomElement(using: &rng) }
        } else {
            for _ in 0..<Int.random(in: 1...4, using: &rng) {
                if !replays.isEmpty && Int.random(in: 0..<8, using: &rng) == 0 {
                    ops.append(replays.randomElement(using: &rng)!)
                } else if let op = operation(as: role) {
                    ops.append(op)
                }
            }
        }
        return HostileMember.members(ops)
    }

    /// Parents of a new operation: the log's heads, earlier operations of the fuzzer (any role's), random hashes,
    /// none, or up to the most an operation may name.
    private mutating func parents() -> [EntryHash] {
        switch Int.random(in: 0..<10, using: &rng) {
        case 0..<4: return Array(log.heads.prefix(MembershipOp.maxParents))
        case 4, 5:
            let picked = (0..<Int.random(in: 1...3, using: &rng)).compactMap { _ in recent.randomElement(using: &rng) }
            return Bool.random(using: &rng) ? picked : Array((picked + log.heads).prefix(MembershipOp.maxParents))
        case 6: return (0..<Int.random(in: 1...3, using: &rng)).map { _ in EntryHash(bytes: random(32))! }
        case 7, 8: return []
        default:
            let all = log.order + recent
            return (0..<Int.random(in: 1...MembershipOp.maxParents, using: &rng)).compactMap { _ in all.randomElement(using: &rng) }
        }
    }

    /// One operation of any kind signed by `role`; nil when the choices made one that does not encode.
    private mutating func operation(as role: FuzzRole) -> MembershipOp? {
        let author = signers[role]!.identity
        let opSpace = Int.random(in: 0..<25, using: &rng) == 0 ? SpaceID(bytes: random(16))! : space
        let time = [UInt64(Date().timeIntervalSince1970 * 1000), 0, .max].randomElement(using: &rng)!
        let parents = parents()
        var commitment: [UInt8]?, head: SignedHead?
        let action: MembershipOp.Action
        var envelopes: [KeyEnvelope] = []
        switch Int.random(in: 0..<8, using: &rng) {
        case 0:
            action = .create(salt: random(16))
        case 1, 2:
            let (device, addRole) = added(by: role)
            action = .add(device: device, role: addRole)
            envelopes = sealed(to: [device] + (Bool.random(using: &rng) ? [] : [madeUp.randomElement(using: &rng)!]))
        case 3, 4, 5:
            let (target, signer) = removalTarget()
            var cutoff = [0, UInt64.random(in: 1..<50, using: &rng), SyncFuzzer.bigSeq(&rng), .max].randomElement(using: &rng)!
            let epoch: Epoch
            let current = log.currentEpoch.value
            if role == .admin {
                // Void by construction: no log reaches such an epoch.
                epoch = Epoch([1 << 20, 1 << 31, .max - 1, .max].randomElement(using: &rng)!)
            } else {
                epoch = Epoch(max(2, [2, current, current &+ 1, UInt32.random(in: 2..<64, using: &rng), .max].randomElement(using: &rng)!))
            }
            let secret = secret(for: epoch)
            envelopes = someMembers().compactMap { envelope(to: $0, space: opSpace, epoch: epoch, keyOp: KeyEnvelope.thisOp) }
            // Version 2 (committing) for the other roles only: the admin's removals stay version 1, void here.
            if role != .admin && Bool.random(using: &rng) {
                commitment = Bool.random(using: &rng) ? KeyEnvelope.commitment(secret: secret, space: opSpace, epoch: epoch) : random(32)
                if cutoff > 0, let signer, SyncBounds.isValidSeq(cutoff) {
                    head = try? SignedHead(bytes: signer.head(seq: cutoff, hash: random(32))[...])
                }
                if head == nil { cutoff = 0 }
            }
            action = .remove(device: target, cutoff: cutoff, epoch: epoch)
        default:
            action = .grant
            envelopes = sealed(to: Array(madeUp.prefix(Int.random(in: 0...2, using: &rng))) + someMembers())
        }
        let named = Set(parents).sorted().prefix(MembershipOp.maxParents)
        guard
            let op = try? MembershipOp(
                space: opSpace, author: author, timeMs: time, parents: Array(named), action: action, envelopes: envelopes,
                commitment: commitment, cutoffHead: head)
        else { return nil }
        if role == .admin { adminBudget -= 1 }
        sent[role, default: []].append(op)
        if role != .admin && sent[role]!.count > 512 { sent[role]!.removeFirst(256) }
        recent.append(op.hash)
        if recent.count > 1_024 { recent.removeFirst(512) }
        return op
    }

    /// The device an `add` by `role` names, and its role: for the admin a device of its pool with that device's role,
    /// or (void) the daemon's device or a role device, which were added before any operation of the fuzzer's admin
    /// could take effect; for the others one only they add, a listed one, or the author itself as an admin.
    private mutating func added(by role: FuzzRole) -> (DevicePublicKeys, MemberRole) {
        let anyRole = MemberRole.allCases.randomElement(using: &rng)!
        if role == .admin {
            guard Int.random(in: 0..<5, using: &rng) == 0 else {
                let pick = adminPool.randomElement(using: &rng)!
                return (pick.keys, pick.role)
            }
            let early = [log.current.first?.keys].compactMap { $0 } + FuzzRole.allCases.map { publicKeys[$0]! }
            return (early.randomElement(using: &rng)!, anyRole)
        }
        let listed = log.members.values.sorted { $0.seniority < $1.seniority }.map(\.keys)
        switch Int.random(in: 0..<4, using: &rng) {
        case 0: return (publicKeys[role]!, .admin)
        case 1: return (listed.randomElement(using: &rng) ?? publicKeys[role]!, anyRole)
        default: return (otherPool.randomElement(using: &rng)!.keys, anyRole)
        }
    }

    /// The node id a removal names, and a signer of heads for it when the fuzzer holds its key: the daemon's device,
    /// a role device, a pool device or a random id.
    private mutating func removalTarget() -> ([UInt8], HostileMember?) {
        switch Int.random(in: 0..<6, using: &rng) {
        case 0, 1: return (log.current.first?.keys.nodeID ?? random(16), nil)
        case 2, 3:
            let signer = signers[FuzzRole.allCases.randomElement(using: &rng)!]!
            return (signer.origin, signer)
        case 4:
            let pool = adminPool.map { ($0.identity, $0.keys) } + otherPool.map { ($0.identity, $0.keys) }
            let (identity, keys) = pool.randomElement(using: &rng)!
            let signer = poolSigners[keys.nodeID] ?? HostileMember(key: key, identity: identity)
            poolSigners[keys.nodeID] = signer
            return (keys.nodeID, signer)
        default: return (random(16), nil)
        }
    }

    /// Up to four current members of the log, the daemon's device among them at times.
    private mutating func someMembers() -> [DevicePublicKeys] {
        let current = log.current.map(\.keys)
        return (0..<Int.random(in: 0...4, using: &rng)).compactMap { _ in current.randomElement(using: &rng) }
    }

    /// Envelopes to `recipients` sealing the fuzzer's secrets as keys of real epochs (named by the operation that
    /// created them, by none, or by one that does not exist): keys no operation committed to, which every member must
    /// ignore.
    private mutating func sealed(to recipients: [DevicePublicKeys]) -> [KeyEnvelope] {
        recipients.compactMap { recipient in
            let real = log.epochKeys.randomElement(using: &rng)
            let keyOp = [real?.op ?? KeyEnvelope.thisOp, KeyEnvelope.thisOp, bogusKeyOps.randomElement(using: &rng)!]
                .randomElement(using: &rng)!
            return envelope(to: recipient, space: space, epoch: real?.epoch ?? Epoch(UInt32.random(in: 1...9, using: &rng)), keyOp: keyOp)
        }
    }

    /// An envelope to `recipient` sealing the fuzzer's secret for `epoch` as the key `keyOp` names; each is sealed
    /// once and reused (HPKE is the costliest thing the fuzzer does).
    private mutating func envelope(to recipient: DevicePublicKeys, space: SpaceID, epoch: Epoch, keyOp: EntryHash) -> KeyEnvelope? {
        var id = space.bytes + recipient.nodeID + keyOp.bytes
        id.appendBE(epoch)
        if let cached = envelopeCache[id] { return cached }
        if envelopeCache.count >= 4_096 { envelopeCache = [:] }
        let made = try? KeyEnvelope(sealing: secret(for: epoch), space: space, epoch: epoch, keyOp: keyOp, to: recipient)
        envelopeCache[id] = made
        return made
    }

    /// The fuzzer's secret for `epoch`, one for each epoch.
    private mutating func secret(for epoch: Epoch) -> [UInt8] {
        if let secret = epochSecrets[epoch] { return secret }
        let secret = random(32)
        epochSecrets[epoch] = secret
        return secret
    }

    /// A `MEMBERS` message of at most `limit` bytes: for the other roles, up to 1,000 small operations or a few
    /// carrying thousands of envelopes, all signed by `role`, of grants and adds that can never take effect; for the
    /// admin, every operation it signed so far (nothing new that would stay in the log).
    private mutating func bulk(as role: FuzzRole, upTo limit: Int) -> [UInt8] {
        guard role != .admin else { return HostileMember.members(sent[.admin] ?? []) }
        var ops: [[UInt8]] = []
        var size = 5
        let small = limit <= 2 << 20 && Bool.random(using: &rng)
        while true {
            let envelopes = small ? Int.random(in: 0...2, using: &rng) : Int.random(in: 1...Self.maxEnvelopes, using: &rng)
            let op = rawOperation(by: role, envelopes: min(envelopes, max(0, (limit - size - 400) / Self.envelopeSize)))
            guard size + 4 + op.count <= limit, ops.count < (small ? 1_000 : 20_000) else { break }
            ops.append(op)
            size += 4 + op.count
        }
        var out: [UInt8] = [5]
        out.reserveCapacity(size)
        out.appendBE(UInt32(ops.count))
        for op in ops {
            out.appendBE(UInt32(op.count))
            out += op
        }
        return out
    }

    /// A version-1 grant or add (of a device only non-admins add, or of the author as an admin) signed by `role`,
    /// encoded by hand from SYNC.md §9 with `envelopes` taken from the pool: as large as an operation may be, and cheap
    /// to make.
    private mutating func rawOperation(by role: FuzzRole, envelopes: Int) -> [UInt8] {
        let me = publicKeys[role]!
        var out = Array("BLZM".utf8) + [1] + space.bytes + me.signing + me.agreement
        out.appendBE(UInt64(Date().timeIntervalSince1970 * 1000))
        let parents = Set((0..<Int.random(in: 0...2, using: &rng)).map { _ in random(32) } + log.heads.prefix(2).map(\.bytes)).sorted {
            $0.lexicographicallyPrecedes($1)
        }
        out.append(UInt8(parents.count))
        for p in parents { out += p }
        if Bool.random(using: &rng) {
            out.append(4)
        } else {
            let device = Bool.random(using: &rng) ? me : otherPool.randomElement(using: &rng)!.keys
            out += [2] + device.signing + device.agreement + [MemberRole.admin.rawValue]
        }
        out.appendBE(UInt16(envelopes))
        let start = Int.random(in: 0...(Self.maxEnvelopes - envelopes), using: &rng) * Self.envelopeSize
        out += envelopePool[start..<(start + envelopes * Self.envelopeSize)]
        let signature = try! signingKeys[role]!.signature(for: Array("blazedb membership v1".utf8) + out)
        return out + Array(signature)
    }

    /// `n` random bytes from the seed.
    private mutating func random(_ n: Int) -> [UInt8] { (0..<n).map { _ in UInt8.random(in: 0...255, using: &rng) } }
}
