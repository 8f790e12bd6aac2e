import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

@testable import BlazeCrypto

/// A merge resolves once and opens only new envelopes (`MembershipLog.taken`, `MembershipState.keys(for:opened:)`),
/// and gets exactly the state a full resolution of the same operations gets.
@Suite struct MembershipMergeTests {
    /// A random log of admins, writers, readers, a stranger, removals (rotations), concurrent branches and operations
    /// nobody can apply, taken in by batches in a random order: after each batch the state `taken` returns, and the
    /// keys opened with the envelopes of earlier batches, are those of a full resolution of what the log kept.
    @Test func mergingByBatchesGivesTheFullResolution() throws {
        let base = testSeed("membership merge")
        for run in 0..<6 { try Self.run(seed: base &+ UInt64(run)) }
    }

    static func run(seed: UInt64) throws {
        var rng = SeededRandom(seed: seed)
        var log = LogBuilder()
        let a = DeviceIdentity(), b = DeviceIdentity(), w = DeviceIdentity(), r = DeviceIdentity(), stranger = DeviceIdentity()
        try log.add(a, .create(salt: log.salt))
        try log.add(a, .add(device: b.publicKeys, role: .admin))
        try log.add(a, .add(device: w.publicKeys, role: .writer))
        try log.add(a, .add(device: r.publicKeys, role: .reader))
        var devices = [a, b, w, r, stranger]
        var epoch: Epoch = 1
        for _ in 0..<60 {
            let author = devices[Int(rng.next() % UInt64(devices.count))]
            // Parents: the heads, or one to three random operations (a concurrent branch).
            let parents = rng.next() % 3 == 0 ? nil : (0...(rng.next() % 3)).map { _ in log.ops[Int(rng.next() % UInt64(log.ops.count))].hash }
            switch rng.next() % 10 {
            case 0, 1:
                let device = DeviceIdentity()
                devices.append(device)
                try log.add(author, .add(device: device.publicKeys, role: [.admin, .writer, .reader][Int(rng.next() % 3)]), parents: parents)
            case 2, 3:
                epoch = epoch.next
                let target = devices[Int(rng.next() % UInt64(devices.count))]
                let (remove, envelopes) = try log.removal(author, removing: target, epoch: epoch, to: [a, b, w, r], secret: randomSecret())
                try log.add(author, remove, parents: parents, envelopes: envelopes)
            default:
                try log.add(author, .grant, parents: parents)
            }
        }
        // Every operation arrives once, in a random order, in batches of 1 to 8.
        var arrivals = Array(log.ops.dropFirst())
        arrivals.shuffle(using: &rng)
        var held = [log.ops[0]]
        var state = MembershipState(space: log.space, ops: held)
        var opened: [[KeyEnvelope: [UInt8]]] = Array(repeating: [:], count: 4)
        while !arrivals.isEmpty {
            let batch = Array(arrivals.prefix(1 + Int(rng.next() % 8)))
            arrivals.removeFirst(batch.count)
            let (kept, resolved, _) = MembershipLog.taken(batch, held: held, space: log.space, resolvedHeld: state)
            #expect(kept.map(\.hash) == MembershipLog.kept(batch, held: held, space: log.space, resolvedHeld: state).map(\.hash))
            #expect((resolved == nil) == kept.isEmpty, "seed \(seed)")
            held += kept
            state = resolved ?? state
            let full = MembershipState(space: log.space, ops: held)
            #expect(Self.describe(state) == Self.describe(full), "seed \(seed)")
            for (i, device) in [a, b, w, r].enumerated() {
                #expect(state.keys(for: device, opened: &opened[i]) == full.keys(for: device), "seed \(seed)")
            }
        }
    }

