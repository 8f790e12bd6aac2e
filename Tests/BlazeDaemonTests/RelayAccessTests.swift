import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import GRDB
import Testing

/// Who fetches what from a relay (Protocol/RELAY.md, "Who fetches what"): the capability only lets a device in; in a
/// space with a log, only the devices it lists as current members get entries, operations and acknowledgements.
@Suite struct RelayAccessTests {
    /// What a device connected to `relay` as `identity` is sent after its `STATE`, until the relay has been silent
    /// for 3 s (or 30 s passed): the message types in order, and the operations of its `MEMBERS`.
    static func fetch(_ key: SpaceKey, _ relay: RelayProcess, as identity: DeviceIdentity) throws -> (types: [UInt8], ops: [MembershipOp]) {
        let device = HostileMember(key: key, identity: identity)
        try device.connect(port: relay.port, timeoutSeconds: 3, webSocket: "/v1/sync")
        defer { device.close() }
        try device.send(HostileMember.state([]))
        var types: [UInt8] = [], ops: [MembershipOp] = []
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline, let message = try device.receive() {
            types.append(message[0])
            if message[0] == 5 { ops += try MembershipDaemonTests.decodeMembers(message) }
        }
        return (types, ops)
    }

    /// The relay's log of the space, resolved, as its database holds it.
    static func relayLog(_ relay: RelayProcess, space: SpaceID) throws -> MembershipState {
        let ops = try DatabaseQueue(path: relay.dataDir + "/relay.db").read { db in
            try Data.fetchAll(db, sql: "SELECT bytes FROM relay_ops")
        }.map { try MembershipOp(bytes: Array($0)) }
        return MembershipState(space: space, ops: ops)
    }

    @Test func aRevokedDeviceAndCapabilityHoldersFetchNothingNewFromTheRelay() throws {
        let relay = try RelayProcess()
        let (a, ca, capability) = try sharedTeam(servedBy: relay)
        let b = try syncDaemon()
        let cb = try b.connect()
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        for c in [ca, cb] { _ = try c.call("peer.add", ["db": "team", "address": .string(relay.address)]) }
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "before", "doc": ["v": 1]])
        let (na, nb) = (try nodeID(ca, "team"), try nodeID(cb, "team"))
        #expect(try eventually { try relay.held()[na] == ownSeq(ca, "team") })
        let key = try RelayCapability(text: capability).key
        let identities = try [a, b].map { try DeviceIdentity.loadOrCreate(directory: $0.dataDir + "/keys") }
        #expect(identities.map { hexString($0.nodeID) } == [na, nb])
        // B is revoked while offline; the relay learns of it, and A writes on.
        b.stop()
        _ = try ca.call("db.revoke", ["db": "team", "device": .string(nb)])
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "after", "doc": ["v": 2]])
        #expect(try eventually {
            try relay.held()[na] == ownSeq(ca, "team") && Self.relayLog(relay, space: key.id).member(hexBytes(nb)!)?.isCurrent == false
        })

        // A member is served: the relay's STATE, the log and entries.
        let member = try Self.fetch(key, relay, as: identities[0])
        #expect(member.types.contains(1) && member.types.contains(2) && member.types.contains(5), "\(member.types)")
        // B under its own key gets the proof of its removal and nothing else: no STATE, no entries, no acks.
        let removed = try Self.fetch(key, relay, as: identities[1])
        #expect(removed.types.allSatisfy { $0 == 5 } && !removed.types.isEmpty, "\(removed.types)")
        let proof = MembershipState(space: key.id, ops: removed.ops)
        #expect(proof.member(hexBytes(nb)!)?.isCurrent == false, "its removal is in what it got")
        // Anyone holding the capability (B under a fresh key, anyone who ever saw an invite) gets nothing at all.
        let stranger = try Self.fetch(key, relay, as: DeviceIdentity())
        #expect(stranger.types.isEmpty, "\(stranger.types)")
        a.stop()
        relay.stop()
    }
}
