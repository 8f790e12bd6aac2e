import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

@testable import BlazeCrypto

/// What a log keeps of the operations it is sent (`MembershipLog.kept`, SYNC.md §9, "What the log keeps"), and that
/// operations nobody can apply never grow the parents of an admin's next operation.
@Suite struct MembershipLogTests {
    /// A space with admin `a`, a second admin `d` (removed), a writer `w` and a reader `r`.
    struct Space {
        var log = LogBuilder()
        let a = DeviceIdentity(), d = DeviceIdentity(), w = DeviceIdentity(), r = DeviceIdentity()

        init() throws {
            try log.add(a, .create(salt: log.salt))
            try log.add(a, .add(device: d.publicKeys, role: .admin))
            try log.add(a, .add(device: w.publicKeys, role: .writer))
            try log.add(a, .add(device: r.publicKeys, role: .reader))
            let (remove, envelopes) = try log.removal(a, removing: d, epoch: 2, to: [a, w, r], secret: randomSecret())
            try log.add(a, remove, envelopes: envelopes)
        }

        /// `count` grants signed by `author`, each on top of the log's heads (all concurrent) or of the previous one.
        func junk(by author: DeviceIdentity, count: Int, chained: Bool = false) throws -> [MembershipOp] {
            var out: [MembershipOp] = []
            for i in 0..<count {
                let parents = chained ? (out.last.map { [$0.hash] } ?? log.state.heads) : log.state.heads
                out.append(
                    try MembershipOp(space: log.space, author: author, timeMs: 5_000 + UInt64(i), parents: parents, action: .grant))
            }
            return out
        }
    }

    /// A reader that signed 65 grants on the same heads used to make every admin's next operation name 66 parents
    /// (over `maxParents`): no revocation, admission or key grant could be made on any member again.
    @Test func operationsNobodyCanApplyAreNeitherKeptNorHeads() throws {
        var s = try Space()
        let byReader = try s.junk(by: s.r, count: 65), byWriter = try s.junk(by: s.w, count: 3)
        #expect(MembershipLog.kept(byReader + byWriter, held: s.log.ops, space: s.log.space).isEmpty)
        // Even held (by a device that stored them before this rule), they are void and never heads.
        let state = MembershipState(space: s.log.space, ops: s.log.ops + byReader + byWriter)
        #expect(byReader.allSatisfy { state.void[$0.hash] == "author is not an admin" })
        #expect(state.heads == [s.log.ops.last!.hash])
        s.log.ops += byReader + byWriter
        let (remove, envelopes) = try s.log.removal(s.a, removing: s.r, epoch: 3, to: [s.a, s.w], secret: randomSecret())
        let revocation = try s.log.add(s.a, remove, envelopes: envelopes)
        #expect(s.log.state.member(s.r.nodeID)?.isCurrent == false && s.log.state.void[revocation.hash] == nil)
    }

    /// Operations dropped when they came alone are held aside for the sender's exchange (`SetAsideOps`): one that a
    /// later admin operation names (or that a held operation waiting for a parent names) is taken then, the rest stay
    /// out, and the set aside stays within its bounds.
    @Test func operationsSetAsideAreTakenWhenALaterOneNamesThem() throws {
        let s = try Space()
        let junk = try s.junk(by: s.w, count: 3, chained: true)
        var aside = SetAsideOps()
        let first = MembershipLog.taken(junk, held: s.log.ops, space: s.log.space)
        #expect(first.kept.isEmpty && first.dropped.map(\.hash) == junk.map(\.hash))
        aside.update(kept: first.kept, dropped: first.dropped)
        // An admin operation naming the last of the chain, sent alone.
        let grant = try MembershipOp(
            space: s.log.space, author: s.a, timeMs: 9_000, parents: s.log.state.heads + [junk[2].hash], action: .grant)
        let without = MembershipLog.taken([grant], held: s.log.ops, space: s.log.space)
        #expect(without.kept.map(\.hash) == [grant.hash] && without.resolved?.waiting == [grant.hash], "waits without the set-aside")
        let with = MembershipLog.taken([grant], held: s.log.ops, space: s.log.space, aside: aside.ops)
        #expect(Set(with.kept.map(\.hash)) == Set((junk + [grant]).map(\.hash)))
        #expect(with.resolved?.applied.last == grant.hash && with.resolved?.waiting.isEmpty == true)
        aside.update(kept: with.kept, dropped: with.dropped)
        #expect(aside.ops.isEmpty)
        // Held waiting (it came before on another connection), it takes the set-aside operations at the next merge.
        var again = SetAsideOps()
        again.update(kept: [], dropped: junk)
        let other = try s.junk(by: s.r, count: 1)
        let waiting = MembershipLog.taken(other, held: s.log.ops + [grant], space: s.log.space, aside: again.ops)
        #expect(Set(waiting.kept.map(\.hash)) == Set(junk.map(\.hash)) && waiting.resolved?.waiting.isEmpty == true)
        #expect(waiting.dropped.map(\.hash) == other.map(\.hash))
        // Bounded: the oldest go first.
        var bounded = SetAsideOps()
        let many = try s.junk(by: s.r, count: SetAsideOps.maxOps + 10)
        bounded.update(kept: [], dropped: many)
        #expect(bounded.ops.count == SetAsideOps.maxOps && bounded.ops[many[0].hash] == nil && bounded.ops[many.last!.hash] != nil)
    }

