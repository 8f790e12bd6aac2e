import BlazeCrypto
import BlazeProtocol
import Crypto
import Foundation
import Testing

/// A log that commits to its keys and its removals' cutoffs (SYNC.md §9, "Logs that commit"): no admin can hand chosen
/// members another key than the one the others hold, nor keep a removed device writing past what it signed.
@Suite struct KeyCommitmentTests {
    let admin = DeviceIdentity(), member = DeviceIdentity(), removed = DeviceIdentity()

    /// `device`'s own signed head of the entry `hash` at `seq` in `space` (SYNC.md §7).
    static func head(_ device: DeviceIdentity, space: SpaceID, seq: UInt64, hash: [UInt8]) throws -> SignedHead {
        var message = Array("blazedb head v1".utf8) + space.bytes + device.nodeID
        message.appendBE(seq)
        message += hash
        var bytes = device.nodeID
        bytes.appendBE(seq)
        bytes += hash + device.publicKeys.signing + Array(try device.signingKey.signature(for: message))
        return try SignedHead(bytes: bytes[...])
    }

    /// A log of `admin` adding `member` and `removed` (a writer), created in version 2 when `commits`; returns the
    /// space, the operations and the genesis secret.
    func log(commits: Bool) throws -> (space: SpaceID, ops: [MembershipOp], genesis: [UInt8]) {
        let salt = SpaceKey.randomBytes(16), genesis = SpaceKey.randomSecret()
        let space = MembershipOp.spaceID(creator: admin.publicKeys, salt: salt)
        let create = try MembershipOp(
            space: space, author: admin, timeMs: 1, parents: [], action: .create(salt: salt),
            envelopes: [try KeyEnvelope(sealing: genesis, space: space, epoch: 1, keyOp: KeyEnvelope.thisOp, to: admin.publicKeys)],
            commitment: commits ? KeyEnvelope.commitment(secret: genesis, space: space, epoch: 1) : nil)
        var ops = [create]
        for device in [member, removed] {
            ops.append(try MembershipOp(
                space: space, author: admin, timeMs: 2, parents: [ops.last!.hash], action: .add(device: device.publicKeys, role: .writer),
                envelopes: [try KeyEnvelope(sealing: genesis, space: space, epoch: 1, keyOp: create.hash, to: device.publicKeys)]))
        }
        return (space, ops, genesis)
    }

    /// An envelope naming its own operation binds no operation hash, so its bytes open inside any operation of its
    /// epoch: an admin copying the member's envelope of one rotation into a concurrent rotation committing to another
    /// key must not hand the member the first key under the second's name, even once the member opened the envelope
    /// (and recorded what it opened to) for the first.
    @Test func aCopiedEnvelopeIsCheckedAgainstTheKeyOfTheOperationCarryingIt() throws {
        let (space, ops, _) = try log(commits: true)
        let first = SpaceKey.randomSecret(), second = SpaceKey.randomSecret()
        func rotation(_ secret: [UInt8], removing device: DeviceIdentity, time: UInt64, memberEnvelope: KeyEnvelope? = nil) throws -> MembershipOp {
            try MembershipOp(
                space: space, author: admin, timeMs: time, parents: [ops.last!.hash], action: .remove(device: device.nodeID, cutoff: 0, epoch: 2),
                envelopes: [
                    try KeyEnvelope(sealing: secret, space: space, epoch: 2, keyOp: KeyEnvelope.thisOp, to: admin.publicKeys),
                    try memberEnvelope ?? KeyEnvelope(sealing: secret, space: space, epoch: 2, keyOp: KeyEnvelope.thisOp, to: member.publicKeys),
                ],
                commitment: KeyEnvelope.commitment(secret: secret, space: space, epoch: 2))
        }
        let op1 = try rotation(first, removing: removed, time: 3)
        let copied = try #require(op1.envelopes.first { $0.recipient == member.nodeID })
        let op2 = try rotation(second, removing: removed, time: 4, memberEnvelope: copied)
        var opened: [KeyEnvelope: [UInt8]] = [:]
        let before = MembershipState(space: space, ops: ops + [op1]).keys(for: member, opened: &opened)
        #expect(before[EpochKeyID(epoch: 2, op: op1.hash)] == first)
        let both = MembershipState(space: space, ops: ops + [op1, op2])
        #expect(both.epochKeys.contains(EpochKeyID(epoch: 2, op: op2.hash)), "both rotations create a key")
        let after = both.keys(for: member, opened: &opened)
        #expect(after[EpochKeyID(epoch: 2, op: op2.hash)] == nil, "the copied envelope does not deliver the second key")
        #expect(after[EpochKeyID(epoch: 2, op: op1.hash)] == first)
        #expect(both.keys(for: member)[EpochKeyID(epoch: 2, op: op2.hash)] == nil)
    }

