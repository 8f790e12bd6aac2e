import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Crypto
import Foundation
import GRDB
import Testing

/// Invites that do not outlive their purpose (SYNC.md §9, "Invites"): what an admin keeps of an invite checks a
/// joiner's proof and cannot make one, and a restored copy of a database carries neither its invites nor its log.
@Suite struct InviteSecretTests {
    /// A copy of the admin's database (a backup) plus the capability in the invite token is all a thief holds: the
    /// value the admin kept of an unused admin invite makes no proof the admin accepts, and the invite still works
    /// for the device it was meant for.
    @Test func aBackupAndTheCapabilityRedeemNoInvite() throws {
        let a = try syncDaemon(), b = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        let token = try ca.invite("team", role: "admin")
        let invite = try InviteToken(text: token)
        let path = a.dir.path + "/team.backup"
        _ = try ca.call("db.backup", ["db": "team", "path": .string(path)])
        var readonly = GRDB.Configuration()
        readonly.readonly = true
        let kept = try DatabaseQueue(path: path, configuration: readonly).read { db in
            try #require(try Row.fetchOne(db, sql: "SELECT verifier, proof_version FROM sync_invites WHERE id = ?", arguments: [Data(invite.id)]))
        }
        let stored = Array(kept[0] as Data)
        #expect(kept[1] as Int == 2)
        #expect(stored != InviteToken.secretHash(invite.secret) && stored != invite.secret, "only the verifier is kept")

        // What worked before: an HMAC keyed with the stored value, as the version-1 scheme computed it.
        let thief = HostileMember(key: try SpaceKey(id: invite.space, capability: invite.capability))
        let port = try #require(Int(invite.address.split(separator: ":").last ?? ""))
        let me = thief.identity.publicKeys
        let forged = Array(HMAC<SHA256>.authenticationCode(
            for: Array("blazedb join v1".utf8) + invite.space.bytes + me.signing + me.agreement, using: SymmetricKey(data: stored)))
        for proof in [forged, Array(repeating: 0, count: 64)] {
            try thief.connect(port: port)
            try thief.send([6] + invite.id + me.signing + me.agreement + proof)
            let end = thief.awaitClose(seconds: 30)
            #expect(end.closed && end.error == "invite_unknown", "refused: \(end)")
        }
        thief.close()
        #expect(try members(ca, "team").count == 1, "nobody was added")

        // The invite is still unused: the device it was given to joins with it, as an admin.
        _ = try cb.call("db.join", ["token": .string(token), "db": "team"])
        #expect(try members(ca, "team").map(\.role) == ["admin", "admin"])
        a.stop()
        b.stop()
    }

    /// A restored copy is detached from the space: it keeps none of the invites the original issued, and sharing it
    /// starts a new space with a log of its own instead of carrying the old one.
    @Test func aRestoredCopyKeepsNoInvitesAndStartsANewLog() throws {
        let a = try syncDaemon(), b = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "d", "doc": ["v": 1]])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        _ = try ca.invite("team", role: "admin")
        let path = a.dir.path + "/team.backup"
        _ = try ca.call("db.backup", ["db": "team", "path": .string(path)])
        _ = try ca.call("db.restore", ["path": .string(path), "db": "copy"])
        let file = try DatabaseQueue(path: a.dataDir + "/databases/copy.db")
        let (invites, ops) = try file.read { db in
            (try Int.fetchOne(db, sql: "SELECT count(*) FROM sync_invites") ?? -1,
             try Int.fetchOne(db, sql: "SELECT count(*) FROM sync_membership") ?? -1)
        }
        try file.close()
        #expect(invites == 0 && ops == 0, "invites \(invites), operations \(ops)")
        expectRPCError(ca, "db.members", ["db": "copy"], code: -32020, kind: "not_shared")
        let shared = try ca.call("db.share", ["db": "copy"])
        let original = try ca.call("db.info", ["db": "team"])["space"]
        #expect(shared["space"] != nil && shared["space"] != original, "a new space")
        #expect(try members(ca, "copy").count == 1, "its log lists this device alone, not the original's members")
        a.stop()
        b.stop()
    }
}
