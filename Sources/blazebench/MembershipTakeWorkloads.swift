import BlazeCrypto
import BlazeProtocol
import Foundation

/// M3: what a member spends to take in one new operation on top of a log of `n` it holds (SYNC.md §9): keep it
/// (`MembershipLog.kept`), resolve, and open its epoch keys. The log is an admin's chain with a rotation every 20
/// operations (an envelope to the member each), so a member holds `n / 20` keys sealed to it.
extension MembershipWorkloads {
    static func take(sizes: [Int], merges: Int) throws -> [Result] {
        var results: [Result] = []
        for n in sizes {
            let admin = DeviceIdentity(), member = DeviceIdentity()
            let salt = SpaceKey.randomBytes(16)
            let space = MembershipOp.spaceID(creator: admin.publicKeys, salt: salt)
            func seal(_ secret: [UInt8], epoch: Epoch, to: [DeviceIdentity]) throws -> [KeyEnvelope] {
                try to.map { try KeyEnvelope(sealing: secret, space: space, epoch: epoch, keyOp: KeyEnvelope.thisOp, to: $0.publicKeys) }
            }
            let genesis = SpaceKey.randomSecret()
            var ops = [try MembershipOp(space: space, author: admin, timeMs: 1, parents: [], action: .create(salt: salt),
                envelopes: try seal(genesis, epoch: 1, to: [admin]))]
            ops.append(try MembershipOp(space: space, author: admin, timeMs: 2, parents: [ops[0].hash],
                action: .add(device: member.publicKeys, role: .writer),
                envelopes: [try KeyEnvelope(sealing: genesis, space: space, epoch: 1, keyOp: ops[0].hash, to: member.publicKeys)]))
            var epoch: Epoch = 1
            var passing: DeviceIdentity?
            while ops.count < n {
                let time = UInt64(ops.count + 1)
                let action: MembershipOp.Action
                var envelopes: [KeyEnvelope] = []
                if let device = passing {
                    epoch = epoch.next
                    action = .remove(device: device.nodeID, cutoff: 0, epoch: epoch)
                    envelopes = try seal(SpaceKey.randomSecret(), epoch: epoch, to: [admin, member])
                    passing = nil
                } else if ops.count % 20 == 0 {
                    let device = DeviceIdentity()
                    action = .add(device: device.publicKeys, role: .writer)
                    passing = device
                } else {
                    action = .grant
                }
                ops.append(try MembershipOp(space: space, author: admin, timeMs: time, parents: [ops.last!.hash], action: action, envelopes: envelopes))
            }
            var held = ops
            var state = MembershipState(space: space, ops: held)
            var samples: [Double] = [], full: [Double] = []
            var opened: [KeyEnvelope: [UInt8]] = [:]
            _ = state.keys(for: member, opened: &opened)
            for i in 0..<merges {
                let op = try MembershipOp(space: space, author: admin, timeMs: UInt64(n + 10 + i), parents: state.heads, action: .grant)
                // The baseline: the same operation taken in with the log resolved in full, as before resolutions extended.
                full.append(
                    try seconds {
                        let kept = MembershipLog.kept([op], held: held, space: space, resolvedHeld: state)
                        guard MembershipState(space: space, ops: held + kept).applied.count == n + i + 1 else { throw MembershipBenchFailure() }
                    } * 1000)
                samples.append(
                    try seconds {
                        let keys = takeIn([op], held: &held, state: &state, space: space, member: member, opened: &opened)
                        guard keys == Int(epoch.value), state.applied.count == n + i + 1 else { throw MembershipBenchFailure() }
                    } * 1000)
            }
            results.append(
                Result(
                    name: "M3.take\(n)", unit: "ms", samples: samples, better: "lower",
                    note: "one admin operation taken in on a log of \(n) (\(epoch) keys sealed to the member): keep, resolve, open keys"))
            results.append(
                Result(
                    name: "B_full\(n)", unit: "ms", samples: full, better: "lower",
                    note: "the same operation kept, then the log with it resolved in full (no envelope opened)"))
        }
        return results
    }

    /// What a member does with operations that arrive (`SharedSpace.merge`): keeps what the log keeps, with the log
    /// resolved once, and opens the envelopes it did not open before; returns how many keys it holds.
    static func takeIn(
        _ incoming: [MembershipOp], held: inout [MembershipOp], state: inout MembershipState, space: SpaceID, member: DeviceIdentity,
        opened: inout [KeyEnvelope: [UInt8]]
    ) -> Int {
        let (kept, resolved, _) = MembershipLog.taken(incoming, held: held, space: space, resolvedHeld: state)
        held += kept
        state = resolved ?? state
        return state.keys(for: member, opened: &opened).count
    }
}
