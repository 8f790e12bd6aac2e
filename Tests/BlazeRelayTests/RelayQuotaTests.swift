import BlazeCrypto
import BlazeSync
import Testing

@testable import BlazeRelay

/// A space's quota on the relay (Protocol/RELAY.md, "What it does"): what counts in it, and what it never refuses.
@Suite struct RelayQuotaTests {
    let key = SpaceKey.generate()

    @Test(arguments: Backend.allCases) func operationsCountInTheSpacesBytesAndAreNeverRefusedForThem(backend: Backend) async throws {
        let admin = DeviceIdentity()
        func op(_ t: UInt64) throws -> MembershipOp {
            try MembershipOp(space: key.id, author: admin, timeMs: t, parents: [], action: .grant, envelopes: [])
        }
        let ops = try (1...3).map(op)
        let opBytes = ops.reduce(0) { $0 + $1.bytes.count }
        var limits = RelayLimits()
        limits.maxBytesPerSpace = opBytes
        let temp = try await TempRelay(backend, limits: limits)
        let relay = temp.store
        _ = try await relay.add(RelayCapability(key: key))
        #expect(try await relay.addOps(ops, space: key.id).count == 3)
        #expect(try await relay.usage(space: key.id).bytes == opBytes)
        #expect(try await relay.addOps(ops, space: key.id).isEmpty, "held already")
        #expect(try await relay.usage(space: key.id).bytes == opBytes, "counted once")
        // The space is full: operations still go in (a removal must get through), entries do not.
        #expect(try await relay.addOps([try op(10)], space: key.id).count == 1)
        let w = try Writer(key: key)
        try w.write(1, key: key)
        let batch = try #require(try w.db.entryBatch(origin: w.origin, after: 0, maxEntries: 10))
        await #expect(throws: SyncRejection.overQuota) { try await relay.store(batch, space: key.id, membership: nil) }
    }
}
