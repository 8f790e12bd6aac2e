import BlazeCrypto
import Foundation

/// M2: what taking in membership operations costs as a log grows (SYNC.md §9, "What the log keeps"): resolving a log
/// of `n` operations an admin made one after another, and a merge of `n` operations a reader signed all at once on
/// the same heads (a flood nobody can apply). The same-run baseline resolves with the choice the log used before the
/// heap: every ready operation scanned for each choice.
extension MembershipWorkloads {
    static func merge(sizes: [Int], repeats: Int) throws -> [Result] {
        var results: [Result] = []
        for n in sizes {
            let admin = DeviceIdentity(), reader = DeviceIdentity()
            let salt = SpaceKey.randomBytes(16)
            let space = MembershipOp.spaceID(creator: admin.publicKeys, salt: salt)
            let create = try MembershipOp(space: space, author: admin, timeMs: 1, parents: [], action: .create(salt: salt))
            let add = try MembershipOp(
                space: space, author: admin, timeMs: 2, parents: [create.hash], action: .add(device: reader.publicKeys, role: .reader))
            var chain = [create, add]
            for i in 0..<n {
                chain.append(try MembershipOp(space: space, author: admin, timeMs: 3 + UInt64(i), parents: [chain.last!.hash], action: .grant))
            }
            let flood = try (0..<n).map {
                try MembershipOp(space: space, author: reader, timeMs: 10 + UInt64($0), parents: [add.hash], action: .grant)
            }
            // A removed admin's chain of n void grants, which is kept (up to its quota) and so fully resolved.
            let formerAdmin = DeviceIdentity()
            var removed = [create, add]
            removed.append(
                try MembershipOp(space: space, author: admin, timeMs: 3, parents: [add.hash], action: .add(device: formerAdmin.publicKeys, role: .admin)))
            removed.append(
                try MembershipOp(
                    space: space, author: admin, timeMs: 4, parents: [removed.last!.hash],
                    action: .remove(device: formerAdmin.nodeID, cutoff: 0, epoch: 2)))
            var voidChain: [MembershipOp] = []
            for i in 0..<n {
                voidChain.append(
                    try MembershipOp(
                        space: space, author: formerAdmin, timeMs: 100 + UInt64(i), parents: [voidChain.last?.hash ?? removed.last!.hash],
                        action: .grant))
            }
            var resolveChain: [Double] = [], concurrent: [Double] = [], linear: [Double] = [], kept: [Double] = [], quota: [Double] = []
            for _ in 0..<repeats {
                resolveChain.append(try seconds { guard MembershipState(space: space, ops: chain).applied.count == n + 2 else { throw MembershipBenchFailure() } } * 1000)
                concurrent.append(seconds { _ = MembershipState(space: space, ops: [create, add] + flood) } * 1000)
                // The linear scan is quadratic: at 10,000 concurrent operations one resolution takes minutes.
                if n <= 2_000 { linear.append(seconds { _ = MembershipState(space: space, ops: [create, add] + flood, linearChoice: true) } * 1000) }
                quota.append(seconds { _ = MembershipLog.kept(voidChain, held: removed, space: space) } * 1000)
                kept.append(try seconds { guard MembershipLog.kept(flood, held: [create, add], space: space).isEmpty else { throw MembershipBenchFailure() } } * 1000)
            }
            results.append(Result(name: "M2.chain\(n)", unit: "ms", samples: resolveChain, better: "lower", note: "resolve \(n + 2) operations made one after another"))
            if !linear.isEmpty {
                results.append(Result(name: "B_linear\(n)", unit: "ms", samples: linear, better: "lower", note: "the choice before the heap: \(n) concurrent operations, each choice a scan"))
            }
            results.append(
                Result(
                    name: "M2.concurrent\(n)", unit: "ms", samples: concurrent, better: "lower", baseline: linear.isEmpty ? nil : "B_linear\(n)",
                    note: "resolve \(n) concurrent operations of a reader (all void)"))
            results.append(
                Result(name: "M2.kept\(n)", unit: "ms", samples: kept, better: "lower", note: "MembershipLog.kept refusing \(n) operations of a reader"))
            results.append(
                Result(
                    name: "M2.voidChain\(n)", unit: "ms", samples: quota, better: "lower",
                    note: "MembershipLog.kept taking \(n) void operations of a removed admin (resolved, on its account)"))
        }
        return results
    }
}
