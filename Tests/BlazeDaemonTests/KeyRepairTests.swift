import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

/// An admin that seals one member another epoch key than the one its operation committed to (SYNC.md §9, "Keys
/// sealed wrong"): the member cannot take it, says so in its acknowledgement, and an honest admin seals it the right
/// key, so it reads what is written under the new epoch.
@Suite(.serialized) struct KeyRepairTests {
    @Test func aMemberSealedTheWrongKeyGetsTheRightOneFromAnotherAdmin() throws {
        let a = try syncDaemon(), b = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        _ = try ca.call("doc.put", ["db": "team", "collection": "n", "id": "before", "doc": ["v": 1]])
        #expect(try eventually { try replicaState(cb, "team").docs == 1 })

        // A hostile admin joins A with an admin invite and reads the log.
        let token = try ca.invite("team", role: "admin")
        let invite = try InviteToken(text: token)
        let (hostile, ops, view) = try HostileMember.admitted(token)
        #expect(view.member(hostile.identity.nodeID)?.role == .admin && view.commitsKeys)
        let held = view.keys(for: hostile.identity)
        let current = try #require(view.frontier.first)
        let secret = try #require(held[current])

        // It adds a device, then removes it: the rotation seals A (and itself) the key it commits to, B another.
        let extra = DeviceIdentity()
        let add = try MembershipOp(
            space: invite.space, author: hostile.identity, timeMs: 1, parents: view.heads,
            action: .add(device: extra.publicKeys, role: .writer),
            envelopes: [try KeyEnvelope(sealing: secret, space: invite.space, epoch: current.epoch, keyOp: current.op, to: extra.publicKeys)])
        let real = SpaceKey.randomSecret(), bogus = SpaceKey.randomSecret()
        let epoch = current.epoch.next
        let nb = try nodeID(cb, "team")
        let listed = MembershipState(space: invite.space, ops: ops + [add]).current
        let rotate = try MembershipOp(
            space: invite.space, author: hostile.identity, timeMs: 2, parents: [add.hash],
            action: .remove(device: extra.nodeID, cutoff: 0, epoch: epoch),
            envelopes: try listed.filter { $0.keys.nodeID != extra.nodeID }.map { m in
                try KeyEnvelope(
                    sealing: m.keys.nodeIDHex == nb ? bogus : real, space: invite.space, epoch: epoch, keyOp: KeyEnvelope.thisOp,
                    to: m.keys)
            },
            commitment: KeyEnvelope.commitment(secret: real, space: invite.space, epoch: epoch))
        try hostile.send(HostileMember.members([add, rotate]))
        hostile.startDraining()

        // Both apply the rotation; A writes under the new epoch, and B reads it once A sealed it the right key.
        for conn in [ca, cb] {
            #expect(try eventually { try conn.call("db.members", ["db": "team"])["epoch"]?.intValue == Int64(epoch.value) })
        }
        _ = try ca.call("doc.put", ["db": "team", "collection": "n", "id": "after", "doc": ["v": 2]])
        let read = eventually(timeout: .seconds(60)) {
            (try? cb.call("doc.get", ["db": "team", "collection": "n", "id": "after"])) != nil
        }
        let status = try cb.call("sync.status", ["db": "team"]).jsonText
        #expect(read, "\(status)")
        hostile.close()
        a.stop(expectErrors: false)
        b.stop(expectErrors: false)
    }
}
