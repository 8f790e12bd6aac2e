import BlazeStore
import BlazeTestSupport
import Foundation
import Testing

@testable import BlazeDaemon

/// How `blob.get` creates its output file (`Methods.writeNewFile`), both ways: unnamed (`O_TMPFILE`) and, where a
/// file system has no unnamed files, through `path.partial`.
@Suite struct NewFileTests {
    /// Names in `dir`, sorted.
    func names(_ dir: TempDir) throws -> [String] { try FileManager.default.contentsOfDirectory(atPath: dir.path).sorted() }

    /// The file appears at its path only once complete, private, with nothing left beside it; an existing file is
    /// never overwritten (`file_exists`); a write that fails leaves nothing.
    @Test(arguments: [true, false])
    func aNewFileAppearsOnlyWholeAndNeverOverwrites(unnamed: Bool) throws {
        let dir = TempDir()
        let path = dir.path + "/out.bin"
        let bytes = [UInt8](repeating: 7, count: 10_000)
        var during: [String] = []
        try Methods.writeNewFile(path, unnamedIfPossible: unnamed) { fd in
            #expect(write(fd, bytes, bytes.count) == bytes.count)
            during = try names(dir)
        }
        #expect(during == (unnamed ? [] : ["out.bin.partial"]), "the file was visible under its name before it was whole")
        #expect(FileManager.default.contents(atPath: path) == Data(bytes))
        var info = stat()
        #expect(lstat(path, &info) == 0 && info.st_mode & 0o777 == 0o600)
        #expect(try names(dir) == ["out.bin"])

        do {
            try Methods.writeNewFile(path, unnamedIfPossible: unnamed) { fd in _ = write(fd, "x", 1) }
            Issue.record("an existing file was overwritten")
        } catch let error as StoreError {
            #expect(error.kind == "file_exists")
        }
        #expect(FileManager.default.contents(atPath: path) == Data(bytes))
        #expect(try names(dir) == ["out.bin"])

        #expect(throws: StoreError.self) {
            try Methods.writeNewFile(dir.path + "/failed.bin", unnamedIfPossible: unnamed) { _ in
                throw StoreError(.invalidArgument, kind: "disk_full", "no room")
            }
        }
        #expect(try names(dir) == ["out.bin"], "a failed write left something behind")
    }
}
