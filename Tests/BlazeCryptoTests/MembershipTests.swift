import BlazeProtocol
import BlazeTestSupport
import Crypto
import Foundation
import Testing

@testable import BlazeCrypto

/// A membership log being written by hand: its ops so far and the parents of the next one.
struct LogBuilder {
    /// The salt of the space's create; the space id follows from it and the first author.
    let salt = SpaceKey.generate().id.bytes
    var space = SpaceID(bytes: [UInt8](repeating: 0, count: 16))!
    var ops: [MembershipOp] = []
    var time: UInt64 = 1_000

    var state: MembershipState { MembershipState(space: space, ops: ops) }

    /// Appends an op by `author` on top of `parents` (default: the current heads).
    @discardableResult
    mutating func add(
        _ author: DeviceIdentity, _ action: MembershipOp.Action, parents: [EntryHash]? = nil, envelopes: [KeyEnvelope] = []
    ) throws -> MembershipOp {
        time += 1
        if case .create(let salt) = action, ops.isEmpty { space = MembershipOp.spaceID(creator: author.publicKeys, salt: salt) }
        let op = try MembershipOp(
            space: space, author: author, timeMs: time, parents: parents ?? state.heads, action: action, envelopes: envelopes)
        ops.append(op)
        return op
    }

    /// A removal of `device` by `author` starting the next epoch, its fresh key sealed to `to`.
    func removal(
        _ author: DeviceIdentity, removing device: DeviceIdentity, epoch: Epoch, to: [DeviceIdentity], secret: [UInt8]
    ) throws -> (MembershipOp.Action, [KeyEnvelope]) {
        let envelopes = try to.map {
            try KeyEnvelope(sealing: secret, space: space, epoch: epoch, keyOp: KeyEnvelope.thisOp, to: $0.publicKeys)
        }
        return (.remove(device: device.nodeID, cutoff: 10, epoch: epoch), envelopes)
    }
}

func randomSecret() -> [UInt8] { SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) } }

@Suite struct MembershipTests {
    @Test func anOperationDecodesToItselfAndEveryAlteredByteIsRefused() throws {
        var log = LogBuilder()
        let a = DeviceIdentity(), b = DeviceIdentity()
        try log.add(a, .create(salt: log.salt))
        let envelope = try KeyEnvelope(sealing: randomSecret(), space: log.space, epoch: 1, keyOp: log.ops[0].hash, to: b.publicKeys)
        let op = try log.add(a, .add(device: b.publicKeys, role: .writer), envelopes: [envelope])
        let decoded = try MembershipOp(bytes: op.bytes)
        #expect(decoded == op && decoded.parents == [log.ops[0].hash] && decoded.envelopes == [envelope])
        for i in op.bytes.indices {
            var altered = op.bytes
            altered[i] ^= 0x01
            #expect(throws: MembershipError.self) { try MembershipOp(bytes: altered) }
        }
        for n in [0, 10, op.bytes.count - 1] {
            #expect(throws: MembershipError.self) { try MembershipOp(bytes: Array(op.bytes.prefix(n))) }
        }
        #expect(throws: MembershipError.self) { try MembershipOp(bytes: op.bytes + [0]) }
    }

    @Test func anEnvelopeOpensOnlyForItsRecipient() throws {
        let space = SpaceKey.generate().id
        let b = DeviceIdentity(), c = DeviceIdentity()
        let secret = randomSecret()
        let e = try KeyEnvelope(sealing: secret, space: space, epoch: 2, keyOp: KeyEnvelope.thisOp, to: b.publicKeys)
        #expect(e.open(space: space, identity: b) == secret)
        #expect(e.open(space: space, identity: c) == nil)
        #expect(e.open(space: SpaceKey.generate().id, identity: b) == nil)
        // An envelope re-addressed to another epoch or key does not open: both are bound into its HPKE info.
        let moved = KeyEnvelope(recipient: e.recipient, epoch: 3, keyOp: e.keyOp, encapsulated: e.encapsulated, ciphertext: e.ciphertext)
        #expect(moved.open(space: space, identity: b) == nil)
    }

