import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Devices `A`, `B`, … of one shared database `team` whose members joined over TCP and then lost every network path:
/// each runs again without a sync listener and with no peers, so a folder is the only way left.
struct FolderTeam {
    var dirs: [TempDir]
    var daemons: [DaemonProcess]
    var clients: [BlazeConnection]
    var nodes: [String]
    let arguments: [String]

    /// `count` devices, the first the space's admin, joined over peer links (with `setup` in their environment);
    /// started again with `arguments` and no network.
    init(count: Int, arguments: [String] = [], setup: [String: String] = [:]) throws {
        self.arguments = arguments
        dirs = (0..<count).map { _ in TempDir() }
        let first = try syncDaemon(dir: dirs[0], environment: setup)
        let c0 = try first.connect()
        _ = try c0.call("db.create", ["db": "team"])
        var joined: [DaemonProcess] = [first]
        for dir in dirs.dropFirst() {
            let d = try syncDaemon(dir: dir, environment: setup)
            let c = try d.connect()
            _ = try c.call("db.join", ["token": .string(try c0.invite("team")), "db": "team"])
            for peer in try c.call("peer.list", ["db": "team"])["peers"]?.arrayValue ?? [] {
                _ = try c.call("peer.remove", ["db": "team", "address": peer["address"] ?? .null])
            }
            joined.append(d)
        }
        // Every member knows every member before the network goes: the admin's log lists them all.
        let all = joined.count
        #expect(try eventually { try members(c0, "team").count == all })
        for d in joined { d.stop() }
        daemons = []
        clients = []
        nodes = []
        for dir in dirs {
            let d = try DaemonProcess(arguments: arguments, dir: dir)
            daemons.append(d)
            let c = try d.connect()
            clients.append(c)
            nodes.append(try nodeID(c, "team"))
            #expect(try c.call("sync.status")["listen"] == .null)
            #expect(try c.call("peer.list", ["db": "team"])["peers"]?.arrayValue?.isEmpty == true)
        }
    }

    /// Starts device `i` again (after `stop(i)`).
    mutating func restart(_ i: Int) throws {
        daemons[i] = try DaemonProcess(arguments: arguments, dir: dirs[i])
        clients[i] = try daemons[i].connect()
    }

    func stopAll() {
        for d in daemons { d.stop() }
    }
}

/// The files under `root`, by path relative to it.
func filesUnder(_ root: String) -> [String] {
    (FileManager.default.enumerator(atPath: root)?.allObjects as? [String] ?? []).filter {
        var isDir: ObjCBool = false
        return FileManager.default.fileExists(atPath: root + "/" + $0, isDirectory: &isDir) && !isDir.boolValue
    }.sorted()
}

/// The folder's whole content as text, for searching plaintext in it.
func folderText(_ root: String) -> String {
    filesUnder(root).map { String(decoding: (try? Data(contentsOf: URL(fileURLWithPath: root + "/" + $0))) ?? Data(), as: UTF8.self) }
        .joined(separator: "\n")
}

/// The space id of `team` on the daemon behind `c`.
func spaceOf(_ c: BlazeConnection) throws -> String {
    try #require(try c.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["space"]?.stringValue)
}

/// The version vector of `team` (what the replica holds per origin).
func versionVector(_ c: BlazeConnection) throws -> JSONValue? {
    try c.call("db.info", ["db": "team"])["versionVector"]
}

/// Documents in `collection` of `team`.
func count(_ c: BlazeConnection, _ collection: String) throws -> Int64 {
    try c.call("query.count", ["db": "team", "collection": .string(collection)])["count"]?.intValue ?? 0
}

/// The status of `db`'s folder `path` in `sync.status`.
func folderStatus(_ c: BlazeConnection, _ path: String) throws -> JSONValue {
    let peers = try c.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
    return try #require(peers.first { $0["peer"]?.stringValue == "folder:" + path })
}

