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

    /// `count` devices, the first the space's admin; started again with `arguments` and no network.
    init(count: Int, arguments: [String] = []) throws {
        self.arguments = arguments
        dirs = (0..<count).map { _ in TempDir() }
        let first = try syncDaemon(dir: dirs[0])
        let c0 = try first.connect()
        _ = try c0.call("db.create", ["db": "team"])
        var joined: [DaemonProcess] = [first]
        for dir in dirs.dropFirst() {
            let d = try syncDaemon(dir: dir)
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
            #expect(own == (i < 2 ? ["head", "members", "acks", "0000000000000001.seg"] : ["head", "members", "acks"]), "\(own)")
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

    @Test func aFolderToolThatCopiesBadlyCorruptsNothingAndEveryRejectionIsCounted() throws {
        // A and B each see their own copy of the folder; a clumsy "folder tool" in this test copies between the two
        // with delays, partial copies, duplicates under conflict names, reordering, damage and rollbacks.
        let team = try FolderTeam(count: 2, arguments: ["--folder-poll-interval", "0.05"])
        let (x, y) = (TempDir(), TempDir())
        let (a, b) = (team.clients[0], team.clients[1])
        _ = try a.call("folder.add", ["db": "team", "path": .string(x.path)])
        _ = try b.call("folder.add", ["db": "team", "path": .string(y.path)])
        let space = try spaceOf(a)
        var tool = ClumsyFolderTool(
            seed: testSeed("clumsy folder tool"),
            routes: [(x.path + "/" + space + "/" + team.nodes[0], y.path + "/" + space + "/" + team.nodes[0]),
                     (y.path + "/" + space + "/" + team.nodes[1], x.path + "/" + space + "/" + team.nodes[1])])
        // A starts a shared counter; once B has it, both write and count concurrently.
        _ = try a.call("doc.put", ["db": "team", "collection": "log", "id": "counter", "doc": ["hits": 0]])
        var rounds = 0
        while rounds < 2000, (try? b.call("doc.get", ["db": "team", "collection": "log", "id": "counter"])) == nil {
            try tool.round(finishing: rounds > 20)
            rounds += 1
            usleep(10_000)
        }
        var written = 0
        let deadline = Date().addingTimeInterval(90)
        var converged = false
        while Date() < deadline {
            if written < 120 {
                for _ in 0..<6 {
                    let (c, who) = written % 2 == 0 ? (a, "a") : (b, "b")
                    _ = try c.call("doc.put", ["db": "team", "collection": "log", "id": .string("\(who)\(written)"), "doc": ["n": .int(Int64(written))]])
                    _ = try c.call("doc.patch", ["db": "team", "collection": "log", "id": "counter", "incr": ["hits": 1]])
                    written += 1
                }
            }
            try tool.round(finishing: written >= 120)
            // Equal documents are not enough: two replicas that each lack the other's last increment show the same
            // counter value. Equal version vectors say both hold every change.
            if written >= 120, tool.quiet, try versionVector(a) == versionVector(b),
                try replicaState(a, "team") == replicaState(b, "team"), try replicaState(a, "team").docs == 121
            {
                converged = true
                break
            }
            // One round of the tool per pass; the daemons poll every 50 ms.
            usleep(20_000)
        }
        #expect(converged, "A and B converge through the clumsy tool (\(tool.stats))")
        let hits = (try a.call("doc.get", ["db": "team", "collection": "log", "id": "counter"])["doc"]?["hits"], try b.call("doc.get", ["db": "team", "collection": "log", "id": "counter"])["doc"]?["hits"])
        let states = (try replicaState(a, "team"), try replicaState(b, "team"))
        #expect(hits.0 == 120 && hits.1 == 120, "\(String(describing: hits)) \(states)")
        // The tool did every kind of damage, and each reached a daemon's counters as a refusal, never as data.
        #expect(
            tool.stats.partial > 0 && tool.stats.conflictCopies > 0 && tool.stats.rollbacks > 0 && tool.stats.damaged > 0
                && tool.stats.deleted > 0, "\(tool.stats)")
        var rejected: [String: Int] = [:]
        func count() throws {
            rejected = [:]
            for (c, path) in [(a, x.path), (b, y.path)] {
                for (k, v) in try folderStatus(c, path)["rejected"]?.objectValue ?? [:] {
                    rejected[k, default: 0] += Int(v.intValue ?? 0)
                }
                #expect(try c.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["forks"] == [])
            }
        }
        try count()
        // One more rollback for certain: B's copy of A's head file goes back to its first version.
        let rollbacksBefore = rejected["rollback", default: 0]
        let headCopy = y.path + "/" + space + "/" + team.nodes[0] + "/head"
        try #require(tool.history[headCopy]?.first).write(to: URL(fileURLWithPath: headCopy))
        #expect(try eventually { try count(); return rejected["rollback", default: 0] > rollbacksBefore }, "\(rejected)")
        #expect(rejected["torn_record", default: 0] + rejected["malformed", default: 0] > 0, "\(rejected)")
        for c in [a, b] {
            let check = try c.call("db.info", ["db": "team"])
            #expect(check["documents"] == 121)
        }
        team.stopAll()
    }

    @Test func killNineWhileAppendingLeavesNoTornEntryAcceptedAndTheWriterContinuesItsChain() throws {
        var team = try FolderTeam(count: 2, arguments: ["--folder-poll-interval", "0.05"])
        let folder = TempDir()
        let (a, b) = (team.clients[0], team.clients[1])
        for c in [a, b] { _ = try c.call("folder.add", ["db": "team", "path": .string(folder.path)]) }
        let space = try spaceOf(a)
        // A writes in a burst and is killed in the middle of it.
        let daemonA = team.daemons[0]
        let writer = Thread {
            guard let a = try? daemonA.connect() else { return }
            for i in 0..<2000 {
                guard (try? a.call("doc.put", ["db": "team", "collection": "burst", "id": .string("d\(i)"), "doc": ["i": .int(Int64(i))]])) != nil
                else { return }
            }
        }
        writer.start()
        let dirA = folder.path + "/" + space + "/" + team.nodes[0]
        #expect(eventually { (try? count(b, "burst")) ?? 0 > 50 })
        team.daemons[0].kill9()
        // What a crash can leave behind at the end of the segment: a record cut short, then one whose checksum fails.
        let segment = dirA + "/" + (filesUnder(dirA).filter { $0.hasSuffix(".seg") }.max() ?? "")
        let handle = try #require(FileHandle(forWritingAtPath: segment))
        handle.seekToEndOfFile()
        handle.write(Data([0, 0, 4, 0] + [UInt8](repeating: 7, count: 8) + [UInt8](repeating: 0xAB, count: 1024)))
        try handle.close()
        #expect(eventually { (try? folderStatus(b, folder.path)["rejected"]?["torn_record"]?.intValue ?? 0) ?? 0 >= 1 })
        let heldByB = try replicaState(b, "team")
        // A starts again: it cuts the torn bytes off, continues its chain, and B follows without a fork.
        try team.restart(0)
        let a2 = team.clients[0]
        let before = try ownSeq(a2, "team")
        for i in 0..<20 {
            _ = try a2.call("doc.put", ["db": "team", "collection": "after", "id": .string("z\(i)"), "doc": ["i": .int(Int64(i))]])
        }
        #expect(try ownSeq(a2, "team") == before + 20)
        #expect(try eventually { try replicaState(b, "team") == replicaState(a2, "team") })
        #expect(try replicaState(b, "team").docs >= heldByB.docs + 20)
        #expect(try b.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["forks"] == [])
        let bad = try folderStatus(b, folder.path)["rejected"]?.objectValue ?? [:]
        #expect(Set(bad.keys).isSubset(of: ["torn_record"]), "\(bad)")
        #expect(team.daemons[0].logText.contains("torn record"))
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

    @Test func aHostileFolderCannotRedirectWritesOrMakeTheDaemonReadElsewhere() throws {
        let d = try DaemonProcess(arguments: ["--folder-poll-interval", "0.05"])
        let c = try d.connect()
        let (folder, elsewhere) = (TempDir(), TempDir())
        _ = try c.call("db.create", ["db": "team"])
        _ = try c.call("db.share", ["db": "team"])
        _ = try c.call("folder.add", ["db": "team", "path": .string(folder.path)])
        let space = try spaceOf(c)
        let node = try nodeID(c, "team")
        let own = folder.path + "/" + space + "/" + node
        #expect(eventually { FileManager.default.fileExists(atPath: own + "/head") })
        // Another "writer" whose files are links to a device and to a file outside the folder, and a record that
        // announces 16 MiB and never comes: all ignored, nothing read through the links.
        let fake = folder.path + "/" + space + "/" + String(repeating: "ab", count: 16)
        try FileManager.default.createDirectory(atPath: fake, withIntermediateDirectories: true)
        #expect(symlink("/dev/zero", fake + "/0000000000000001.seg") == 0)
        #expect(symlink(elsewhere.path, fake + "/0000000000000002.seg") == 0)
        // FIFOs in place of a head file and a segment: opening one must not block the reader.
        #expect(mkfifo(fake + "/head", 0o644) == 0 && mkfifo(fake + "/0000000000000004.seg", 0o644) == 0)
        var header = Array("BZFS".utf8) + [1] + (hexBytes(space) ?? []) + (hexBytes(String(repeating: "ab", count: 16)) ?? [])
        header += [UInt8](repeating: 0, count: 7) + [3]
        _ = FileManager.default.createFile(atPath: fake + "/0000000000000003.seg", contents: Data(header + [1, 0, 0, 0] + [UInt8](repeating: 0, count: 8)))
        // A third "writer" directory that is a link to a directory outside the folder is not read.
        #expect(symlink(elsewhere.path, folder.path + "/" + space + "/" + String(repeating: "cd", count: 16)) == 0)
        // This device's own directory is swapped for a link to somewhere else (sync paused meanwhile, so the swap
        // is not half-done when it looks): it writes nothing through it.
        let headBefore = FileManager.default.contents(atPath: own + "/head")
        _ = try c.call("sync.pause", ["db": "team"])
        #expect(rename(own, own + ".real") == 0)
        #expect(symlink(elsewhere.path, own) == 0)
        _ = try c.call("doc.put", ["db": "team", "collection": "notes", "id": "n1", "doc": ["text": "private"]])
        _ = try c.call("sync.resume", ["db": "team"])
        #expect(eventually {
            ((try? folderStatus(c, folder.path)["lastError"]?.stringValue) ?? nil)?.contains("not a plain directory") == true
        })
        #expect(filesUnder(elsewhere.path).isEmpty)
        // Put back, it goes on and says what it holds now (its only member holds everything: no segment is needed).
        _ = try c.call("sync.pause", ["db": "team"])
        #expect(unlink(own) == 0 && rename(own + ".real", own) == 0)
        _ = try c.call("sync.resume", ["db": "team"])
        #expect(eventually { ((try? folderStatus(c, folder.path)["lastError"]) ?? nil) == .null })
        #expect(eventually { FileManager.default.contents(atPath: own + "/head") != headBefore })
        #expect(filesUnder(elsewhere.path).isEmpty)
        #expect(try folderStatus(c, folder.path)["devices"]?.arrayValue?.compactMap(\.stringValue) == [String(repeating: "ab", count: 16)])
        #expect(try folderStatus(c, folder.path)["rejected"] == [:])
        d.stop()
    }

    @Test func folderMethodsRejectBadInput() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        let dir = TempDir()
        _ = try c.call("db.create", ["db": "solo"])
        expectRPCError(c, "folder.add", ["db": "solo", "path": .string(dir.path)], code: -32020, kind: "not_shared")
        _ = try c.call("db.share", ["db": "solo"])
        expectRPCError(c, "folder.add", ["db": "solo", "path": "relative/dir"], code: -32602, kind: "invalid_folder")
        expectRPCError(c, "folder.add", ["db": "solo", "path": .string(dir.path + "/missing")], code: -32602, kind: "invalid_folder")
        _ = FileManager.default.createFile(atPath: dir.path + "/file", contents: Data())
        expectRPCError(c, "folder.add", ["db": "solo", "path": .string(dir.path + "/file")], code: -32602, kind: "invalid_folder")
        expectRPCError(c, "folder.add", ["db": "solo", "path": ""], code: -32602, kind: "invalid_folder")
        expectRPCError(c, "folder.add", ["db": "solo", "path": 7], code: -32602, kind: "invalid_params")
        expectRPCError(c, "folder.add", ["db": "solo"], code: -32602, kind: "invalid_params")
        expectRPCError(c, "folder.add", ["db": "nope", "path": .string(dir.path)], code: -32010, kind: "database_not_found")
        expectRPCError(c, "folder.remove", ["db": "solo", "path": "x"], code: -32602, kind: "invalid_folder")
        expectRPCError(c, "folder.list", ["db": "nope"], code: -32010, kind: "database_not_found")
        expectRPCError(c, "folder.list", [:], code: -32602, kind: "invalid_params")
        // A folder given with dots and slashes is stored in one spelling.
        #expect(try c.call("folder.add", ["db": "solo", "path": .string(dir.path + "/./")])["path"] == .string(dir.path))
        #expect(try c.call("folder.list", ["db": "solo"])["folders"]?.arrayValue?.first?["path"] == .string(dir.path))
        // A folder that disappears (an unmounted drive) is reported, and used again when it is back.
        let gone = TempDir()
        _ = try c.call("folder.add", ["db": "solo", "path": .string(gone.path)])
        // Moved away in one step (the daemon may be writing in it), as an unmount would.
        #expect(rename(gone.path, gone.path + ".away") == 0)
        defer { try? FileManager.default.removeItem(atPath: gone.path + ".away") }
        _ = try c.call("sync.now", ["db": "solo"])
        #expect(eventually {
            ((try? c.call("folder.list", ["db": "solo"])["folders"]?.arrayValue) ?? nil ?? []).contains {
                $0["path"]?.stringValue == gone.path && ($0["lastError"]?.stringValue ?? "").contains("missing")
            }
        })
        #expect(rename(gone.path + ".away", gone.path) == 0)
        _ = try c.call("sync.now", ["db": "solo"])
        #expect(eventually {
            ((try? c.call("folder.list", ["db": "solo"])["folders"]?.arrayValue) ?? nil ?? []).contains {
                $0["path"]?.stringValue == gone.path && $0["lastError"] == .null
            }
        })
        #expect(!filesUnder(gone.path).isEmpty)
        d.stop()
    }
}