    /// What a peer sends is decoded without its signature checked (`MembershipOp(unverified:)`); the log checks the
    /// signatures of what it could keep: an operation claiming an admin's key that does not verify is not kept, and
    /// the reader's operations it names are not pulled in with it.
    @Test func anOperationWhoseSignatureDoesNotVerifyIsNotKeptNorPullsItsPast() throws {
        let s = try Space()
        let junk = try s.junk(by: s.r, count: 2, chained: true)
        let real = try MembershipOp(
            space: s.log.space, author: s.a, timeMs: 9_000, parents: s.log.state.heads + [junk[1].hash], action: .grant)
        var bytes = real.bytes
        bytes[bytes.count - 1] ^= 1
        let forged = try MembershipOp(unverified: bytes)
        #expect(throws: MembershipError.self) { try MembershipOp(bytes: bytes) }
        #expect(!forged.signaturesVerify && real.signaturesVerify)
        let taken = MembershipLog.taken(junk + [forged], held: s.log.ops, space: s.log.space, resolvedHeld: s.log.state)
        #expect(taken.kept.isEmpty && taken.dropped.count == 3)
        // The genuine one is kept with the past it names.
        #expect(Set(MembershipLog.kept(junk + [real], held: s.log.ops, space: s.log.space).map(\.hash)) == Set((junk + [real]).map(\.hash)))
    }

    /// A removed admin's operations are kept (one concurrent with its removal may still take effect), up to its
    /// quota; an admin's operations beyond it are dropped while every other admin's still go in.
    @Test func eachAuthorHasAQuota() throws {
        let s = try Space()
        let flood = try s.junk(by: s.d, count: MembershipLog.maxOpsPerAuthor + 5, chained: true)
        let kept = MembershipLog.kept(flood, held: s.log.ops, space: s.log.space)
        // The removed admin already authored nothing in the held log: exactly its quota goes in, in order.
        #expect(kept.count == MembershipLog.maxOpsPerAuthor && kept.map(\.hash) == flood.prefix(kept.count).map(\.hash))
        let held = s.log.ops + kept
        #expect(MembershipLog.kept(Array(flood.suffix(5)), held: held, space: s.log.space).isEmpty)
        let byAdmin = try MembershipOp(
            space: s.log.space, author: s.a, timeMs: 9_000, parents: MembershipState(space: s.log.space, ops: held).heads, action: .grant)
        #expect(MembershipLog.kept([byAdmin], held: held, space: s.log.space) == [byAdmin])
    }

    /// An operation a kept admin operation names as a parent is kept, whoever signed it: a log written before the
    /// rule may name a non-admin's operation, and dropping it would leave the admin's operation waiting forever.
    @Test func aParentOfAnAdminsOperationIsKept() throws {
        let s = try Space()
        let old = try s.junk(by: s.w, count: 1)[0]
        let child = try MembershipOp(
            space: s.log.space, author: s.a, timeMs: 9_000, parents: s.log.state.heads + [old.hash], action: .grant)
        let kept = MembershipLog.kept([child, old], held: s.log.ops, space: s.log.space)
        #expect(Set(kept.map(\.hash)) == [child.hash, old.hash])
        let state = MembershipState(space: s.log.space, ops: s.log.ops + kept)
        #expect(state.waiting.isEmpty && state.void[child.hash] == nil && state.heads == [child.hash])
    }

    /// A held operation waiting for its past pulls that past in, whoever signed it: an admin's operation kept earlier
    /// named a writer's operation whose own parent was dropped; when the parent comes again it is kept, and the log
    /// waits for nothing.
    @Test func thePastOfAWaitingOperationIsKept() throws {
        let s = try Space()
        let w1 = try s.junk(by: s.w, count: 1)[0]
        let w2 = try MembershipOp(space: s.log.space, author: s.w, timeMs: 7_000, parents: [w1.hash], action: .grant)
        let byAdmin = try MembershipOp(space: s.log.space, author: s.a, timeMs: 8_000, parents: s.log.state.heads + [w2.hash], action: .grant)
        let held = s.log.ops + [w2, byAdmin]
        #expect(MembershipState(space: s.log.space, ops: held).waiting == [w2.hash, byAdmin.hash])
        #expect(MembershipLog.kept([w1], held: held, space: s.log.space) == [w1])
        #expect(MembershipState(space: s.log.space, ops: held + [w1]).waiting.isEmpty)
        // All three arriving at once: the admin's operation takes effect, and its whole past is kept.
        #expect(Set(MembershipLog.kept([w1, w2, byAdmin], held: s.log.ops, space: s.log.space).map(\.hash)) == [w1.hash, w2.hash, byAdmin.hash])
    }

