import BlazeCrypto
import Crypto
import Foundation

/// M1: the cost of a revocation in a space of `members` devices (SYNC.md §9), on simulated devices: what the revoking
/// admin spends (a fresh key sealed with HPKE to every remaining member, the operation signed, the log resolved), what
/// each remaining member spends to take it in (resolve the log, open its envelope), and what each member receives.
enum MembershipWorkloads {
    static func revocation(members: Int, repeats: Int) throws -> [Result] {
        let devices = (0..<members).map { _ in DeviceIdentity() }
        let admin = devices[0]
        let salt = SpaceKey.randomBytes(16)
        let space = MembershipOp.spaceID(creator: admin.publicKeys, salt: salt)
        let genesis = SpaceKey.randomSecret()
        var time: UInt64 = 1_000
        let create = try MembershipOp(
            space: space, author: admin, timeMs: time, parents: [], action: .create(salt: salt),
            envelopes: [try KeyEnvelope(sealing: genesis, space: space, epoch: 1, keyOp: KeyEnvelope.thisOp, to: admin.publicKeys)])
        var ops = [create]
        for device in devices.dropFirst() {
            time += 1
            ops.append(
                try MembershipOp(
                    space: space, author: admin, timeMs: time, parents: [ops.last!.hash],
                    action: .add(device: device.publicKeys, role: .writer),
                    envelopes: [try KeyEnvelope(sealing: genesis, space: space, epoch: 1, keyOp: create.hash, to: device.publicKeys)]))
        }
        let before = MembershipState(space: space, ops: ops)

        // Baseline: the HPKE seals alone, one per remaining member.
        let recipients = before.current.dropFirst(2).map(\.keys) + [admin.publicKeys]
        var sealOnly: [Double] = []
        var revoke: [Double] = []
        var apply: [Double] = []
        var bytes = 0
        for r in 0..<repeats {
            let secret = SpaceKey.randomSecret()
            sealOnly.append(
                try seconds {
                    for to in recipients {
                        _ = try KeyEnvelope(sealing: secret, space: space, epoch: 2, keyOp: KeyEnvelope.thisOp, to: to)
                    }
                } * 1000)
            // What `db.revoke` computes: envelopes for every remaining member, the signed operation, the new log.
            let target = devices[1 + r % (members - 1)]
            var removal: MembershipOp?
            revoke.append(
                try seconds {
                    let envelopes = try before.current.filter { $0.keys != target.publicKeys }.map {
                        try KeyEnvelope(sealing: secret, space: space, epoch: 2, keyOp: KeyEnvelope.thisOp, to: $0.keys)
                    }
                    let op = try MembershipOp(
                        space: space, author: admin, timeMs: time + 1, parents: before.heads,
                        action: .remove(device: target.nodeID, cutoff: 0, epoch: 2), envelopes: envelopes)
                    _ = MembershipState(space: space, ops: ops + [op])
                    removal = op
                } * 1000)
            // What a remaining member does when the operation arrives: decode and verify it, resolve, open its key.
            let member = devices.first { $0.nodeID != target.nodeID && $0.nodeID != admin.nodeID }!
            let wire = removal!.bytes
            bytes = wire.count
            apply.append(
                try seconds {
                    let op = try MembershipOp(bytes: wire)
                    let after = MembershipState(space: space, ops: ops + [op])
                    guard after.currentSecret(after.keys(for: member)) != nil else { throw MembershipBenchFailure() }
                } * 1000)
        }
        let note = "\(members) members, \(members - 1) remaining"
        return [
            Result(name: "B_hpke.seal\(members - 1)", unit: "ms", samples: sealOnly, better: "lower", note: "HPKE seals alone"),
            Result(
                name: "M1.revoke\(members)", unit: "ms", samples: revoke, better: "lower", baseline: "B_hpke.seal\(members - 1)",
                note: note + "; the admin's side of db.revoke"),
            Result(
                name: "M1.apply\(members)", unit: "ms", samples: apply, better: "lower",
                note: "each remaining member: verify, resolve \(members + 1) operations, open its key"),
            Result(
                name: "M1.bytes\(members)", unit: "bytes", samples: [Double(bytes)], better: "lower",
                note: "the removal each member receives (\(members - 1) envelopes)"),
        ]
    }
}

/// The simulated member could not open the rotated key: the measurement would be of a broken revocation.
struct MembershipBenchFailure: Error, CustomStringConvertible {
    var description: String { "a remaining member got no key from the revocation" }
}
