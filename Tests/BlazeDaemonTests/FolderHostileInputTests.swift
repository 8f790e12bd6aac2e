// Folder sync against hostile or bad input: links, FIFOs and bogus files in the folder, and invalid arguments to
// the folder methods. The devices and helpers are in FolderTests.swift.

import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension FolderTests {
    /// A folder that lies (links, FIFOs, records that never end) and arguments that are not a usable folder.
    @Suite struct HostileInput {
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
}