    /// A resolution extended by operations that name every operation processed so far that nothing names yet
    /// (`MembershipState.extended(by:)`) is field by field the full resolution of the log with them, for admins'
    /// adds, rotations and grants, and for operations that are void (a reader's, a stranger's, a removed admin's).
    /// Operations naming only the heads or random ones are not extended (nil), and then resolved in full.
    @Test func anExtendedResolutionIsTheFullOne() throws {
        let base = testSeed("membership extend")
        for run in 0..<6 {
            let seed = base &+ UInt64(run)
            var rng = SeededRandom(seed: seed)
            var log = LogBuilder()
            let a = DeviceIdentity(), b = DeviceIdentity(), w = DeviceIdentity(), r = DeviceIdentity(), stranger = DeviceIdentity()
            try log.add(a, .create(salt: log.salt))
            var devices = [a, b, w, r, stranger]
            var state = log.state
            var extended = 0, refused = 0
            for step in 0..<80 {
                // Parents: every tip (extends), the heads (extends only while no void operation is a tip), random ones.
                let named = Set(log.ops.flatMap(\.parents))
                let tips = log.ops.map(\.hash).filter { !named.contains($0) }
                let choice = rng.next() % 4
                let parents = choice < 2 ? tips : choice == 2 ? state.heads : [log.ops[Int(rng.next() % UInt64(log.ops.count))].hash]
                let author = step < 3 ? a : devices[Int(rng.next() % UInt64(devices.count))]
                let op: MembershipOp
                switch step < 3 ? 0 : rng.next() % 10 {
                case 0, 1:
                    let device = step == 0 ? b : step == 1 ? w : step == 2 ? r : DeviceIdentity()
                    if step > 2 { devices.append(device) }
                    let role: MemberRole = step == 0 ? .admin : step == 1 ? .writer : step == 2 ? .reader : [.admin, .writer, .reader][Int(rng.next() % 3)]
                    op = try log.add(author, .add(device: device.publicKeys, role: role), parents: parents)
                case 2, 3:
                    let target = devices[Int(rng.next() % UInt64(devices.count))]
                    let (remove, envelopes) = try log.removal(
                        author, removing: target, epoch: state.currentEpoch.next, to: [a, b, w, r], secret: randomSecret())
                    op = try log.add(author, remove, parents: parents, envelopes: envelopes)
                default:
                    op = try log.add(author, .grant, parents: parents)
                }
                let full = log.state
                if let next = state.extended(by: [op]) {
                    extended += 1
                    #expect(Self.describe(next) == Self.describe(full), "seed \(seed), step \(step)")
                    for device in [a, b, w, r] { #expect(next.keys(for: device) == full.keys(for: device), "seed \(seed)") }
                } else {
                    refused += 1
                    #expect(!Set(tips).isSubset(of: op.parents) || !state.waiting.isEmpty, "seed \(seed), step \(step)")
                }
                state = full
            }
            #expect(extended >= 20 && refused >= 5, "seed \(seed): \(extended) extended, \(refused) not")
        }
    }

    /// Everything a resolution decides, as comparable text.
    static func describe(_ s: MembershipState) -> String {
        let members = s.members.sorted { $0.key < $1.key }.map {
            "\($0.key) \($0.value.role) \($0.value.seniority) \($0.value.removal.map { "\(hexString($0.by)) \($0.cutoff)" } ?? "-")"
        }
        let keys = { (k: [EpochKeyID]) in k.map { "\($0.epoch):\($0.op.hex)" } }
        return [
            members.joined(separator: ","), s.applied.map(\.hex).joined(separator: ","), s.order.map(\.hex).joined(separator: ","),
            s.void.keys.map(\.hex).sorted().joined(separator: ","), s.waiting.map(\.hex).sorted().joined(separator: ","),
            s.heads.map(\.hex).joined(separator: ","), keys(s.epochKeys).joined(separator: ","), keys(s.frontier).joined(separator: ","),
            s.combinations.map { keys($0).joined(separator: "+") }.joined(separator: ","), "\(s.currentEpoch)",
        ].joined(separator: "\n")
    }

    /// An envelope opened once is not opened again: the key a later resolution gives is the one recorded for it
    /// (here a different secret, in a log without commitments, which would otherwise be taken as is).
    @Test func anOpenedEnvelopeIsNotOpenedAgain() throws {
        var log = LogBuilder()
        let a = DeviceIdentity(), w = DeviceIdentity()
        try log.add(a, .create(salt: log.salt))
        try log.add(a, .add(device: w.publicKeys, role: .writer))
        let secret = randomSecret()
        let (remove, envelopes) = try log.removal(a, removing: DeviceIdentity(), epoch: 2, to: [w], secret: secret)
        _ = remove
        try log.add(a, .add(device: DeviceIdentity().publicKeys, role: .reader))
        let target = log.ops.last!
        guard case .add(let device, _) = target.action else { return }
        let rotation = try MembershipOp(
            space: log.space, author: a, timeMs: 9_999, parents: log.state.heads, action: .remove(device: device.nodeID, cutoff: 0, epoch: 2),
            envelopes: envelopes)
        log.ops.append(rotation)
        let state = log.state
        var opened: [KeyEnvelope: [UInt8]] = [:]
        let key = EpochKeyID(epoch: 2, op: rotation.hash)
        #expect(state.keys(for: w, opened: &opened)[key] == secret && opened[envelopes[0]] == secret)
        let recorded = randomSecret()
        opened[envelopes[0]] = recorded
        #expect(state.keys(for: w, opened: &opened)[key] == recorded)
        opened[envelopes[0]] = []
        #expect(state.keys(for: w, opened: &opened)[key] == nil)
    }
}
