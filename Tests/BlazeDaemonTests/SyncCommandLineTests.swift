import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import GRDB
import Synchronization
import Testing

/// Sync from the command line: `blazed`'s sync flags and `blazectl`'s share, join, peer and status commands.
@Suite(.serialized) struct SyncCommandLineTests {
    @Test func blazedRefusesBadSyncFlags() throws {
        let dir = TempDir()
        let base = ["--socket", dir.path + "/s.sock", "--data-dir", dir.path + "/data"]
        for (flags, message) in [
            (["--sync-timeout", "0"], "sync-timeout (from flag --sync-timeout) must be from 0.1 to 3600, got 0"),
            (["--sync-timeout", "soon"], "sync-timeout (from flag --sync-timeout) must be a number, got \"soon\""),
            (["--sync-listen", "nohost"], "sync-listen (from flag --sync-listen) must be host:port with a port from 0 to 65535, got \"nohost\""),
        ] {
            let r = try run(buildDirectory + "/blazed", base + flags)
            #expect(r.status != 0 && r.err.contains(message), "\(flags): \(r.err)")
        }
        #expect(!FileManager.default.fileExists(atPath: dir.path + "/data"), "nothing created before the flags are checked")
    }

    @Test func blazectlSharesJoinsAddsPeersAndShowsStatus() throws {
        let a = try syncDaemon(), b = try syncDaemon()
        let ctl = buildDirectory + "/blazectl"
        let ca = try a.connect()
        _ = try ca.call("db.create", ["db": "notes"])
        _ = try ca.call("doc.put", ["db": "notes", "collection": "n", "id": "hello", "doc": ["text": "hi"]])
        let share = try run(ctl, ["db", "share", "notes", "--socket", a.socket])
        let space = try #require(try ca.call("sync.status", ["db": "notes"])["databases"]?.arrayValue?.first?["space"]?.stringValue)
        #expect(share.status == 0 && share.out == "shared notes as space \(space); this device is its admin: invite devices with 'blazectl db invite notes writer'\n")
        let invite = try run(ctl, ["db", "invite", "notes", "writer", "--expires-in", "600", "--socket", a.socket])
        let token = invite.out.trimmingCharacters(in: .newlines)
        #expect(invite.status == 0 && token.hasPrefix("blazedb-invite-2.") && invite.err.contains("one-time writer invite into notes"))
        // The token comes on stdin: never in argv (shell history, /proc).
        let join = try run(ctl, ["db", "join", "-", "notes", "--socket", b.socket], input: token + "\n")
        #expect(join.out == "joined space \(space) as database notes\n" && join.status == 0, "\(join)")
        let again = try run(ctl, ["db", "join", "-", "again", "--socket", b.socket], input: token)
        #expect(again.status == 1 && again.err.contains("already syncs in this space"), "\(again)")
        let address = try a.syncAddress()
        let add = try run(ctl, ["peer", "add", "notes", address, "--socket", b.socket])
        #expect(add.out == "\(address) was already a peer of notes\n", "joining made the inviting member a peer")
        let members = try run(ctl, ["db", "members", "notes", "--socket", b.socket])
        let rows = members.out.split(separator: "\n").map { $0.split(separator: " ").map(String.init) }
        let nodeB = try #require(try b.connect().call("db.info", ["db": "notes"])["nodeId"]?.stringValue)
        #expect(rows.count == 4 && rows[0] == ["DEVICE", "ROLE", "ADDED", "BY", "ADDED", "REMOVED", "BY", "REMOVED"], "\(members)")
        #expect(rows.count == 4 && rows[1][1] == "admin" && rows[2].prefix(4) == [nodeB, "(this", "device)", "writer"], "\(members)")
        let json = try run(ctl, ["db", "members", "notes", "--json", "--socket", a.socket])
        let parsed = try JSONParser().parse(json.out)
        #expect(json.status == 0 && parsed["members"]?.arrayValue?.count == 2)
        #expect(eventually { (try? b.connect().call("doc.get", ["db": "notes", "collection": "n", "id": "hello"])) != nil })
        let list = try run(ctl, ["peer", "list", "notes", "--socket", b.socket])
        let nodeA = try #require(try ca.call("db.info", ["db": "notes"])["nodeId"]?.stringValue)
        #expect(
            list.out.split(separator: "\n").map { $0.split(separator: " ").map(String.init) }
                == [["ADDRESS", "CONNECTED", "DEVICE"], [address, "yes", nodeA]])
        let status = try run(ctl, ["sync", "status", "notes", "--socket", b.socket])
        let lines = status.out.split(separator: "\n")
        #expect(lines.first?.hasPrefix("listening on 127.0.0.1:") == true)
        #expect(
            lines.count == 3
                && lines[2].split(separator: " ").prefix(4) == ["notes", Substring(address), "connected", Substring(nodeA.prefix(12))])
        #expect(try run(ctl, ["sync", "pause", "notes", "--socket", b.socket]).out == "paused sync of notes\n")
        #expect(try run(ctl, ["sync", "resume", "notes", "--socket", b.socket]).out == "resumed sync of notes\n")
        #expect(try run(ctl, ["sync", "now", "notes", "--socket", b.socket]).out == "syncing notes\n")
        let missing = try run(ctl, ["db", "share", "nope", "--socket", b.socket])
        #expect(missing.status == 1 && missing.err.hasPrefix("blazectl: error: ") && missing.out.isEmpty)
        a.stop()
        b.stop()
    }
}