/// A folder tool that does its job badly: it copies each writer's directory from one folder to the other with
/// random delays and in random order, copies files in part first, keeps duplicates under conflict names, damages
/// copies, loses copies for a while, and now and then hands back an older version of a file it copied before.
struct ClumsyFolderTool {
    var random: SeededRandom
    let routes: [(from: String, to: String)]
    /// Earlier versions of copied files, by destination path.
    var history: [String: [Data]] = [:]
    var stats = Stats()
    /// True when the last round copied nothing new.
    var quiet = false

    struct Stats: CustomStringConvertible {
        var copies = 0, partial = 0, conflictCopies = 0, rollbacks = 0, damaged = 0, deleted = 0
        var description: String {
            "copies \(copies), partial \(partial), conflict copies \(conflictCopies), rollbacks \(rollbacks), damaged \(damaged), "
                + "deleted \(deleted)"
        }
    }

    init(seed: UInt64, routes: [(String, String)]) {
        random = SeededRandom(seed: seed)
        self.routes = routes.map { (from: $0.0, to: $0.1) }
    }

    /// One round over every file of every route. When `finishing`, every file ends up an exact copy (after any
    /// mischief done in the round), so that the sides can converge.
    mutating func round(finishing: Bool) throws {
        quiet = true
        let fm = FileManager.default
        for route in routes {
            try fm.createDirectory(atPath: route.to, withIntermediateDirectories: true)
            for name in ((try? fm.contentsOfDirectory(atPath: route.from)) ?? []).shuffled(using: &random) where !name.hasSuffix(".tmp") {
                guard let source = fm.contents(atPath: route.from + "/" + name) else { continue }
                let target = route.to + "/" + name
                let current = fm.contents(atPath: target)
                if current == source { continue }
                quiet = false
                // Late: this file waits for a later round.
                if !finishing && Int.random(in: 0..<3, using: &random) == 0 { continue }
                // Each kind of mischief once as soon as a file allows it, then at random.
                let owed = [
                    stats.rollbacks == 0 && history[target]?.first.map { $0 != current } == true ? 0 : nil,
                    stats.partial == 0 && source.count > 64 ? 1 : nil,
                    stats.damaged == 0 && name.hasSuffix(".seg") && source.count > 200 ? 2 : nil,
                    stats.conflictCopies == 0 ? 3 : nil,
                    stats.deleted == 0 && current != nil ? 4 : nil,
                ].compactMap { $0 }.first
                let roll = finishing ? Int.random(in: 2..<10, using: &random) : owed ?? Int.random(in: 0..<10, using: &random)
                if !finishing && roll == 0, let old = history[target]?.first, old != current {
                    // Hands back an older version.
                    try old.write(to: URL(fileURLWithPath: target))
                    stats.rollbacks += 1
                    continue
                }
                if !finishing && roll == 4 && current != nil {
                    // Loses the copy for a while.
                    try FileManager.default.removeItem(atPath: target)
                    stats.deleted += 1
                    continue
                }
                if !finishing && roll == 1 && source.count > 64 {
                    // A partial copy, written in place.
                    let cut = Int.random(in: 1..<source.count, using: &random)
                    try source.prefix(cut).write(to: URL(fileURLWithPath: target))
                    stats.partial += 1
                    continue
                }
                if roll == 2 && name.hasSuffix(".seg") && source.count > 200 {
                    // A damaged duplicate under a conflict name: one byte flipped in its last record.
                    var bad = source
                    bad[bad.count - 10] ^= 0x40
                    try bad.write(to: URL(fileURLWithPath: route.to + "/" + name + ".sync-conflict-20261123-\(stats.damaged)"))
                    stats.damaged += 1
                }
                if roll == 3 {
                    try source.write(to: URL(fileURLWithPath: target.replacingOccurrences(of: ".seg", with: "") + " (conflicted copy \(stats.conflictCopies))"))
                    stats.conflictCopies += 1
                }
                try source.write(to: URL(fileURLWithPath: target), options: .atomic)
                history[target, default: []].append(source)
                stats.copies += 1
            }
        }
    }
}
