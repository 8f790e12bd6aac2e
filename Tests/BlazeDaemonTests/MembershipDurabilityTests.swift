import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

/// What a daemon holds of its space's membership log survives a restart (SYNC.md §9).
@Suite(.serialized) struct MembershipDurabilityTests {
    /// Operations a peer sent are stored even when its session ends right after them: the space takes them at once and
    /// this device's next operations name them as parents, so one kept in memory only left those waiting for good
    /// after a restart — here the admin's revocation of a reader, undone (found by the membership fuzzer, issue #49).
    @Test func operationsMergedFromASessionThatEndsAtOnceAreStored() throws {
        let dir = TempDir()
        var a = try syncDaemon(dir: dir)
        var ca = try a.connect()
        _ = try ca.call("db.create", ["db": "team"])
        let (admin, _, view) = try HostileMember.admitted(try ca.invite("team", role: "admin"))
        let (reader, _, _) = try HostileMember.admitted(try ca.invite("team", role: "reader"))
        reader.close()
        // The second admin adds a device, and a frame that does not decode follows in the same write: the session
        // ends while the operation merges.
        let extra = DeviceIdentity()
        let add = try MembershipOp(
            space: view.space, author: admin.identity, timeMs: 1, parents: view.heads,
            action: .add(device: extra.publicKeys, role: .reader))
        var cipher = try #require(admin.cipher)
        let frames = cipher.seal(HostileMember.members([add])) + cipher.seal([0xEE])
        admin.cipher = cipher
        try admin.writeAll(frames)
        #expect(admin.awaitClose().closed)
        #expect(try eventually { try members(ca, "team").contains { $0.device == hexString(extra.nodeID) } })
        // The admin revokes the reader: its removal names that add as a parent.
        _ = try ca.call("db.revoke", ["db": "team", "device": .string(hexString(reader.identity.nodeID))])
        let listed = { (c: BlazeConnection) in try members(c, "team").map { "\($0.device) \($0.role) \($0.removed)" } }
        let before = try listed(ca)
        a.stop()
        a = try syncDaemon(dir: dir)
        ca = try a.connect()
        #expect(try listed(ca) == before)
        #expect(try ca.call("db.members", ["db": "team"])["epoch"] == 2)
        a.stop()
    }
}