    @Test func rolesRemovalsCutoffsAndRotation() throws {
        var log = LogBuilder()
        let a = DeviceIdentity(), b = DeviceIdentity(), c = DeviceIdentity(), d = DeviceIdentity()
        try log.add(a, .create(salt: log.salt))
        try log.add(a, .add(device: b.publicKeys, role: .writer))
        try log.add(a, .add(device: c.publicKeys, role: .reader))
        try log.add(a, .add(device: d.publicKeys, role: .admin))
        #expect(log.state.currentEpoch == 1 && log.state.current.map(\.keys) == [a, b, c, d].map(\.publicKeys))
        // A writer cannot add anyone.
        let e = DeviceIdentity()
        let refused = try log.add(b, .add(device: e.publicKeys, role: .admin))
        #expect(log.state.void[refused.hash] == "author is not an admin" && log.state.member(e.nodeID) == nil)
        // D removes B; the new key reaches A, C and D only.
        let secret = randomSecret()
        let (action, envelopes) = try log.removal(d, removing: b, epoch: 2, to: [a, c, d], secret: secret)
        let removal = try log.add(d, action, envelopes: envelopes)
        let s = log.state
        #expect(s.void[removal.hash] == nil && s.currentEpoch == 2)
        #expect(s.member(b.nodeID)?.isCurrent == false && s.member(b.nodeID)?.removal?.by == d.nodeID)
        for member in [a, c, d] { #expect(s.currentSecret(s.keys(for: member)) == secret) }
        #expect(s.currentSecret(s.keys(for: b)) == nil)
        // Entries: B's up to its cutoff, never the reader's, every writing member's.
        #expect(s.acceptsEntry(origin: b.nodeID, seq: 10) && !s.acceptsEntry(origin: b.nodeID, seq: 11))
        #expect(!s.acceptsEntry(origin: c.nodeID, seq: 1) && s.acceptsEntry(origin: d.nodeID, seq: 1_000))
        #expect(!s.acceptsEntry(origin: e.nodeID, seq: 1))
        // A removed device cannot come back, and a removal must start exactly the next epoch.
        let back = try log.add(a, .add(device: b.publicKeys, role: .writer))
        #expect(log.state.void[back.hash] == "device was already added")
        let skip = try log.add(a, .remove(device: c.nodeID, cutoff: 0, epoch: 4))
        #expect(log.state.void[skip.hash] == "epoch is not one past the author's latest")
    }

    @Test func twoAdminsRemovingEachOtherConcurrentlyLeaveTheSeniorOne() throws {
        var log = LogBuilder()
        let a = DeviceIdentity(), d = DeviceIdentity(), w = DeviceIdentity()
        try log.add(a, .create(salt: log.salt))
        try log.add(a, .add(device: d.publicKeys, role: .admin))
        try log.add(a, .add(device: w.publicKeys, role: .writer))
        let fork = log.state.heads
        let (ra, ea) = try log.removal(a, removing: d, epoch: 2, to: [a, w], secret: randomSecret())
        let byA = try log.add(a, ra, parents: fork, envelopes: ea)
        let (rd, ed) = try log.removal(d, removing: a, epoch: 2, to: [d, w], secret: randomSecret())
        let byD = try log.add(d, rd, parents: fork, envelopes: ed)
        for order in [log.ops, log.ops.reversed(), log.ops.shuffled()] {
            let s = MembershipState(space: log.space, ops: order)
            #expect(s.current.map(\.keys) == [a.publicKeys, w.publicKeys])
            #expect(s.void[byD.hash] == "author is not a member" && s.void[byA.hash] == nil)
            // The void removal is no head: the next operation builds on the applied one only.
            #expect(s.frontier == [EpochKeyID(epoch: 2, op: byA.hash)] && s.heads == [byA.hash])
        }
    }

    @Test func concurrentRotationsCombineSoNeitherRemovedDeviceCanSeal() throws {
        var log = LogBuilder()
        let a = DeviceIdentity(), b = DeviceIdentity(), c = DeviceIdentity(), d = DeviceIdentity()
        try log.add(a, .create(salt: log.salt))
        try log.add(a, .add(device: b.publicKeys, role: .admin))
        try log.add(a, .add(device: c.publicKeys, role: .writer))
        try log.add(a, .add(device: d.publicKeys, role: .writer))
        let fork = log.state.heads
        let (ra, ea) = try log.removal(a, removing: c, epoch: 2, to: [a, b, d], secret: randomSecret())
        try log.add(a, ra, parents: fork, envelopes: ea)
        let (rb, eb) = try log.removal(b, removing: d, epoch: 2, to: [a, b, c], secret: randomSecret())
        try log.add(b, rb, parents: fork, envelopes: eb)
        let s = log.state
        #expect(s.frontier.count == 2 && s.currentEpoch == 3 && s.void.isEmpty)
        let combined = s.currentSecret(s.keys(for: a))
        #expect(combined != nil && combined == s.currentSecret(s.keys(for: b)))
        #expect(s.currentSecret(s.keys(for: c)) == nil && s.currentSecret(s.keys(for: d)) == nil)
        // The next rotation, made knowing both, is the single latest key again.
        // It starts the epoch after the combined one (3), so entries sealed under the combination stay apart.
        let (next, en) = try log.removal(a, removing: b, epoch: 4, to: [a], secret: randomSecret())
        let third = try log.add(a, next, envelopes: en)
        #expect(log.state.frontier == [EpochKeyID(epoch: 4, op: third.hash)] && log.state.currentEpoch == 4)
        // The combined epoch stays in a's ring: a held both of its parts.
        #expect(log.state.combinations.count == 1 && log.state.ring(log.state.keys(for: a)).contains { $0.epoch == 3 })
    }

    @Test func twoConcurrentRemovalsOfOneDeviceBothRotate() throws {
        var log = LogBuilder()
        let a = DeviceIdentity(), b = DeviceIdentity(), c = DeviceIdentity()
        try log.add(a, .create(salt: log.salt))
        try log.add(a, .add(device: b.publicKeys, role: .admin))
        try log.add(a, .add(device: c.publicKeys, role: .writer))
        let fork = log.state.heads
        let (ra, ea) = try log.removal(a, removing: c, epoch: 2, to: [a, b], secret: randomSecret())
        let byA = try log.add(a, ra, parents: fork, envelopes: ea)
        let (rb, eb) = try log.removal(b, removing: c, epoch: 2, to: [a, b], secret: randomSecret())
        let byB = try log.add(b, rb, parents: fork, envelopes: eb)
        for order in [log.ops, log.ops.reversed()] {
            let s = MembershipState(space: log.space, ops: order)
            #expect(s.void.isEmpty && s.current.map(\.keys) == [a.publicKeys, b.publicKeys])
            #expect(s.member(c.nodeID)?.removal?.by == a.nodeID, "the senior admin's removal is ordered first")
            // Both keys are epoch keys: each author's entries sealed with its own stay readable by the other.
            #expect(Set(s.frontier) == [EpochKeyID(epoch: 2, op: byA.hash), EpochKeyID(epoch: 2, op: byB.hash)])
            #expect(s.currentEpoch == 3 && s.currentSecret(s.keys(for: a)) == s.currentSecret(s.keys(for: b)))
            #expect(s.ring(s.keys(for: b)).filter { $0.epoch == 2 }.count == 2 && s.keys(for: c).isEmpty)
        }
    }

    @Test func aDeviceAddedConcurrentlyWithARotationMissesItsKeyUntilAGrant() throws {
        var log = LogBuilder()
        let a = DeviceIdentity(), b = DeviceIdentity(), c = DeviceIdentity(), d = DeviceIdentity()
        let genesis = randomSecret()
        let create = try log.add(a, .create(salt: log.salt))
        func sealGenesis(to device: DeviceIdentity) throws -> [KeyEnvelope] {
            [try KeyEnvelope(sealing: genesis, space: log.space, epoch: 1, keyOp: create.hash, to: device.publicKeys)]
        }
        try log.add(a, .add(device: b.publicKeys, role: .admin), envelopes: try sealGenesis(to: b))
        try log.add(a, .add(device: c.publicKeys, role: .writer), envelopes: try sealGenesis(to: c))
        #expect(log.state.missingKeys.isEmpty, "the creator needs no envelope for the key it made")
        // a removes c (epoch 2, sealed to a and b) while b, not knowing it, adds d with the keys b holds.
        let fork = log.state.heads
        let (remove, sealed) = try log.removal(a, removing: c, epoch: 2, to: [a, b], secret: randomSecret())
        let rotation = try log.add(a, remove, parents: fork, envelopes: sealed)
        try log.add(b, .add(device: d.publicKeys, role: .writer), parents: fork, envelopes: try sealGenesis(to: d))
        var s = log.state
        let epoch2 = EpochKeyID(epoch: 2, op: rotation.hash)
        #expect(s.current.map(\.keys) == [a.publicKeys, b.publicKeys, d.publicKeys] && s.currentEpoch == 2)
        #expect(s.missingKeys.map { $0.member.keys } == [d.publicKeys] && s.missingKeys.first?.keys == [epoch2])
        #expect(s.currentSecret(s.keys(for: d)) == nil, "d cannot read what is sealed under epoch 2")
        // Any admin holding the key grants it; then d reads and seals the current epoch like everyone else.
        let secret = try #require(s.keys(for: b)[epoch2])
        try log.add(b, .grant, envelopes: [try KeyEnvelope(sealing: secret, space: log.space, epoch: 2, keyOp: rotation.hash, to: d.publicKeys)])
        s = log.state
        #expect(s.missingKeys.isEmpty && s.void.isEmpty)
        #expect(s.currentSecret(s.keys(for: d)) != nil && s.currentSecret(s.keys(for: d)) == s.currentSecret(s.keys(for: a)))
        #expect(s.currentSecret(s.keys(for: c)) == nil)
    }

    @Test func aCreateIsOnlyTheFirstAndOpsOfOtherSpacesOrWithMissingParentsWait() throws {
        var log = LogBuilder()
        let a = DeviceIdentity(), x = DeviceIdentity()
        let root = try log.add(a, .create(salt: log.salt))
        let second = try log.add(x, .create(salt: log.salt), parents: [])
        #expect(log.state.applied == [root.hash] || log.state.applied == [second.hash])
        #expect(log.state.void.count == 1)
        let orphan = try MembershipOp(
            space: log.space, author: a, timeMs: 5, parents: [EntryHash(bytes: [UInt8](repeating: 7, count: 32))!], action: .grant)
        let foreign = try MembershipOp(space: SpaceKey.generate().id, author: a, timeMs: 5, parents: [], action: .create(salt: log.salt))
        let s = MembershipState(space: log.space, ops: log.ops + [orphan, foreign])
        #expect(s.waiting == [orphan.hash] && !s.applied.contains(foreign.hash))
    }

    /// Devices act on their own partial views (partitions), exchange ops now and then, and finally all hold every op.
    /// Whatever the order the ops are resolved in, the result is the same; a space always keeps an admin; every
    /// applied op's author was a current admin; removed devices never return.
    @Test func randomHistoriesResolveTheSameWhateverTheOrder() throws {
        var rng = SeededRandom(seed: testSeed("membership histories"))
        var (voided, removals, combined) = (0, 0, 0)
        for _ in 0..<12 {
            let devices = (0..<6).map { _ in DeviceIdentity() }
            let salt = SpaceKey.generate().id.bytes
            let space = MembershipOp.spaceID(creator: devices[0].publicKeys, salt: salt)
            let create = try MembershipOp(space: space, author: devices[0], timeMs: 1, parents: [], action: .create(salt: salt))
            var views: [[MembershipOp]] = Array(repeating: [], count: devices.count)
            views[0] = [create]
            var all = [create]
            /// An operation by admin `i` made on `ops` (its view) about device `target`: add it if never added,
            /// remove it if current (rotating), else a grant. Nil when `i` is not a current admin there.
            func act(_ i: Int, on ops: [MembershipOp], about target: Int, step: Int) throws -> MembershipOp? {
                let view = MembershipState(space: space, ops: ops)
                guard let me = view.member(devices[i].nodeID), me.isCurrent, me.role == .admin else { return nil }
                let action: MembershipOp.Action
                var envelopes: [KeyEnvelope] = []
                if view.member(devices[target].nodeID) == nil {
                    let role = i == 0 && target == 1 ? .admin : MemberRole.allCases.randomElement(using: &rng)!
                    action = .add(device: devices[target].publicKeys, role: role)
                } else if view.member(devices[target].nodeID)?.isCurrent == true {
                    let epoch = view.currentEpoch.next
                    action = .remove(device: devices[target].nodeID, cutoff: UInt64(step), epoch: epoch)
                    let secret = randomSecret()
                    for m in view.current where m.keys != devices[target].publicKeys {
                        envelopes.append(try KeyEnvelope(sealing: secret, space: space, epoch: epoch, keyOp: KeyEnvelope.thisOp, to: m.keys))
                    }
                } else {
                    action = .grant
                }
                return try MembershipOp(
                    space: space, author: devices[i], timeMs: UInt64(step), parents: view.heads, action: action,
                    envelopes: envelopes)
            }
            // A second admin from the start, so that concurrent admin operations can happen.
            let second = try #require(try act(0, on: views[0], about: 1, step: 0))
            views[0].append(second)
            all.append(second)
            for step in 1..<40 {
                let i = Int.random(in: 0..<devices.count, using: &rng)
                switch Int.random(in: 0..<4, using: &rng) {
                case 0, 1:
                    // Two devices exchange everything they hold.
                    let j = Int.random(in: 0..<devices.count, using: &rng)
                    let union = Array(Set(views[i] + views[j]))
                    views[i] = union
                    views[j] = union
                case 2:
                    // Two admins who both hold i's view act on the same device at once (a conflict to resolve).
                    let view = MembershipState(space: space, ops: views[i])
                    let admins = devices.indices.filter {
                        view.member(devices[$0].nodeID)?.isCurrent == true && view.member(devices[$0].nodeID)?.role == .admin
                    }
                    guard admins.count >= 2 else { continue }
                    let pair = Array(admins.shuffled(using: &rng).prefix(2))
                    let target = devices.indices.filter { !pair.contains($0) }.randomElement(using: &rng)!
                    for a in pair {
                        guard let op = try act(a, on: views[i], about: target, step: step) else { continue }
                        views[a] = Array(Set(views[a] + views[i])) + [op]
                        all.append(op)
                    }
                default:
                    let target = devices.indices.filter { $0 != i }.randomElement(using: &rng)!
                    guard let op = try act(i, on: views[i], about: target, step: step) else { continue }
                    views[i].append(op)
                    all.append(op)
                }
            }
            let reference = MembershipState(space: space, ops: all)
            voided += reference.void.count
            removals += reference.members.values.filter { !$0.isCurrent }.count
            combined += reference.frontier.count > 1 ? 1 : 0
            #expect(reference.waiting.isEmpty && reference.applied.count + reference.void.count == all.count)
            #expect(reference.current.contains { $0.role == .admin })
            for _ in 0..<3 {
                let other = MembershipState(space: space, ops: all.shuffled(using: &rng))
                #expect(other.applied == reference.applied && other.void == reference.void)
                #expect(other.members == reference.members && other.frontier == reference.frontier)
                #expect(other.heads == reference.heads && other.currentEpoch == reference.currentEpoch)
            }
            // Replaying the processing order step by step: each applied op's author was a current admin just before
            // it (resolving a prefix of the order processes it the same way).
            let byHash = Dictionary(uniqueKeysWithValues: all.map { ($0.hash, $0) })
            var prefix: [MembershipOp] = []
            for hash in reference.order {
                let op = byHash[hash]!
                if case .create = op.action {} else if reference.void[hash] == nil {
                    let before = MembershipState(space: space, ops: prefix)
                    #expect(before.member(op.author.nodeID)?.role == .admin && before.member(op.author.nodeID)?.isCurrent == true)
                }
                prefix.append(op)
            }
        }
        // The histories exercised what they are for: void operations (concurrent admins) and removals.
        #expect(voided > 0 && removals > 0, "void \(voided), removals \(removals), combined epochs \(combined)")
    }

    @Test func aJoinProofBindsTheInviteToOneDeviceAndNeverShowsTheSecret() throws {
        let space = SpaceID(bytes: SpaceKey.randomBytes(16))!, id = SpaceKey.randomBytes(16)
        let invite = try InviteToken(
            space: space, capability: SpaceKey.randomBytes(32), id: id, secret: SpaceKey.randomSecret(), address: "h:1")
        let kept = InviteToken.verifier(invite.secret)
        let joiner = DeviceIdentity().publicKeys, relay = DeviceIdentity().publicKeys
        let proof = invite.joinProof(device: joiner)
        func check(_ proof: [UInt8], kept: [UInt8] = kept, space: SpaceID = space, invite: [UInt8] = id, device: DevicePublicKeys = joiner) -> Bool {
            InviteToken.checkJoinProof(proof, kept: kept, version: 2, space: space, invite: invite, device: device)
        }
        #expect(check(proof))
        // Whoever carries it cannot move it to another device, another space, or another invite.
        #expect(!check(proof, device: relay))
        #expect(!check(proof, space: SpaceID(bytes: SpaceKey.randomBytes(16))!))
        #expect(!check(proof, invite: SpaceKey.randomBytes(16)))
        #expect(!check(proof, kept: InviteToken.verifier(SpaceKey.randomSecret())))
        var flipped = proof
        flipped[0] ^= 1
        #expect(!check(flipped))
        // Neither the secret nor what the member keeps is in it, and what the member keeps makes no proof: the
        // version-1 scheme's HMAC keyed with the stored value (what a copy of the member's database allows) fails.
        #expect(proof.count == 64 && proof.firstRange(of: invite.secret) == nil && proof.firstRange(of: kept) == nil)
        let fromCopy = try InviteToken(
            space: space, capability: invite.capability, id: id, secret: kept, address: "h:1", version: 1)
        #expect(!check(fromCopy.joinProof(device: joiner)))
        #expect(!InviteToken.checkJoinProof(proof, kept: kept, version: 1, space: space, invite: id, device: joiner))
        // Version-1 tokens (issued before) still prove against SHA-256 of the secret.
        let legacy = try InviteToken(text: InviteToken.legacyPrefix + String(invite.text.dropFirst(InviteToken.prefix.count)))
        #expect(legacy.version == 1 && legacy.secret == invite.secret)
        let old = legacy.joinProof(device: joiner)
        #expect(InviteToken.checkJoinProof(
            old, kept: InviteToken.secretHash(invite.secret), version: 1, space: space, invite: id, device: joiner))
        #expect(!InviteToken.checkJoinProof(
            old, kept: InviteToken.secretHash(invite.secret), version: 1, space: space, invite: id, device: relay))
        let reread = try InviteToken(text: invite.text)
        #expect(invite.text.hasPrefix(InviteToken.prefix) && reread == invite)
    }
}
