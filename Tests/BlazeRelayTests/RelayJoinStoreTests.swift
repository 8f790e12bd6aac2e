import BlazeCrypto
import BlazeProtocol
@testable import BlazeRelay
import BlazeStore
import BlazeSync
import Testing

/// Joins in the relay's store (Protocol/RELAY.md, "Joins"), the same on SQLite and PostgreSQL.
@Suite struct RelayJoinStoreTests {
    let key = SpaceKey.generate()

    /// A join of a fresh device, held by `holder` until `expiresMs`.
    func join(holder: String = "p 1", expiresMs: Int64 = 10_000) -> HeldJoin {
        HeldJoin(
            invite: SpaceKey.randomBytes(16), device: DeviceIdentity().publicKeys, proof: SpaceKey.randomBytes(32),
            holder: holder, expiresMs: expiresMs)
    }

    @Test(arguments: Backend.allCases) func joinsAreHeldPerDeviceBoundedRefusedAndDroppedByTheirHolder(backend: Backend) async throws {
        let temp = try await TempRelay(backend)
        let relay = temp.store
        let space = key.id
        #expect(try await relay.add(RelayCapability(key: key)))
        // Held, and read back exactly; expired ones are not read.
        let first = join(expiresMs: 5_000)
        try await relay.holdJoin(first, space: space, limit: 3, nowMs: 1_000)
        #expect(try await relay.joins(space: space, nowMs: 1_000) == [first])
        #expect(try await relay.joins(space: space, nowMs: 5_000).isEmpty)
        #expect(try await relay.joins(space: SpaceKey.generate().id, nowMs: 1_000).isEmpty, "another space holds none")
        // The same device again (a reconnect, on another process): replaced, not added.
        var again = first
        (again.holder, again.expiresMs, again.invite) = ("q 7", 6_000, SpaceKey.randomBytes(16))
        try await relay.holdJoin(again, space: space, limit: 3, nowMs: 1_000)
        #expect(try await relay.joins(space: space, nowMs: 1_000) == [again])
        // At most `limit`: a new one drops the oldest.
        let more = (0..<3).map { join(expiresMs: 7_000 + Int64($0)) }
        for j in more { try await relay.holdJoin(j, space: space, limit: 3, nowMs: 1_000) }
        #expect(try await relay.joins(space: space, nowMs: 1_000) == more)
        // A refusal names the invite and the device; a wrong invite refuses nothing.
        #expect(try await !relay.refuseJoin(space: space, invite: SpaceKey.randomBytes(16), device: more[0].device.signing, reason: .used))
        #expect(try await relay.refuseJoin(space: space, invite: more[0].invite, device: more[0].device.signing, reason: .used))
        #expect(
            try await !relay.refuseJoin(space: space, invite: more[0].invite, device: more[0].device.signing, reason: .used),
            "refused for that reason already: nothing changes, nothing is announced")
        #expect(try await relay.joins(space: space, nowMs: 1_000).first?.refusal == .used)
        // Holding it again (the joiner retries with a new invite) clears the refusal.
        var retried = more[0]
        retried.invite = SpaceKey.randomBytes(16)
        try await relay.holdJoin(retried, space: space, limit: 3, nowMs: 1_000)
        #expect(try await relay.joins(space: space, nowMs: 1_000).first { $0.device == retried.device }?.refusal == nil)
        // Dropped only by its holder: a connection of another process that held it before cannot drop the new one.
        try await relay.dropJoin(space: space, device: more[1].device.signing, holder: "someone else")
        #expect(try await relay.joins(space: space, nowMs: 1_000).count == 3)
        try await relay.dropJoin(space: space, device: more[1].device.signing, holder: more[1].holder)
        #expect(try await relay.joins(space: space, nowMs: 1_000).map(\.device) == [retried.device, more[2].device])
    }
}
