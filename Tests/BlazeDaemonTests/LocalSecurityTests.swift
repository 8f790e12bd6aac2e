import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import GRDB
import Synchronization
import Testing

@testable import BlazeDaemon

#if canImport(Glibc)
import Glibc
#endif

@Suite struct LocalSecurity {
    @Test func socketAndDataArePrivate() throws {
        let d = try DaemonProcess()
        var st = stat()
        #expect(lstat(d.socket, &st) == 0 && st.st_mode & 0o777 == 0o600)
        #expect(lstat((d.socket as NSString).deletingLastPathComponent, &st) == 0 && st.st_mode & 0o777 == 0o700)
        #expect(lstat(d.dataDir, &st) == 0 && st.st_mode & 0o777 == 0o700)
        d.stop()
    }

    /// Started under umask 022, every file blazed creates is still 0600 (the systemd unit's UMask must not be the
    /// only thing that keeps databases, backups and keys private).
    @Test func filesAreCreated0600WhateverTheUmask() throws {
        let old = umask(0o022)
        defer { umask(old) }
        let d = try DaemonProcess()
        let c = try d.connect()
        _ = try c.call("doc.put", ["db": "default", "collection": "c", "id": "x", "doc": ["v": 1]])
        let space = try #require(try c.call("db.join", ["token": .string(legacyToken()), "db": "legacy"])["space"]?.stringValue)
        _ = try c.call("db.backup", ["db": "default", "path": .string(d.dir.path + "/b.backup")])
        let files = [
            d.dataDir + "/databases/default.db", d.dataDir + "/databases/default.db-wal", d.dir.path + "/b.backup",
            d.dataDir + "/keys/device.json", d.dataDir + "/keys/spaces/\(space).json",
        ]
        for file in files {
            var st = stat()
            #expect(lstat(file, &st) == 0 && st.st_mode & 0o777 == 0o600, "\(file): \(String(st.st_mode & 0o777, radix: 8))")
        }
        d.stop()
    }

    @Test func refusesASocketDirectoryOthersCanWrite() throws {
        let t = TempDir()
        let run_ = t.path + "/run"
        try FileManager.default.createDirectory(atPath: run_, withIntermediateDirectories: true)
        chmod(run_, 0o777)
        let r = try run(buildDirectory + "/blazed", ["--socket", run_ + "/blazed.sock", "--data-dir", t.path + "/d"])
        #expect(r.status != 0 && r.err.contains("writable by other users"), "\(r)")
    }

    /// A space key file others can read is not used, and the client is told why (not just `internal`).
    @Test func aSpaceKeyReadableByOthersIsReportedClearly() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        let space = try #require(try c.call("db.join", ["token": .string(legacyToken()), "db": "legacy"])["space"]?.stringValue)
        d.stop()
        chmod(d.dataDir + "/keys/spaces/\(space).json", 0o644)
        let again = try DaemonProcess(dir: d.dir)
        expectRPCError(try again.connect(), "db.share", ["db": "legacy"], code: -32020, kind: "space_key_unusable")
        again.stop(expectErrors: true)
        #expect(again.logText.split(separator: "\n").contains {
            $0.contains("level=warning") && $0.contains("Cannot load a shared database's space") && $0.contains("db=legacy")
        })
    }

    @Test func refusesToStartOverALiveSocketOrASymlinkAndReplacesAStaleOne() throws {
        let d = try DaemonProcess()
        let second = try run(buildDirectory + "/blazed", ["--socket", d.socket, "--data-dir", d.dir.path + "/d2"])
        #expect(second.status != 0 && second.err.contains("already listening"), "\(second)")
        d.kill9()  // leaves a stale socket file behind
        let restarted = try DaemonProcess(dir: d.dir)
        #expect(try restarted.connect().call("db.list")["databases"] != nil)
        restarted.stop()

        let t = TempDir()
        try FileManager.default.createDirectory(atPath: t.path + "/run", withIntermediateDirectories: true)
        symlink("/tmp/elsewhere.sock", t.path + "/run/blazed.sock")
        let r = try run(buildDirectory + "/blazed", ["--socket", t.path + "/run/blazed.sock", "--data-dir", t.path + "/d"])
        #expect(r.status != 0 && r.err.contains("symlink"), "\(r)")
    }

    @Test(.enabled(if: getuid() == 0, "switching uid needs root"))
    func aClientRunningAsAnotherUserIsRefused() throws {
        let d = try DaemonProcess()
        // Open the path to everyone so that only the SO_PEERCRED check stands between the other user and the daemon.
        chmod(d.dir.path, 0o755)
        chmod((d.socket as NSString).deletingLastPathComponent, 0o755)
        chmod(d.socket, 0o666)
        let script = """
            import socket
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(30)
            s.connect('\(d.socket)')
            try:
                s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"db.list"}\\n')
                print('reply:' + s.recv(65536).decode())
            except OSError as e:
                print('reply:' + type(e).__name__)
            """
        let r = try run("/usr/bin/setpriv", ["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", script])
        #expect(r.status == 0, "\(r)")
        #expect(r.out.hasPrefix("reply:") && !r.out.contains("result") && !r.out.contains("databases"), "\(r)")
        #expect(d.logText.contains("Refused connection from another user"))
        #expect(try d.connect().call("db.list")["databases"] != nil)
        d.stop()
    }
}
