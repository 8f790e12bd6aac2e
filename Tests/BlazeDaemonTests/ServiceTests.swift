import BlazeClient
import BlazeConfig
@testable import BlazeDaemon
import BlazeProtocol
import BlazeStore
import BlazeSync
import BlazeTestSupport
import Foundation
import GRDB
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The repository root (for Packaging/).
let repositoryRoot: String = {
    var dir = URL(fileURLWithPath: #filePath)
    while dir.path != "/" {
        dir.deleteLastPathComponent()
        if FileManager.default.fileExists(atPath: dir.appendingPathComponent("Package.swift").path) { return dir.path }
    }
    return "."
}()

/// A datagram socket bound at `path`, standing in for systemd's notification socket.
final class NotifyListener {
    let fd: Int32
    let path: String

    init(path: String) throws {
        self.path = path
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(path.utf8) + [0]) }
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard rc == 0 else { throw ClientError("bind \(path): \(String(cString: strerror(errno)))") }
        var timeout = timeval(tv_sec: 30, tv_usec: 0)  // a deadline for each receive
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    /// The next datagram, nil after the deadline.
    func receive() -> String? {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let n = recv(fd, &buffer, buffer.count, 0)
        return n > 0 ? String(decoding: buffer[..<n], as: UTF8.self) : nil
    }

    deinit { close(fd) }
}