    @Test func anAdminCannotHandAMemberAnotherKeyThanTheOneItCommittedTo() throws {
        for commits in [true, false] {
            let (space, ops, genesis) = try log(commits: commits)
            let state = MembershipState(space: space, ops: ops)
            #expect(state.commitsKeys == commits)
            // The genesis key reaches the member as committed.
            #expect(state.keys(for: member).values.contains(genesis))
            // A rotation that seals the admin one key and the member another.
            let real = SpaceKey.randomSecret(), bogus = SpaceKey.randomSecret()
            let head = try Self.head(removed, space: space, seq: 3, hash: SpaceKey.randomBytes(32))
            let rotate = try MembershipOp(
                space: space, author: admin, timeMs: 3, parents: [ops.last!.hash],
                action: .remove(device: removed.nodeID, cutoff: commits ? 3 : 0, epoch: 2),
                envelopes: [
                    try KeyEnvelope(sealing: real, space: space, epoch: 2, keyOp: KeyEnvelope.thisOp, to: admin.publicKeys),
                    try KeyEnvelope(sealing: bogus, space: space, epoch: 2, keyOp: KeyEnvelope.thisOp, to: member.publicKeys),
                ],
                commitment: commits ? KeyEnvelope.commitment(secret: real, space: space, epoch: 2) : nil,
                cutoffHead: commits ? head : nil)
            let after = MembershipState(space: space, ops: ops + [rotate])
            #expect(after.void[rotate.hash] == nil && after.currentEpoch == 2)
            let key = try #require(after.epochKeys.first { $0.op == rotate.hash })
            #expect(after.keys(for: admin)[key] == real)
            // With the commitment the member refuses the other key (it stays missing); a log of version 1 takes it.
            #expect(after.keys(for: member)[key] == (commits ? nil : bogus))
            // A key no applied operation created (an envelope naming a made-up operation, or its own grant) is
            // never taken, in either version.
            let grant = try MembershipOp(
                space: space, author: admin, timeMs: 4, parents: [rotate.hash], action: .grant,
                envelopes: [
                    try KeyEnvelope(sealing: bogus, space: space, epoch: 9, keyOp: EntryHash(bytes: SpaceKey.randomBytes(32))!, to: member.publicKeys),
                    try KeyEnvelope(sealing: bogus, space: space, epoch: 9, keyOp: KeyEnvelope.thisOp, to: member.publicKeys),
                ])
            let granted = MembershipState(space: space, ops: ops + [rotate, grant])
            #expect(granted.void[grant.hash] == nil)
            let held = granted.keys(for: member)
            #expect(held.keys.allSatisfy { granted.epochKeys.contains($0) } && granted.ring(held).allSatisfy { $0.epoch < 9 })
        }
    }

    @Test func aMemberSealedAnotherKeyNamesItInASignedAcknowledgement() throws {
        let (space, ops, _) = try log(commits: true)
        let real = SpaceKey.randomSecret(), bogus = SpaceKey.randomSecret()
        let head = try Self.head(removed, space: space, seq: 3, hash: SpaceKey.randomBytes(32))
        let rotate = try MembershipOp(
            space: space, author: admin, timeMs: 3, parents: [ops.last!.hash],
            action: .remove(device: removed.nodeID, cutoff: 3, epoch: 2),
            envelopes: [
                try KeyEnvelope(sealing: real, space: space, epoch: 2, keyOp: KeyEnvelope.thisOp, to: admin.publicKeys),
                try KeyEnvelope(sealing: bogus, space: space, epoch: 2, keyOp: KeyEnvelope.thisOp, to: member.publicKeys),
            ],
            commitment: KeyEnvelope.commitment(secret: real, space: space, epoch: 2), cutoffHead: head)
        let state = MembershipState(space: space, ops: ops + [rotate])
        let key = EpochKeyID(epoch: 2, op: rotate.hash)
        // The member lacks exactly the key it was sealed wrong; the admin lacks nothing; the removed device was
        // sealed no new key, so it may ask for none.
        #expect(state.keysSealedWrong(to: member.nodeID, held: state.keys(for: member)) == [key])
        #expect(state.keysSealedWrong(to: admin.nodeID, held: state.keys(for: admin)).isEmpty)
        #expect(state.sealed(key, to: member.nodeID) && !state.sealed(key, to: removed.nodeID))

        // The acknowledgement carries the list under its signature (version 2); without one it is version 1.
        let ack = Acknowledgement(space: space, vector: [member.nodeID: 4], issuedMs: 9, identity: member, lacking: [key, key])
        let decoded = try Acknowledgement(bytes: ack.bytes)
        #expect(decoded.lacking == [key] && decoded.vector == [member.nodeID: 4] && decoded == ack)
        let plain = Acknowledgement(space: space, vector: [member.nodeID: 4], issuedMs: 9, identity: member)
        #expect(try Acknowledgement(bytes: plain.bytes).lacking.isEmpty && plain.bytes.count + 2 + 36 == ack.bytes.count)
        // Any byte of the list changed, or the list cut off, fails.
        var flipped = ack.bytes
        flipped[flipped.count - 64 - 1] ^= 1
        #expect(throws: SyncRejection.self) { try Acknowledgement(bytes: flipped) }
        #expect(throws: SyncRejection.self) { try Acknowledgement(bytes: Array(ack.bytes.prefix(plain.bytes.count - 64)) + ack.bytes.suffix(64)) }
        // At most `maxLacking` keys are named.
        let many = (0..<100).map { EpochKeyID(epoch: Epoch(UInt32($0)), op: EntryHash(bytes: SpaceKey.randomBytes(32))!) }
        let capped = Acknowledgement(space: space, vector: [:], issuedMs: 1, identity: member, lacking: many)
        // The newest of them: the current epoch's key is never pushed out by older ones sealed wrong.
        let kept = try Acknowledgement(bytes: capped.bytes).lacking
        #expect(kept.count == Acknowledgement.maxLacking && kept.map(\.epoch).min() == 36 && kept.map(\.epoch).max() == 99)
    }