    /// What a removed admin's void operations bring along is on its account: naming 64 operations of fresh keys each
    /// does not multiply its quota.
    @Test func thePastAVoidOperationBringsIsOnItsAuthorsAccount() throws {
        let s = try Space()
        let signers = (0..<8).map { _ in DeviceIdentity() }
        var flood: [MembershipOp] = []
        for i in 0..<160 {
            let junk = try (0..<64).map { j in
                try MembershipOp(
                    space: s.log.space, author: signers[j % 8], timeMs: UInt64(i * 64 + j), parents: s.log.state.heads, action: .grant)
            }
            flood += junk
            flood.append(try MembershipOp(space: s.log.space, author: s.d, timeMs: 20_000 + UInt64(i), parents: junk.map(\.hash), action: .grant))
        }
        let kept = MembershipLog.kept(flood, held: s.log.ops, space: s.log.space)
        #expect(kept.count == MembershipLog.maxOpsPerAuthor, "\(kept.count) of \(flood.count) kept")
    }

    /// An admin's operation that takes effect is kept whatever its author's quota: the quota holds void operations
    /// only.
    @Test func whatTakesEffectIsNeverOverQuota() throws {
        let s = try Space()
        // A current admin adding the writer again, and again: each void ("device was already added").
        var void: [MembershipOp] = []
        for i in 0..<MembershipLog.maxOpsPerAuthor + 1 {
            void.append(
                try MembershipOp(
                    space: s.log.space, author: s.a, timeMs: 10_000 + UInt64(i), parents: [void.last?.hash ?? s.log.ops.last!.hash],
                    action: .add(device: s.w.publicKeys, role: .writer)))
        }
        let kept = MembershipLog.kept(void, held: s.log.ops, space: s.log.space)
        #expect(kept.count == MembershipLog.maxOpsPerAuthor)
        let held = s.log.ops + kept
        let grants = try (0..<3).map {
            try MembershipOp(space: s.log.space, author: s.a, timeMs: 30_000 + UInt64($0), parents: MembershipState(space: s.log.space, ops: held).heads, action: .grant)
        }
        #expect(MembershipLog.kept(grants, held: held, space: s.log.space).count == 3)
    }

    /// Operations of another space, and ones already held, are not kept again.
    @Test func foreignAndDuplicateOperationsAreNotKept() throws {
        let s = try Space(), other = try Space()
        let mine = try MembershipOp(space: s.log.space, author: s.a, timeMs: 9_000, parents: s.log.state.heads, action: .grant)
        #expect(MembershipLog.kept(other.log.ops + s.log.ops + [mine, mine], held: s.log.ops, space: s.log.space) == [mine])
    }

    /// The heap that picks the next ready operation makes the same choices as the scan earlier versions made (devices
    /// of adjacent versions must resolve a log alike): random logs with concurrent admins, removals, late-added
    /// authors and junk, resolved both ways.
    @Test func theHeapChoosesAsTheScanDid() throws {
        var rng = SeededRandom(seed: testSeed("membership choice"))
        for _ in 0..<20 {
            let devices = (0..<6).map { _ in DeviceIdentity() }
            let salt = SpaceKey.generate().id.bytes
            let space = MembershipOp.spaceID(creator: devices[0].publicKeys, salt: salt)
            var all = [try MembershipOp(space: space, author: devices[0], timeMs: 1, parents: [], action: .create(salt: salt))]
            for step in 0..<40 {
                // Each operation is made on a prefix of the log so far: concurrent with everything after it.
                let view = MembershipState(space: space, ops: Array(all.prefix(Int.random(in: 1...all.count, using: &rng))))
                let author = devices.randomElement(using: &rng)!
                let target = devices.randomElement(using: &rng)!
                let action: MembershipOp.Action
                var envelopes: [KeyEnvelope] = []
                if view.member(target.nodeID) == nil {
                    action = .add(device: target.publicKeys, role: MemberRole.allCases.randomElement(using: &rng)!)
                } else if view.member(target.nodeID)?.isCurrent == true, Bool.random(using: &rng) {
                    let epoch = view.currentEpoch.next
                    action = .remove(device: target.nodeID, cutoff: UInt64(step), epoch: epoch)
                    envelopes = try view.current.filter { $0.keys != target.publicKeys }.map {
                        try KeyEnvelope(sealing: randomSecret(), space: space, epoch: epoch, keyOp: KeyEnvelope.thisOp, to: $0.keys)
                    }
                } else {
                    action = .grant
                }
                all.append(
                    try MembershipOp(
                        space: space, author: author, timeMs: 2 + UInt64(step), parents: view.heads, action: action, envelopes: envelopes))
            }
            let shuffled = all.shuffled(using: &rng)
            let heap = MembershipState(space: space, ops: shuffled), scan = MembershipState(space: space, ops: shuffled, linearChoice: true)
            #expect(heap.order == scan.order && heap.applied == scan.applied && heap.void == scan.void)
            #expect(heap.heads == scan.heads && heap.members == scan.members && heap.frontier == scan.frontier)
        }
    }
}
