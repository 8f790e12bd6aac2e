import BlazeClient
import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

/// What a device does with folder files over its limits (SYNC.md §10).
@Suite(.serialized) struct FolderLimitTests {
    /// A members file over 16 MiB is not read, and the device says so: revocations it holds would otherwise never
    /// reach a member that meets the others only in the folder, with nothing to tell why.
    @Test func aMembersFileOverTheLimitIsReported() throws {
        let team = try FolderTeam(count: 2)
        let folder = TempDir()
        let c = team.clients[0]
        _ = try c.call("folder.add", ["db": "team", "path": .string(folder.path)])
        let space = try spaceOf(c)
        let writer = String(repeating: "ab", count: 16)
        let dir = folder.path + "/" + space + "/" + writer
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        #expect(FileManager.default.createFile(atPath: dir + "/members", contents: nil))
        let file = try FileHandle(forWritingTo: URL(fileURLWithPath: dir + "/members"))
        try file.truncate(atOffset: UInt64(16 << 20) + 1)  // sparse: no 16 MiB written
        try file.close()
        _ = try c.call("sync.now", ["db": "team"])
        #expect(try eventually {
            // The folder's entry appears with its first round: until then there is nothing to read.
            let peers = try c.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
            guard let status = peers.first(where: { $0["peer"]?.stringValue == "folder:" + folder.path }) else { return false }
            return status["lastError"]?.stringValue?.contains("the members file of device \(writer) holds 16777217 bytes") == true
                && (status["errors"]?.intValue ?? 0) >= 1
        })
        team.stopAll()
    }

    /// Directories named to sort before the members' (a folder tool's junk, or a writer hiding others), more than a
    /// reader takes: the members' writes still arrive, and the device says the folder is over its limit.
    @Test func writerDirectoriesOverTheLimitHideNoMember() throws {
        let team = try FolderTeam(count: 2)
        let folder = TempDir()
        for c in team.clients { _ = try c.call("folder.add", ["db": "team", "path": .string(folder.path)]) }
        let space = try spaceOf(team.clients[0])
        for i in 0..<1_000 {
            let name = String(format: "%032x", i)  // 0000…0000 onwards: before any real node id
            try FileManager.default.createDirectory(atPath: folder.path + "/" + space + "/" + name, withIntermediateDirectories: true)
        }
        _ = try team.clients[1].call("doc.put", ["db": "team", "collection": "c", "id": "through", "doc": ["v": 1]])
        #expect(eventually { (try? team.clients[0].call("doc.get", ["db": "team", "collection": "c", "id": "through"])) != nil })
        #expect(try eventually {
            let peers = try team.clients[0].call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
            let status = peers.first { $0["peer"]?.stringValue == "folder:" + folder.path }
            return status?["lastError"]?.stringValue?.contains("more than 1000 writer directories; the first are read") == true
        })
        team.stopAll()
    }

    /// A record refused for a reason that may clear (here a clock just past what the device accepts) is read again a
    /// while later, not skipped for good: once local time catches up, its change is applied.
    @Test func aRecordRefusedOnlyForNowIsReadAgainLater() throws {
        let d = try DaemonProcess(arguments: ["--folder-poll-interval", "0.05"])
        let c = try d.connect()
        let token = legacyToken()
        _ = try c.call("db.join", ["token": .string(token), "db": "team"])
        let folder = TempDir()
        _ = try c.call("folder.add", ["db": "team", "path": .string(folder.path)])
        let m = HostileMember(key: try SpaceKey(token: token))
        let limit = Int64(ChangeBounds.defaultMaxClockAheadMilliseconds)
        let soon = SyncTarget.change(
            m, hlc: HostileMember.clockNow(plusMilliseconds: limit + 3_000), [HostileMember.docOp("notes", "soon", set: ["a": 1])])
        let dir = folder.path + "/" + (try spaceOf(c)) + "/" + m.originHex
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let segment = FolderFiles.segmentHeader(space: m.key.id, writer: m.origin, number: 1) + FolderFiles.record(soon)
        #expect(FileManager.default.createFile(atPath: dir + "/" + FolderFiles.segmentName(1), contents: Data(segment)))
        _ = try c.call("sync.now", ["db": "team"])
        #expect(try eventually { (try folderStatus(c, folder.path)["rejected"]?["clock_ahead"]?.intValue ?? 0) == 1 })
        #expect(eventually(timeout: .seconds(40)) {
            (try? c.call("doc.get", ["db": "team", "collection": "notes", "id": "soon"])) != nil
        })
        #expect(try folderStatus(c, folder.path)["rejected"]?["clock_ahead"]?.intValue == 1, "counted once")
        d.stop()
    }
}
