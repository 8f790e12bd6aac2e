import BlazeClient
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
}
