import Foundation
import Synchronization
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

    /// While another thread keeps swapping a writer's directory for a link to a directory outside the folder, and
    /// its head file for a link to a file outside, every read gives the file inside the folder or nothing: never
    /// what is outside, whichever step of the swap it meets (the descriptor-relative opens refuse a link at any
    /// component, so there is no window between a check and the open).
    @Test func filesSwappedForLinksMidReadNeverLeadOutside() throws {
        let base = NSTemporaryDirectory() + "blaze-folderswap-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: base) }
        let fm = FileManager.default
        let root = base + "/folder", outside = base + "/outside"
        let writer = root + "/space/writer"
        try fm.createDirectory(atPath: writer, withIntermediateDirectories: true)
        try fm.createDirectory(atPath: outside + "/writer", withIntermediateDirectories: true)
        let inside = Array("inside".utf8), secret = Array("outside".utf8)
        try Data(inside).write(to: URL(fileURLWithPath: writer + "/head"))
        for path in [outside + "/head", outside + "/writer/head"] { try Data(secret).write(to: URL(fileURLWithPath: path)) }
        let stop = Atomic<Bool>(false)
        let swaps = Atomic<Int>(0)
        let done = DispatchSemaphore(value: 0)
        let swapper = Thread {
            defer { done.signal() }
            while !stop.load(ordering: .relaxed) {
                // The head file becomes a link to a file outside, atomically, and back.
                _ = symlink(outside + "/head", writer + "/head.link")
                _ = rename(writer + "/head.link", writer + "/head")
                _ = FileManager.default.createFile(atPath: writer + "/head.new", contents: Data(inside))
                _ = rename(writer + "/head.new", writer + "/head")
                // The directory moves away and a link to a directory outside takes its place, then it comes back.
                _ = rename(writer, writer + ".real")
                _ = symlink(outside + "/writer", writer)
                _ = unlink(writer)
                _ = rename(writer + ".real", writer)
                swaps.add(1, ordering: .relaxed)
            }
        }
        swapper.start()
        var reads = 0, gotInside = 0, leaked = 0
        let deadline = Date().addingTimeInterval(5)
        while reads < 20_000 && Date() < deadline {
            if let bytes = readWhole(writer + "/head", beneath: root, limit: 1 << 20) {
                if bytes == inside { gotInside += 1 } else { leaked += 1 }
            }
            reads += 1
        }
        stop.store(true, ordering: .relaxed)
        #expect(done.wait(timeout: .now() + 10) == .success)
        #expect(leaked == 0, "\(leaked) of \(reads) reads gave something other than the file inside")
        #expect(gotInside > 0 && swaps.load(ordering: .relaxed) > 0, "\(gotInside) reads inside, \(swaps.load(ordering: .relaxed)) swaps")
    }
}
