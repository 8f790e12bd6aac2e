import Foundation
import Testing

@testable import BlazeSync

/// Reading a sync folder's files never leaves the folder (SYNC.md §10): a link anywhere below the folder, in place of
/// the space's directory, a writer's directory or the file itself, is not followed.
@Suite struct FolderIOTests {
    @Test func aLinkAnywhereBelowTheFolderIsNotFollowed() throws {
        let base = NSTemporaryDirectory() + "blaze-folderio-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: base) }
        let fm = FileManager.default
        let root = base + "/folder", outside = base + "/outside"
        try fm.createDirectory(atPath: root + "/space/writer", withIntermediateDirectories: true)
        try fm.createDirectory(atPath: outside + "/writer", withIntermediateDirectories: true)
        for dir in [root + "/space/writer", outside, outside + "/writer"] {
            try Data("inside \(dir)".utf8).write(to: URL(fileURLWithPath: dir + "/head"))
        }
        // The real file reads.
        #expect(readWhole(root + "/space/writer/head", beneath: root, limit: 1 << 20) == Array("inside \(root)/space/writer".utf8))
        // A writer's directory swapped for a link to a directory outside the folder.
        try fm.createSymbolicLink(atPath: root + "/space/linked", withDestinationPath: outside)
        #expect(fm.contents(atPath: root + "/space/linked/head") != nil, "a plain open follows the link")
        #expect(readWhole(root + "/space/linked/head", beneath: root, limit: 1 << 20) == nil)
        // The space's directory swapped for one.
        try fm.createSymbolicLink(atPath: root + "/otherspace", withDestinationPath: outside)
        #expect(readWhole(root + "/otherspace/writer/head", beneath: root, limit: 1 << 20) == nil)
        // The file itself a link; a path climbing out; a path not below the folder.
        try fm.createSymbolicLink(atPath: root + "/space/writer/link", withDestinationPath: outside + "/head")
        #expect(readWhole(root + "/space/writer/link", beneath: root, limit: 1 << 20) == nil)
        #expect(readWhole(root + "/space/../../outside/head", beneath: root, limit: 1 << 20) == nil)
        #expect(readWhole(outside + "/head", beneath: root, limit: 1 << 20) == nil)
        // Over the limit.
        #expect(readWhole(root + "/space/writer/head", beneath: root, limit: 3) == nil)
    }
}
