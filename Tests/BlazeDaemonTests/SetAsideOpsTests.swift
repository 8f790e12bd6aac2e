import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import BlazeWire
import Foundation
import Testing

/// Operations a log did not keep when they came, which a later operation of the same sender names (SYNC.md §9, "What
/// the log keeps"): the sender counts them as held and does not send them again on that connection.
@Suite(.serialized) struct SetAsideOpsTests {
    /// An admin's log (written before the log kept only what admins sign) names a stranger's void operation as a
    /// parent, and the two travel in separate `MEMBERS` messages. The daemon drops the void operation when it comes
    /// alone, then takes it again when the admin's operation names it, so that operation applies within the same
    /// connection instead of waiting for a parent nobody sends again. A void operation nothing names stays dropped.
    @Test func anOperationNamingOneDroppedEarlierInTheSessionApplies() throws {
        let a = try syncDaemon()
        let ca = try a.connect()
        _ = try ca.call("db.create", ["db": "team"])
        let invite = try InviteToken(text: try ca.invite("team", role: "admin"))
        let hostile = HostileMember(key: try SpaceKey(id: invite.space, capability: invite.capability))
        let view = MembershipState(space: invite.space, ops: try hostile.join(invite))
        let current = try #require(view.frontier.first)
        let secret = try #require(view.keys(for: hostile.identity)[current])

        // Two operations of a device that is no member: void, and nothing names the first.
        let stranger = DeviceIdentity()
        let unnamed = try MembershipOp(space: invite.space, author: stranger, timeMs: 1, parents: view.heads, action: .grant)
        let named = try MembershipOp(space: invite.space, author: stranger, timeMs: 2, parents: view.heads, action: .grant)
        // The admin adds a reader, naming the second as a parent.
        let reader = DeviceIdentity()
        let add = try MembershipOp(
            space: invite.space, author: hostile.identity, timeMs: 3, parents: view.heads + [named.hash],
            action: .add(device: reader.publicKeys, role: .reader),
            envelopes: [try KeyEnvelope(sealing: secret, space: invite.space, epoch: current.epoch, keyOp: current.op, to: reader.publicKeys)])
        for op in [unnamed, named, add] { try hostile.send(try PeerMessage.members([op]).encoded()) }
        hostile.startDraining()

        let listed = eventually(timeout: .seconds(30)) {
            (try? members(ca, "team"))?.contains { $0.device == reader.publicKeys.nodeIDHex && $0.role == "reader" } == true
        }
        #expect(listed, "the admin's operation applies on the connection that brought it")
        // The operations are stored after they apply: wait for the admin's in the file.
        var held = Set<EntryHash>()
        #expect(eventually(timeout: .seconds(30)) {
            held = Set(((try? membershipOps(dataDir: a.dataDir, db: "team")) ?? []).map(\.hash))
            return held.contains(add.hash)
        })
        #expect(held.contains(named.hash), "stored with the operation that names it")
        #expect(!held.contains(unnamed.hash), "a void operation nothing names is not kept")
        hostile.close()
        a.stop(expectErrors: false)
    }
}