@Suite struct ServiceIntegration {
    @Test func blazedServesTheSocketSystemdPassesIt() throws {
        let dir = TempDir()
        let socketPath = dir.path + "/activated.sock"
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/systemd-socket-activate")
        p.arguments = [
            "-l", socketPath, "-E", "XDG_CONFIG_HOME=\(dir.path)/config",
            buildDirectory + "/blazed", "--data-dir", dir.path + "/data", "--log-level", "debug",
        ]
        let log = Pipe()
        p.standardError = log
        p.standardOutput = FileHandle.nullDevice
        try p.run()
        defer { if p.isRunning { kill(p.processIdentifier, SIGKILL); p.waitUntilExit() } }
        #expect(eventually(timeout: .seconds(30)) { FileManager.default.fileExists(atPath: socketPath) }, "systemd-socket-activate listens")
        // The first connection makes systemd-socket-activate exec blazed (same pid) with the socket as fd 3. The file
        // appears when the socket is bound, a moment before it listens: a refused connection is tried again.
        var connection: BlazeConnection?
        #expect(eventually(timeout: .seconds(30)) {
            connection = try? BlazeConnection(socketPath: socketPath, timeoutSeconds: 30)
            return connection != nil
        }, "the activated socket accepts a connection")
        let c = try #require(connection)
        let info = try c.call("daemon.info")
        #expect(info["socket"] == .string(socketPath))
        #expect(info["pid"] == .int(Int64(p.processIdentifier)))
        _ = try c.call("doc.put", ["db": "default", "collection": "c", "id": "x", "doc": ["v": 1]])
        #expect(try c.call("doc.get", ["db": "default", "collection": "c", "id": "x"])["doc"]?["v"] == 1)
        c.close()
        p.terminate()
        p.waitUntilExit()
        let text = String(decoding: log.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(p.terminationReason == .exit && p.terminationStatus == 0, "\(text)")
        #expect(text.contains("msg=Listening") && text.contains("socket.inherited=true"), "\(text)")
        #expect(FileManager.default.fileExists(atPath: socketPath), "an inherited socket belongs to systemd and stays")
    }

    @Test func aSocketMeantForAnotherProcessIsIgnored() throws {
        let d = try DaemonProcess(environment: ["LISTEN_PID": "1", "LISTEN_FDS": "1"])
        #expect(try d.connect().call("daemon.info")["socket"] == .string(d.socket))
        #expect(d.logText.contains("socket.inherited=false"))
        d.stop()
    }

    @Test func readinessAndStoppingReachTheNotifySocket() throws {
        let dir = TempDir()
        let listener = try NotifyListener(path: dir.path + "/notify.sock")
        let d = try DaemonProcess(dir: dir, environment: ["NOTIFY_SOCKET": listener.path])
        let ready = try #require(listener.receive())
        let fields = Set(ready.split(separator: "\n").map(String.init))
        #expect(fields.contains("READY=1") && fields.contains("MAINPID=\(d.pid)"), "\(ready)")
        // Ready means served: a request succeeds right away.
        #expect(try d.connect().call("db.list")["databases"]?.arrayValue?.map { $0["name"] } == ["default"])
        d.stop()
        let stopping = try #require(listener.receive())
        #expect(stopping.split(separator: "\n").contains("STOPPING=1"), "\(stopping)")
    }

    @Test func installedUnitsPassSystemdAnalyzeAndMatchPackaging() throws {
        let dir = TempDir()
        let units = dir.path + "/units"
        let ctl = buildDirectory + "/blazectl"
        let install = try run(ctl, ["service", "install", "--unit-dir", units, "--blazed", buildDirectory + "/blazed"])
        #expect(install.status == 0, "\(install.err)")
        #expect(install.out == """
            wrote \(units)/blazed.socket
            wrote \(units)/blazed.service
            blazed: \(buildDirectory)/blazed
            To start blazed on the first connection, and at every login, run:
              systemctl --user daemon-reload
              systemctl --user enable --now blazed.socket
            A blazed already started by hand holds the socket: stop it first.

            """)
        let service = try String(contentsOfFile: units + "/blazed.service", encoding: .utf8)
        let socketUnit = try String(contentsOfFile: units + "/blazed.socket", encoding: .utf8)
        #expect(service.contains("\nExecStart=\(buildDirectory)/blazed\n") && service.contains("\nType=notify\n"))
        // Packaging/systemd holds the same units, rendered for /usr/local/bin/blazed.
        let packaged = try String(contentsOfFile: repositoryRoot + "/Packaging/systemd/blazed.service", encoding: .utf8)
        #expect(packaged == service.replacingOccurrences(of: "ExecStart=\(buildDirectory)/blazed", with: "ExecStart=/usr/local/bin/blazed"))
        #expect(try String(contentsOfFile: repositoryRoot + "/Packaging/systemd/blazed.socket", encoding: .utf8) == socketUnit)

        let runtime = dir.path + "/runtime"
        try FileManager.default.createDirectory(atPath: runtime, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        var env = ProcessInfo.processInfo.environment
        env["XDG_RUNTIME_DIR"] = runtime
        let verify = try run(
            "/usr/bin/systemd-analyze", ["verify", "--user", units + "/blazed.socket", units + "/blazed.service"], environment: env)
        #expect(verify.status == 0 && verify.err.isEmpty, "systemd-analyze verify: \(verify.err)")

        let status = try run(ctl, ["service", "status", "--unit-dir", units, "--socket", dir.path + "/none.sock", "--json"])
        let s = try JSONParser().parse(status.out)
        #expect(s["serviceUnit"] == .string(units + "/blazed.service") && s["execStart"] == .string(buildDirectory + "/blazed"))
        #expect(s["running"] == false)
        let uninstall = try run(ctl, ["service", "uninstall", "--unit-dir", units])
        #expect(uninstall.status == 0 && uninstall.out.hasPrefix("removed \(units)/blazed.socket\nremoved \(units)/blazed.service\n"))
        #expect(try FileManager.default.contentsOfDirectory(atPath: units).isEmpty)
        let missing = try run(ctl, ["service", "install", "--unit-dir", units, "--blazed", dir.path + "/nothing"])
        #expect(missing.status == 1 && missing.err == "blazectl: error: \(dir.path)/nothing is not an executable file\n")
    }
}

@Suite struct Logs {
    @Test func requestsAreLoggedWithMetadataButNeverDocumentContents() throws {
        let marker = "secret-\(UInt64.random(in: 0 ... .max))"
        let debug = try DaemonProcess(arguments: ["--log-level", "debug"])
        let c = try debug.connect()
        _ = try c.call("doc.put", ["db": "default", "collection": "c", "id": "x", "doc": ["v": .string(marker)]])
        expectRPCError(c, "doc.get", ["db": "default", "collection": "c", "id": "missing"], code: -32010)
        debug.stop()
        let lines = debug.logText.split(separator: "\n")
        #expect(lines.contains { $0.contains("msg=Request") && $0.contains("rpc.method=doc.put") && $0.contains("connection.id=") && $0.contains("duration.us=") })
        #expect(lines.contains { $0.contains("rpc.method=doc.get") && $0.contains("error.kind=document_not_found") })
        #expect(!debug.logText.contains(marker), "no document contents in the log")

        let info = try DaemonProcess(arguments: ["--log-format", "json"])
        _ = try info.connect().call("doc.put", ["db": "default", "collection": "c", "id": "x", "doc": ["v": .string(marker)]])
        info.stop()
        let objects = try info.logText.split(separator: "\n").map { try JSONParser().parse(String($0)) }
        #expect(!objects.isEmpty)
        for o in objects {
            #expect(o["ts"]?.stringValue?.hasSuffix("Z") == true && o["level"] != nil && o["msg"] != nil, "\(o)")
            #expect(o["level"] != "debug" && o["msg"] != "Request", "info level has no request lines")
        }
        #expect(objects.contains { $0["msg"] == "Listening" && $0["socket.path"] == .string(info.socket) })
        #expect(!info.logText.contains(marker))
    }
}

@Suite struct BackupRestore {
    @Test func aBackupTakenUnderSteadyWritesRestoresToTheSnapshot() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        _ = try c.call("doc.put", ["db": "default", "collection": "k", "id": "counter", "doc": ["n": 0]])
        _ = try c.call("index.create", ["db": "default", "collection": "docs", "fields": ["i"]])
        let written = Atomic<Int>(0)
        let stop = Atomic<Bool>(false)
        let done = DispatchSemaphore(value: 0)
        Thread {
            defer { done.signal() }
            guard let w = try? BlazeConnection(socketPath: d.socket, timeoutSeconds: 60) else { return }
            var i = 0
            // Each transaction adds one document and counts it: a consistent snapshot has counter == documents.
            while !stop.load(ordering: .relaxed) && i < 100_000 {
                let ops: JSONValue = [
                    ["op": "put", "collection": "docs", "id": .string("d\(i)"), "doc": ["i": .int(Int64(i)), "pad": .string(String(repeating: "x", count: 200))]],
                    ["op": "patch", "collection": "k", "id": "counter", "incr": ["n": 1]],
                ]
                guard (try? w.call("tx.commit", ["db": "default", "ops": ops])) != nil else { return }
                i += 1
                written.store(i, ordering: .relaxed)
            }
        }.start()
        #expect(eventually(timeout: .seconds(60)) { written.load(ordering: .relaxed) >= 500 })
        let path = d.dir.path + "/default.backup"
        let backup = try c.call("db.backup", ["db": "default", "path": .string(path)])
        let atBackup = written.load(ordering: .relaxed)
        #expect(eventually(timeout: .seconds(60)) { written.load(ordering: .relaxed) >= atBackup + 200 }, "writes go on after the backup")
        stop.store(true, ordering: .relaxed)
        #expect(done.wait(timeout: .now() + 60) == .success)

        let files = try FileManager.default.contentsOfDirectory(atPath: d.dir.path).filter { $0.hasPrefix("default.backup") }
        #expect(files == ["default.backup"], "one self-contained file, nothing partial")
        var readonly = GRDB.Configuration()
        readonly.readonly = true
        let file = try DatabaseQueue(path: path, configuration: readonly)
        #expect(try file.read { try String.fetchAll($0, sql: "PRAGMA integrity_check") } == ["ok"])
        try file.close()
        #expect(backup["bytes"]?.intValue == Int64((try FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.int64Value ?? -1))

        let restored = try c.call("db.restore", ["path": .string(path), "db": "restored"])
        #expect(restored["stateHash"] == backup["stateHash"] && restored["documents"] == backup["documents"])
        let documents = try #require(backup["documents"]?.intValue)
        let counter = try c.call("doc.get", ["db": "restored", "collection": "k", "id": "counter"])["doc"]?["n"]
        #expect(counter == .int(documents - 1), "the snapshot holds whole transactions only")
        #expect(try c.call("db.info", ["db": "restored"])["stateHash"] == backup["stateHash"])
        #expect(try replicaState(c, "default").docs > documents, "the source went on")
        // Indexes come along and queries use them.
        #expect(try c.call("query.explain", ["db": "restored", "collection": "docs", "where": ["i": 3]])["indexes"] == ["docs.i"])
        #expect(try c.call("query.count", ["db": "restored", "collection": "docs", "where": ["i": ["$lt": 100]]])["count"] == 100)
        // The restored database is an ordinary local one: it takes writes and is not shared.
        _ = try c.call("doc.put", ["db": "restored", "collection": "k", "id": "after", "doc": ["ok": true]])
        expectRPCError(c, "sync.now", ["db": "restored"], code: -32020, kind: "not_shared")
        // The feed of the original is not carried over (nothing would validate its events): it starts empty.
        expectRPCError(c, "subscribe", ["db": "restored", "since": 1], code: -32012, kind: "feed_expired")
        d.stop()
    }

    /// A backup is as hostile as a peer: a crafted file is refused (or its derived parts rebuilt), never copied in.
    @Test(arguments: [
        ("trigger", "CREATE TRIGGER wipe AFTER INSERT ON docs BEGIN DELETE FROM docs; END", "backup_tampered"),
        ("view", "CREATE VIEW peek AS SELECT body FROM docs", "backup_tampered"),
        ("table", "CREATE TABLE extra(x)", "backup_tampered"),
        ("altered", "ALTER TABLE docs ADD COLUMN planted TEXT DEFAULT 'x'", "backup_tampered"),
        ("negative clock", "UPDATE changes SET body = replace(body, '\"h\":', '\"h\":-1') WHERE seq = 2", "backup_invalid"),
        ("huge causal length", "UPDATE docs SET state = replace(state, '\"l\":1', '\"l\":9223372036854775807') WHERE id = 'x'",
            "backup_invalid"),
        ("string increment", "UPDATE changes SET body = replace(body, '\"incr\":{\"n\":1}', '\"incr\":{\"n\":\"x\"}')",
            "backup_invalid"),
        // Values of the wrong SQLite type used to trap the daemon when decoded (affinity does not enforce types).
        ("text clock", "UPDATE changes SET hlc = 'soon' WHERE seq = 1", "backup_invalid"),
        ("text version", "UPDATE versions SET seq = 'many'", "backup_invalid"),
        ("blob id", "UPDATE docs SET id = x'00ff' WHERE id = 'x'", "backup_invalid"),
        ("clock column apart from its change", "UPDATE changes SET hlc = hlc + 1 WHERE seq = 1", "backup_invalid"),
        // Reads splice stored bodies into response lines: a body with a line break would split one.
        ("body not canonical", "UPDATE docs SET body = replace(body, ',', ',' || char(10)) WHERE id = 'x'", "backup_invalid"),
    ])
    func aCraftedBackupIsRefused(what: String, sql: String, kind: String) throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        _ = try c.call("doc.put", ["db": "default", "collection": "c", "id": "x", "doc": ["n": 1]])
        _ = try c.call("doc.patch", ["db": "default", "collection": "c", "id": "x", "incr": ["n": 1]])
        let path = d.dir.path + "/crafted.backup"
        _ = try c.call("db.backup", ["db": "default", "path": .string(path)])
        let file = try DatabaseQueue(path: path)
        let changed = try file.write { db -> Int in
            try db.execute(sql: sql)
            return db.changesCount
        }
        try file.close()
        #expect(!sql.hasPrefix("UPDATE") || changed > 0, "the crafted edit (\(what)) changed nothing")
        expectRPCError(c, "db.restore", ["path": .string(path), "db": "crafted"], code: -32602, kind: kind)
        expectRPCError(c, "db.info", ["db": "crafted"], code: -32010, kind: "database_not_found")
        #expect(!FileManager.default.fileExists(atPath: d.dataDir + "/databases/crafted.db.partial"))
        d.stop()
    }

    @Test func aBackupsForeignIndexIsDroppedAndUserIndexesAreRebuilt() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        for i in 0..<20 { _ = try c.call("doc.put", ["db": "default", "collection": "c", "id": .string("d\(i)"), "doc": ["n": .int(Int64(i))]]) }
        _ = try c.call("index.create", ["db": "default", "collection": "c", "fields": ["n"]])
        let path = d.dir.path + "/indexed.backup"
        _ = try c.call("db.backup", ["db": "default", "path": .string(path)])
        let file = try DatabaseQueue(path: path)
        try file.write { db in
            // A unique index that would make every later insert fail, and a user index whose SQL was altered.
            try db.execute(sql: "CREATE UNIQUE INDEX trap ON docs(collection) WHERE id > 'd9'")
            try db.execute(sql: "DROP INDEX \"ux_c.n\"")
            try db.execute(sql: "CREATE INDEX \"ux_c.n\" ON docs(rowid)")
        }
        try file.close()
        _ = try c.call("db.restore", ["path": .string(path), "db": "indexed"])
        for id in ["d98", "d99"] {
            _ = try c.call("doc.put", ["db": "indexed", "collection": "c", "id": .string(id), "doc": ["n": 99]])
        }
        #expect(try c.call("query.explain", ["db": "indexed", "collection": "c", "where": ["n": 3]])["indexes"] == ["c.n"])
        #expect(try c.call("query.count", ["db": "indexed", "collection": "c", "where": ["n": ["$gte": 10]]])["count"] == 12)
        d.stop()
    }

    @Test func backupAndRestoreRefuseBadInput() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        let dir = d.dir.path
        _ = try c.call("doc.put", ["db": "default", "collection": "c", "id": "x", "doc": ["v": 1]])
        let good = dir + "/good.backup"
        _ = try c.call("db.backup", ["db": "default", "path": .string(good)])
        expectRPCError(c, "db.backup", ["db": "default", "path": "relative.backup"], code: -32602, kind: "invalid_path")
        expectRPCError(c, "db.backup", ["db": "default", "path": .string(good)], code: -32011, kind: "file_exists")
        expectRPCError(c, "db.backup", ["db": "default", "path": .string(dir + "/no/such/dir.backup")], code: -32010, kind: "directory_not_found")
        expectRPCError(c, "db.backup", ["db": "missing", "path": .string(dir + "/m.backup")], code: -32010, kind: "database_not_found")
        expectRPCError(c, "db.backup", ["db": "default"], code: -32602)
        expectRPCError(c, "db.backup", ["db": "default", "path": 7], code: -32602)
        expectRPCError(c, "db.backup", ["db": "default", "path": .string(dir + "/x.backup"), "extra": 1], code: -32602)

        expectRPCError(c, "db.restore", ["path": .string(dir + "/none.backup"), "db": "r"], code: -32010, kind: "file_not_found")
        expectRPCError(c, "db.restore", ["path": "good.backup", "db": "r"], code: -32602, kind: "invalid_path")
        expectRPCError(c, "db.restore", ["path": .string(good), "db": "default"], code: -32011, kind: "database_exists")
        expectRPCError(c, "db.restore", ["path": .string(good), "db": "../x"], code: -32602, kind: "invalid_name")
        expectRPCError(c, "db.restore", ["path": .string(good)], code: -32602)
        let text = dir + "/notes.txt"
        try String(repeating: "not a database\n", count: 500).write(toFile: text, atomically: true, encoding: .utf8)
        expectRPCError(c, "db.restore", ["path": .string(text), "db": "r"], code: -32602, kind: "not_a_backup")
        let plain = dir + "/plain.sqlite"
        let other = try DatabaseQueue(path: plain)
        try other.write { try $0.execute(sql: "CREATE TABLE t(x)") }
        try other.close()
        expectRPCError(c, "db.restore", ["path": .string(plain), "db": "r"], code: -32602, kind: "not_a_backup")
        // A damaged backup: the b-tree page holding the documents is overwritten.
        let damaged = dir + "/damaged.backup"
        try FileManager.default.copyItem(atPath: good, toPath: damaged)
        var readonly = GRDB.Configuration()
        readonly.readonly = true
        let probe = try DatabaseQueue(path: good, configuration: readonly)
        let (root, pageSize) = try probe.read { db in
            (try Int.fetchOne(db, sql: "SELECT rootpage FROM sqlite_master WHERE name = 'docs'") ?? 2,
             try Int.fetchOne(db, sql: "PRAGMA page_size") ?? 4096)
        }
        try probe.close()
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: damaged))
        try handle.seek(toOffset: UInt64((root - 1) * pageSize))
        handle.write(Data(repeating: 0xA5, count: pageSize))
        try handle.close()
        expectRPCError(c, "db.restore", ["path": .string(damaged), "db": "r"], code: -32602)
        #expect(try c.call("db.list")["databases"]?.arrayValue?.map { $0["name"] } == ["default"], "nothing was created by the refusals")
        #expect(try FileManager.default.contentsOfDirectory(atPath: d.dataDir + "/databases").allSatisfy { !$0.contains("partial") })
        d.stop()
    }

    @Test func aRestoredCopyOfASharedDatabaseIsDetachedAndCannotStartANewSpace() throws {
        let a = try syncDaemon(), b = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "x", "doc": ["from": "a"]])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        #expect(try eventually { try replicaState(cb, "team").docs == 1 })
        _ = try cb.call("doc.put", ["db": "team", "collection": "c", "id": "y", "doc": ["from": "b"]])
        let path = b.dir.path + "/team.backup"
        let backup = try cb.call("db.backup", ["db": "team", "path": .string(path)])
        _ = try cb.call("db.restore", ["path": .string(path), "db": "copy"])
        #expect(try replicaState(cb, "copy").hash == backup["stateHash"]?.stringValue)
        let status = try cb.call("sync.status")["databases"]?.arrayValue ?? []
        #expect(status.map { $0["db"] } == ["team"], "the copy is not shared: \(status)")
        expectRPCError(cb, "db.share", ["db": "copy"], code: -32020, kind: "restored_copy")
        a.stop()
        b.stop()
    }
}