    @Test func aRemovalInACommittingLogCarriesItsKeyAndTheDevicesOwnHead() throws {
        let (space, ops, _) = try log(commits: true)
        let secret = SpaceKey.randomSecret()
        let commitment = KeyEnvelope.commitment(secret: secret, space: space, epoch: 2)
        func remove(cutoff: UInt64, commitment: [UInt8]?, head: SignedHead?) throws -> MembershipOp {
            try MembershipOp(
                space: space, author: admin, timeMs: 3, parents: [ops.last!.hash],
                action: .remove(device: removed.nodeID, cutoff: cutoff, epoch: 2),
                envelopes: [try KeyEnvelope(sealing: secret, space: space, epoch: 2, keyOp: KeyEnvelope.thisOp, to: admin.publicKeys)],
                commitment: commitment, cutoffHead: head)
        }
        // A version-1 removal (no commitment) is void in this log.
        let legacy = try remove(cutoff: 5, commitment: nil, head: nil)
        #expect(MembershipState(space: space, ops: ops + [legacy]).void[legacy.hash] == "a rotation without its key's commitment")
        // A cutoff needs the device's own head at that seq: a cutoff of 2^64 − 1, a head of another seq, another
        // device's head, or none, does not even decode.
        let signedAt5 = try Self.head(removed, space: space, seq: 5, hash: SpaceKey.randomBytes(32))
        #expect(throws: MembershipError.self) { try remove(cutoff: .max, commitment: commitment, head: signedAt5) }
        #expect(throws: MembershipError.self) { try remove(cutoff: 6, commitment: commitment, head: signedAt5) }
        #expect(throws: MembershipError.self) {
            try remove(cutoff: 5, commitment: commitment, head: try Self.head(member, space: space, seq: 5, hash: signedAt5.hash))
        }
        #expect(throws: MembershipError.self) { try remove(cutoff: 5, commitment: commitment, head: nil) }
        #expect(throws: MembershipError.self) {
            try remove(cutoff: 5, commitment: commitment, head: try Self.head(removed, space: SpaceID(bytes: SpaceKey.randomBytes(16))!, seq: 5, hash: signedAt5.hash))
        }
        // The real one: the removed device's entries are accepted up to 5, and at 5 only the entry it signed.
        let op = try remove(cutoff: 5, commitment: commitment, head: signedAt5)
        let reread = try MembershipOp(bytes: op.bytes)
        #expect(reread.version == 2 && reread.commitment == commitment && reread.cutoffHead == signedAt5)
        let state = MembershipState(space: space, ops: ops + [reread])
        #expect(state.void[op.hash] == nil)
        let origin = removed.nodeID
        #expect(state.acceptsBatch(origin: origin, head: 4, hashAt: { _ in nil }))
        #expect(state.acceptsBatch(origin: origin, head: 5, hashAt: { $0 == 5 ? signedAt5.hash : nil }))
        #expect(!state.acceptsBatch(origin: origin, head: 5, hashAt: { $0 == 5 ? SpaceKey.randomBytes(32) : nil }), "another entry at 5")
        #expect(!state.acceptsBatch(origin: origin, head: 6, hashAt: { _ in nil }), "past the cutoff")
        // Removing a device that wrote nothing needs no head.
        let none = try remove(cutoff: 0, commitment: commitment, head: nil)
        #expect(MembershipState(space: space, ops: ops + [none]).void[none.hash] == nil)
    }
}
