import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `blazectl doctor` (README, "Doctor"): all green on a healthy install; on each broken setup, the problem named and its
/// fix.
@Suite(.serialized) struct DoctorTests {
    /// Runs `blazectl doctor --json` against `socket` with the user units in `units`; its exit status and checks.
    func doctor(_ socket: String, units: String, _ extra: [String] = []) throws -> (status: Int32, checks: [JSONValue], text: String) {
        let ctl = buildDirectory + "/blazectl"
        let json = try run(ctl, ["doctor", "--socket", socket, "--unit-dir", units, "--json"] + extra)
        let checks = (try? JSONParser().parse(json.out))?["checks"]?.arrayValue ?? []
        let text = try run(ctl, ["doctor", "--socket", socket, "--unit-dir", units] + extra)
        #expect(text.status == json.status, "the human and JSON forms disagree")
        return (json.status, checks, text.out + json.err)
    }

    /// The checks of `result` whose status is `status`.
    func with(_ status: String, _ checks: [JSONValue]) -> [JSONValue] { checks.filter { $0["status"]?.stringValue == status } }

    /// Installed and enabled user units in a new directory (what `systemctl --user enable` leaves).
    func enabledUnits() throws -> TempDir {
        let units = TempDir()
        let install = try run(buildDirectory + "/blazectl", ["service", "install", "--unit-dir", units.path, "--blazed", buildDirectory + "/blazed"])
        #expect(install.status == 0, "\(install.err)")
        try FileManager.default.createDirectory(atPath: units.path + "/sockets.target.wants", withIntermediateDirectories: true)
        try FileManager.default.createSymbolicLink(atPath: units.path + "/sockets.target.wants/blazed.socket", withDestinationPath: units.path + "/blazed.socket")
        return units
    }