/// Sync through a shared folder (Protocol/SYNC.md §10), with real daemons that have no network path to each other.
@Suite(.serialized) struct FolderTests {
    @Test func twoThenThreeDaemonsSharingOnlyAFolderConvergeIncludingOneThatWasStopped() throws {
        var team = try FolderTeam(count: 3)
        let folder = TempDir()
        let (a, b) = (team.clients[0], team.clients[1])
        for c in [a, b] {
            #expect(try c.call("folder.add", ["db": "team", "path": .string(folder.path + "/")]) == [
                "db": "team", "path": .string(folder.path), "added": true,
            ])
        }
        #expect(try a.call("folder.add", ["db": "team", "path": .string(folder.path)])["added"] == false)
        // Two devices write, concurrently edit one document, and converge through the folder alone.
        for i in 0..<40 {
            _ = try a.call("doc.put", ["db": "team", "collection": "recipes", "id": .string("a\(i)"), "doc": ["title": .string("secret soup \(i)")]])
            _ = try b.call("doc.put", ["db": "team", "collection": "recipes", "id": .string("b\(i)"), "doc": ["title": .string("hidden stew \(i)")]])
        }
        _ = try a.call("doc.put", ["db": "team", "collection": "recipes", "id": "shared", "doc": ["title": "from A", "servings": 2]])
        _ = try b.call("doc.put", ["db": "team", "collection": "recipes", "id": "shared", "doc": ["title": "from B", "servings": 4]])
        #expect(try eventually {
            let (sa, sb) = (try replicaState(a, "team"), try replicaState(b, "team"))
            return sa.docs == 81 && sa == sb
        })
        // The third device joins the folder, catches up, and is then stopped while the others go on writing.
        _ = try team.clients[2].call("folder.add", ["db": "team", "path": .string(folder.path)])
        #expect(try eventually { try replicaState(team.clients[2], "team") == replicaState(a, "team") })
        team.daemons[2].stop()
        for i in 0..<30 {
            _ = try a.call("doc.patch", ["db": "team", "collection": "recipes", "id": .string("b\(i)"), "set": ["tasted": true]])
            _ = try b.call("doc.delete", ["db": "team", "collection": "recipes", "id": .string("a\(i)")])
        }
        #expect(try eventually { try replicaState(a, "team") == replicaState(b, "team") })
        try team.restart(2)
        let c = team.clients[2]
        #expect(try eventually { try replicaState(c, "team") == replicaState(a, "team") })
        #expect(try replicaState(c, "team").docs == 51)
        // Each device wrote only its own directory: segment files, a head file, the membership log and the
        // acknowledgements it holds.
        let space = try spaceOf(a)
        // (A `.tmp` file is a head, members or acks file being replaced at that moment.)
        let files = filesUnder(folder.path).filter { !$0.hasSuffix(".tmp") }
        #expect(Set(files.map { $0.split(separator: "/").first.map(String.init) ?? "" }) == [space])
        for (i, node) in team.nodes.enumerated() {
            let own = Set(files.filter { $0.hasPrefix("\(space)/\(node)/") }.map { String($0.split(separator: "/").last!) })
            // C wrote nothing of its own, and everything it holds is in the folder already: it adds no segment.
            #expect(own == (i < 2 ? ["head", "members", "acks", ".formats", "0000000000000001.seg"] : ["head", "members", "acks", ".formats"]), "\(own)")
        }
        // Status: the folder lists the other two devices; nothing was refused.
        let status = try folderStatus(c, folder.path)
        #expect(status["direction"] == "folder")
        #expect(Set(status["devices"]?.arrayValue?.compactMap(\.stringValue) ?? []) == Set(team.nodes.dropLast()))
        #expect(status["rejected"] == [:])
        #expect(try c.call("folder.list", ["db": "team"])["folders"]?.arrayValue?.first?["devices"]?.arrayValue?.count == 2)
        // The folder reveals no content, id, collection or field name.
        let text = folderText(folder.path)
        for needle in ["secret soup", "hidden stew", "recipes", "title", "servings", "tasted", "\"a1\"", "from A"] {
            #expect(!text.contains(needle), "\(needle) in the folder")
        }
        // Removing the folder stops using it and leaves the files for the others.
        #expect(try c.call("folder.remove", ["db": "team", "path": .string(folder.path)])["removed"] == true)
        #expect(try c.call("folder.remove", ["db": "team", "path": .string(folder.path)])["removed"] == false)
        #expect(try c.call("folder.list", ["db": "team"])["folders"] == [])
        #expect(filesUnder(folder.path).filter { !$0.hasSuffix(".tmp") }.count == files.count)
        team.stopAll()
    }

    @Test func aDeviceAloneInTheFolderLeavesEverythingForAMemberThatComesAfterItIsGone() throws {
        let team = try FolderTeam(count: 2)
        let folder = TempDir()
        let a = team.clients[0]
        _ = try a.call("folder.add", ["db": "team", "path": .string(folder.path)])
        for i in 0..<30 {
            _ = try a.call("doc.put", ["db": "team", "collection": "notes", "id": .string("n\(i)"), "doc": ["i": .int(Int64(i))]])
        }
        let final = try replicaState(a, "team")
        let aDir = folder.path + "/" + (try spaceOf(a)) + "/" + team.nodes[0]
        // B has never used the folder: A writes everything for it all the same, and is gone when B looks.
        #expect(try eventually { try folderStatus(a, folder.path)["sentEntries"]?.intValue ?? 0 >= ownSeq(a, "team") })
        #expect(filesUnder(aDir).contains("0000000000000001.seg"))
        team.daemons[0].stop()
        let b = team.clients[1]
        _ = try b.call("folder.add", ["db": "team", "path": .string(folder.path)])
        #expect(try eventually { try replicaState(b, "team") == final })
        team.stopAll()
    }

    /// Members that meet only in the folder learn each other's acknowledgements from their acks files, so what both
    /// hold becomes stable and is compacted away (SYNC.md §10, §11).
    @Test func membersMeetingOnlyInAFolderReachStabilityAndCompact() throws {
        let team = try FolderTeam(count: 2, arguments: ["--folder-poll-interval", "0.05"])
        let folder = TempDir()
        for c in team.clients { _ = try c.call("folder.add", ["db": "team", "path": .string(folder.path)]) }
        let (a, b) = (team.clients[0], team.clients[1])
        for i in 0..<20 {
            _ = try a.call("doc.put", ["db": "team", "collection": "c", "id": .string("a\(i)"), "doc": ["i": .int(Int64(i))]])
            _ = try b.call("doc.put", ["db": "team", "collection": "c", "id": .string("b\(i)"), "doc": ["i": .int(Int64(i))]])
        }
        #expect(try eventually { try replicaState(a, "team") == replicaState(b, "team") && replicaState(a, "team").docs == 40 })
        let (na, nb) = (team.nodes[0], team.nodes[1])
        let vector = try #require(try versionVector(a))
        let (aSeq, bSeq) = (try #require(vector[na]?.intValue), try #require(vector[nb]?.intValue))
        #expect(try eventually {
            let rb = try b.call("db.compact", ["db": "team"])
            let ra = try a.call("db.compact", ["db": "team"])
            return ra["stableVector"]?[na]?.intValue == aSeq && ra["stableVector"]?[nb]?.intValue == bSeq
                && rb["stableVector"]?[na]?.intValue == aSeq && rb["stableVector"]?[nb]?.intValue == bSeq
        })
        #expect(try fileRows(dataDir: team.daemons[0].dataDir, db: "team", "sync_entries") == 0)
        #expect(try fileRows(dataDir: team.daemons[1].dataDir, db: "team", "sync_entries") == 0)
        let space = try spaceOf(a)
        for node in team.nodes {
            #expect(FileManager.default.fileExists(atPath: folder.path + "/" + space + "/" + node + "/acks"))
        }
        // Still one replica: a write after compaction reaches the other through the folder.
        _ = try b.call("doc.put", ["db": "team", "collection": "c", "id": "late", "doc": ["late": true]])
        #expect(try eventually { try replicaState(a, "team") == replicaState(b, "team") && replicaState(a, "team").docs == 41 })
        for client in team.clients {
            #expect(try folderStatus(client, folder.path)["rejected"] == [:])
        }
        team.stopAll()
    }

    @Test func segmentsEveryMemberHoldsAreRemovedAndAStoppedMemberHoldsThemBack() throws {
        var team = try FolderTeam(count: 3, arguments: ["--folder-poll-interval", "0.05", "--folder-segment-bytes", "4096"])
        let folder = TempDir()
        for c in team.clients { _ = try c.call("folder.add", ["db": "team", "path": .string(folder.path)]) }
        let (a, b) = (team.clients[0], team.clients[1])
        let space = try spaceOf(a)
        let dirs = team.nodes.map { folder.path + "/" + space + "/" + $0 }
        func segments(_ i: Int) -> Int { filesUnder(dirs[i]).filter { $0.hasSuffix(".seg") }.count }
        // Every member has said what it holds before C stops.
        #expect(eventually { dirs.allSatisfy { FileManager.default.fileExists(atPath: $0 + "/head") } })
        team.daemons[2].stop()
        let text = String(repeating: "lorem ipsum ", count: 20)
        for i in 0..<150 {
            _ = try a.call("doc.put", ["db": "team", "collection": "notes", "id": .string("a\(i)"), "doc": ["text": .string(text)]])
            _ = try b.call("doc.put", ["db": "team", "collection": "notes", "id": .string("b\(i)"), "doc": ["text": .string(text)]])
        }
        #expect(try eventually { try replicaState(a, "team") == replicaState(b, "team") && replicaState(a, "team").docs == 300 })
        // C lacks all of it: nothing may be removed while it is away.
        let whileAway = (segments(0), segments(1))
        #expect(whileAway.0 >= 5 && whileAway.1 >= 5, "\(whileAway)")
        try team.restart(2)
        let c = team.clients[2]
        #expect(try eventually { try replicaState(c, "team") == replicaState(a, "team") })
        // Once every member says it holds them, each writer removes its finished segments.
        #expect(eventually { segments(0) <= 2 && segments(1) <= 2 }, "\(segments(0)), \(segments(1))")
        // Under steady writes with everyone present, the folder stays small, and a late write still arrives.
        for i in 0..<150 {
            _ = try a.call("doc.patch", ["db": "team", "collection": "notes", "id": .string("b\(i)"), "set": ["n": .int(Int64(i))]])
        }
        #expect(try eventually { try replicaState(c, "team") == replicaState(a, "team") && replicaState(b, "team") == replicaState(a, "team") })
        #expect(eventually { segments(0) <= 2 }, "\(segments(0))")
        _ = try c.call("doc.put", ["db": "team", "collection": "notes", "id": "late", "doc": ["text": "last"]])
        #expect(eventually { (try? a.call("doc.get", ["db": "team", "collection": "notes", "id": "late"])) != nil })
        for client in team.clients {
            #expect(try folderStatus(client, folder.path)["rejected"] == [:])
        }
        team.stopAll()
    }
}