    @Test func aHealthyInstallIsAllGreen() throws {
        let a = try syncDaemon(), b = try syncDaemon()
        defer {
            a.stop()
            b.stop()
        }
        let (ca, cb) = (try a.connect(), try b.connect())
        _ = try ca.call("db.create", ["db": "notes"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("notes")), "db": "notes"])
        _ = try cb.call("doc.put", ["db": "notes", "collection": "n", "id": "x", "doc": ["t": 1]])
        #expect(try eventually { try replicaState(ca, "notes") == replicaState(cb, "notes") })
        #expect(eventually {
            (try? cb.call("sync.status", ["db": "notes"]))?["databases"]?.arrayValue?.first?["peers"]?.arrayValue?
                .contains { $0["direction"] == "outbound" && $0["connected"] == true } == true
        })
        let units = try enabledUnits()
        let r = try doctor(b.socket, units: units.path, ["--min-free-mib", "1"])
        #expect(r.status == 0, "\(r.text)")
        #expect(!r.checks.isEmpty && r.checks.allSatisfy { $0["status"] == "ok" }, "\(r.text)")
        let names = Set(r.checks.compactMap { $0["check"]?.stringValue })
        for name in ["socket", "unit", "daemon", "data directory", "database default", "database notes", "sync"] {
            #expect(names.contains(name), "no \(name) check in \(r.text)")
        }
        #expect(r.text.contains("✔ sync: notes: peer ") && r.text.contains("connected, protocol \(Handshake.protocols.upperBound)"), "\(r.text)")
        // Without the units: a warning with its fix, still exit 0.
        // (Unless this machine has them installed for every user.)
        let global = ["/etc/systemd/user", "/usr/local/lib/systemd/user", "/usr/lib/systemd/user"]
        if !global.contains(where: { FileManager.default.fileExists(atPath: $0 + "/blazed.socket") }) {
            let none = try doctor(b.socket, units: TempDir().path, ["--min-free-mib", "1"])
            #expect(none.status == 0 && with("warning", none.checks).first?["check"] == "unit", "\(none.text)")
            #expect(none.text.contains("fix: `blazectl service install`"))
        }
    }

    @Test(.enabled(if: getuid() == 0, "giving a socket to another user needs root (CI runs as root)"))
    func aSocketOfAnotherUserIsNamedAndNotUsed() throws {
        let dir = TempDir()
        let path = dir.path + "/blazed.sock"
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            for (i, byte) in path.utf8.enumerated() { raw[i] = byte }
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        #expect(bound == 0 && listen(fd, 1) == 0)
        #expect(chown(path, 65534, 65534) == 0)  // nobody's
        let r = try doctor(path, units: TempDir().path)
        #expect(r.status == 1)
        let socketCheck = r.checks.first { $0["check"] == "socket" }
        #expect(socketCheck?["status"] == "problem", "\(r.text)")
        #expect(socketCheck?["detail"]?.stringValue?.contains("not to you (uid 0): that is another user's daemon") == true, "\(r.text)")
        #expect(socketCheck?["fix"]?.stringValue?.contains("use your own") == true)
        #expect(!r.checks.contains { $0["check"] == "daemon" }, "it talked to another user's daemon")
    }

    @Test func aFullDiskIsNamed() throws {
        // A data directory on a 16 MiB file system (a tmpfs, when this user may mount one), else a threshold above
        // what the disk has: the same check either way.
        let mountPoint = TempDir()
        let mounted = getuid() == 0 && (try? run("/bin/mount", ["-t", "tmpfs", "-o", "size=16m", "tmpfs", mountPoint.path]))?.status == 0
        defer { if mounted { _ = try? run("/bin/umount", ["-l", mountPoint.path]) } }
        let d = try DaemonProcess(dataDir: mountPoint.path + "/data")
        defer { d.stop() }
        let r = try doctor(d.socket, units: try enabledUnits().path, mounted ? [] : ["--min-free-mib", "\(Int.max >> 21)"])
        #expect(r.status == 1)
        let check = r.checks.first { $0["check"] == "data directory" }
        #expect(check?["status"] == "problem" && check?["detail"]?.stringValue?.contains("MiB free of") == true, "\(r.text)")
        #expect(check?["fix"]?.stringValue?.contains("free space on that file system, or move the data directory") == true)
    }

    @Test func aCorruptPageIsNamedWithTheWayBack() throws {
        let dir = TempDir()
        var d = try DaemonProcess(dir: dir)
        let c = try d.connect()
        _ = try c.call("db.create", ["db": "notes"])
        let text = String(repeating: "lorem ipsum ", count: 40)
        for i in 0..<400 { _ = try c.call("doc.put", ["db": "notes", "collection": "n", "id": .string("d\(i)"), "doc": ["t": .string(text)]]) }
        #expect(try c.call("db.check", ["db": "notes"]) == ["db": "notes", "format": .int(Int64(try #require(try c.call("daemon.info")["formats"]?["database"]?.intValue))), "ok": true, "problems": []])
        expectRPCError(c, "db.check", ["db": "nope"], code: -32010, kind: "database_not_found")
        expectRPCError(c, "db.check", ["db": 5], code: -32602, kind: "invalid_params")
        expectRPCError(c, "db.check", [:], code: -32602, kind: "invalid_params")
        d.stop()
        // Damage a page in the middle of the file (the documents' table), the daemon stopped.
        let file = d.dataDir + "/databases/notes.db"
        let handle = try #require(FileHandle(forUpdatingAtPath: file))
        let size = try handle.seekToEnd()
        try handle.seek(toOffset: (size / 2) & ~4095)
        handle.write(Data((0..<4096).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }))
        try handle.close()
        d = try DaemonProcess(dir: dir)
        d.expectsErrors = true
        defer { d.stop(expectErrors: true) }
        let r = try doctor(d.socket, units: try enabledUnits().path, ["--min-free-mib", "1"])
        #expect(r.status == 1)
        let check = r.checks.first { $0["check"] == "database notes" }
        #expect(check?["status"] == "problem" && check?["detail"]?.stringValue?.hasPrefix("damaged: ") == true, "\(r.text)\n\(d.logText.suffix(3000))")
        #expect(check?["fix"]?.stringValue?.contains("blazectl db restore notes BACKUP") == true)
        #expect(r.checks.first { $0["check"] == "database default" }?["status"] == "ok")
    }

    @Test func anUnreachableRelayIsNamed() throws {
        let d = try syncDaemon()
        defer { d.stop() }
        let c = try d.connect()
        _ = try c.call("db.create", ["db": "notes"])
        _ = try c.call("db.share", ["db": "notes"])
        // A port nothing listens on (taken and released).
        let address = "ws://127.0.0.1:\(StablePorts.next())"
        _ = try c.call("peer.add", ["db": "notes", "address": .string(address)])
        #expect(eventually {
            (try? c.call("sync.status", ["db": "notes"]))?["databases"]?.arrayValue?.first?["peers"]?.arrayValue?.first?["lastError"] != .null
        })
        let r = try doctor(d.socket, units: try enabledUnits().path, ["--min-free-mib", "1"])
        #expect(r.status == 1)
        let check = r.checks.first { $0["check"] == "sync" }
        #expect(check?["status"] == "problem" && check?["detail"]?.stringValue?.hasPrefix("notes: peer \(address)/v1/sync unreachable: connect: ") == true, "\(r.text)")
        #expect(check?["fix"]?.stringValue?.contains("`blazectl peer remove notes \(address)/v1/sync`") == true)
    }

    @Test func aClockTenMinutesOffIsNamed() throws {
        let ahead = try DaemonProcess(arguments: ["--sync-listen", "127.0.0.1:0"], environment: ["BLAZE_CLOCK_SKEW_MS": "600000"])
        let here = try syncDaemon()
        defer {
            ahead.stop()
            here.stop()
        }
        let (ca, ch) = (try ahead.connect(), try here.connect())
        _ = try ca.call("db.create", ["db": "notes"])
        _ = try ch.call("db.join", ["token": .string(try ca.invite("notes")), "db": "notes"])
        var skew: Int64?
        #expect(eventually {
            skew = (try? ch.call("sync.status", ["db": "notes"]))?["databases"]?.arrayValue?.first?["peers"]?.arrayValue?
                .compactMap { $0["clockSkewMs"]?.intValue }.first
            return skew != nil
        })
        #expect((590_000...610_000).contains(skew ?? 0), "skew \(String(describing: skew))")
        let r = try doctor(here.socket, units: try enabledUnits().path, ["--min-free-mib", "1"])
        #expect(r.status == 1)
        let check = r.checks.first { $0["check"] == "clock" }
        #expect(check?["status"] == "problem" && check?["detail"]?.stringValue?.contains("10.0 min ahead of this machine's") == true, "\(r.text)")
        #expect(check?["fix"]?.stringValue?.contains("timedatectl set-ntp true") == true)
        // The other side sees this one behind.
        let r2 = try doctor(ahead.socket, units: try enabledUnits().path, ["--min-free-mib", "1"])
        #expect(r2.checks.contains { $0["check"] == "clock" && $0["detail"]?.stringValue?.contains("min behind this machine's") == true }, "\(r2.text)")
    }
}
