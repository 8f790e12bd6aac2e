import BlazeClient
import BlazeProtocol
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// BLOB, between devices: a file put on one daemon and fetched by another over a loopback peer link (`blob.get`),
/// against `rsync` of the same file to an rsync daemon on loopback (with `--fsync`, as every fetched chunk is synced),
/// and over ssh to loopback (which encrypts, as a peer link does), in the same run.
enum BlobPeerWorkloads {
    /// Runs it on a file of `megabytes` MiB of random bytes, `repeats` times (each repeat a new database, so every
    /// chunk crosses); the rsync rows only when `rsync` is installed.
    static func run(dir: String, megabytes: Int, repeats: Int) async throws -> [Result] {
        let work = dir + "/blob-peer"
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: work) }
        let source = work + "/source"
        try BlobWorkloads.writeRandomFile(source, bytes: megabytes << 20)
        let mib = Double(megabytes)
        let a = try await Workloads.LocalDaemon(dir: work + "/a", syncListen: "127.0.0.1:0")
        let b = try await Workloads.LocalDaemon(dir: work + "/b")
        defer {
            Task {
                await b.stop()
                await a.stop()
            }
        }
        let ca = try BlazeConnection(socketPath: a.socket, timeoutSeconds: 600)
        let cb = try BlazeConnection(socketPath: b.socket, timeoutSeconds: 600)
        var fetch: [Double] = [], rsync: [Double] = [], rsyncSSH: [Double] = []
        var chunks = 0
        let rsyncd = try? RsyncDaemon(directory: work + "/rsync")
        defer { rsyncd?.stop() }
        // rsync over ssh encrypts and authenticates what crosses, as a peer link does: the same file, when sshd is installed.
        let sshd = try? SSHServer(directory: work + "/ssh")
        defer { sshd?.stop() }
        for r in 0..<repeats {
            let name = "b4-\(r)"
            let db = try a.daemon.store.create(name)
            let put = try ca.call("blob.put", ["db": .string(name), "path": .string(source)])
            chunks = Int(put["chunks"]?.intValue ?? 0)
            let joined = try b.daemon.sync.join(token: try invite(a, db), name: name)
            // The fetch needs the link up: the join dials A, and the link stays.
            let deadline = Date().addingTimeInterval(60)
            while !b.daemon.sync.status(db: joined).contains(where: { $0.connected }) {
                guard Date() < deadline else { throw BenchFailure("BLOB.peer: the link never came up") }
                usleep(2000)
            }
            let out = work + "/out-\(r)"
            // Which goes first alternates: on a virtual machine, writing into memory the page cache has not used lately
            // costs several times more than into memory just freed, so the second of the two would be favoured.
            func copyByRsync() throws {
                guard let rsyncd else { return }
                let copy = "rsync://127.0.0.1:\(rsyncd.port)/bench/copy"
                rsync.append(mib / (try seconds { try BlobWorkloads.shell("rsync --fsync --whole-file '\(source)' \(copy)") }))
                unlink(work + "/rsync/data/copy")
            }
            func copyBySSH() throws {
                guard let sshd else { return }
                let copy = work + "/ssh/copy"
                rsyncSSH.append(mib / (try seconds { try BlobWorkloads.shell("rsync --fsync --whole-file -e '\(sshd.command)' '\(source)' 127.0.0.1:\(copy)") }))
                unlink(copy)
            }
            if r % 2 == 1 {
                try copyByRsync()
                try copyBySSH()
            }
            fetch.append(mib / (try seconds { _ = try cb.call("blob.get", ["db": .string(name), "blob": put["blob"]!["id"]!, "path": .string(out)]) }))
            guard FileManager.default.contentsEqual(atPath: out, andPath: source) else { throw BenchFailure("BLOB.peer: the fetched blob differs") }
            unlink(out)
            if r % 2 == 0 {
                try copyBySSH()
                try copyByRsync()
            }
        }
        // The target's baseline is rsync over its default remote transport: given `host:path`, rsync runs over ssh,
        // which encrypts and authenticates as a peer link does. The rsync daemon (neither) is the second, for reference.
        var rows = [
            Result(
                name: "B4.peerFetch", unit: "MiB/s", samples: fetch, better: "higher",
                baseline: rsyncSSH.isEmpty ? nil : "B4.rsyncSSH", secondBaseline: rsync.isEmpty ? nil : "B4.rsync",
                target: "≥ 0.8× rsync (ssh)",
                note: "\(megabytes) MiB in \(chunks) chunks put on A, fetched by B over a loopback peer link (blob.get: sealed, opened, checked, each chunk synced)"),
        ]
        if !rsyncSSH.isEmpty {
            rows.insert(Result(
                name: "B4.rsyncSSH", unit: "MiB/s", samples: rsyncSSH, better: "higher",
                note: "rsync --fsync of the same file to 127.0.0.1 over ssh, rsync's default remote transport (encrypted)"), at: 0)
            rows[rows.count - 1].paired["B4.rsyncSSH"] = zip(fetch, rsyncSSH).map { $0 / $1 }
        }
        if !rsync.isEmpty {
            rows.insert(Result(
                name: "B4.rsync", unit: "MiB/s", samples: rsync, better: "higher",
                note: "rsync --fsync of the same file to an rsync daemon on loopback (no encryption)"), at: 0)
            rows[rows.count - 1].paired["B4.rsync"] = zip(fetch, rsync).map { $0 / $1 }
        }
        return rows
    }

    /// An rsync daemon on a loopback port, writing into `directory`; init fails when rsync is not installed.
    final class RsyncDaemon {
        let process = Process()
        let port: Int

        init(directory: String) throws {
            try FileManager.default.createDirectory(atPath: directory + "/data", withIntermediateDirectories: true)
            port = Int.random(in: 20_000..<30_000)
            let config = directory + "/rsyncd.conf"
            // As this user (run as root, rsyncd would write as nobody).
            let text = "use chroot = no\nuid = \(getuid())\ngid = \(getgid())\nport = \(port)\naddress = 127.0.0.1\n"
                + "pid file = \(directory)/pid\n[bench]\npath = \(directory)/data\nread only = no\n"
            try text.write(toFile: config, atomically: true, encoding: .utf8)
            process.executableURL = URL(fileURLWithPath: "/usr/bin/rsync")
            process.arguments = ["--daemon", "--no-detach", "--config=\(config)"]
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            // Ready once its port answers.
            let deadline = Date().addingTimeInterval(10)
            while (try? BlobWorkloads.shell("rsync rsync://127.0.0.1:\(port)/ > /dev/null 2>&1")) == nil {
                guard Date() < deadline, process.isRunning else {
                    stop()
                    throw BenchFailure("rsync daemon did not start")
                }
                usleep(20_000)
            }
        }

        func stop() {
            if process.isRunning { process.terminate() }
            process.waitUntilExit()
        }
    }
}

extension BlobPeerWorkloads {
    /// An sshd of its own on a loopback port, letting in one key made for it; init fails when sshd is not installed.
    final class SSHServer {
        let process = Process()
        let port: Int
        /// The `ssh` command line (for `rsync -e`) that logs in to it.
        let command: String

        init(directory: String) throws {
            guard FileManager.default.isExecutableFile(atPath: "/usr/sbin/sshd") else { throw BenchFailure("sshd is not installed") }
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            for key in ["host", "client"] {
                try BlobWorkloads.shell("ssh-keygen -q -t ed25519 -N '' -f '\(directory)/\(key)' < /dev/null")
            }
            try FileManager.default.copyItem(atPath: directory + "/client.pub", toPath: directory + "/authorized_keys")
            port = Int.random(in: 30_000..<40_000)
            let config = directory + "/sshd_config"
            let text = "Port \(port)\nListenAddress 127.0.0.1\nHostKey \(directory)/host\nAuthorizedKeysFile \(directory)/authorized_keys\n"
                + "PasswordAuthentication no\nKbdInteractiveAuthentication no\nStrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\n"
                + "PidFile \(directory)/pid\n"
            try text.write(toFile: config, atomically: true, encoding: .utf8)
            // As root, sshd wants its privilege separation directory.
            if getuid() == 0 { try? FileManager.default.createDirectory(atPath: "/run/sshd", withIntermediateDirectories: true) }
            // Only this sshd's host key is trusted: the probe below cannot log in to another server on the port.
            let hostKey = try String(contentsOfFile: directory + "/host.pub", encoding: .utf8)
            try "[127.0.0.1]:\(port) \(hostKey)".write(toFile: directory + "/known_hosts", atomically: true, encoding: .utf8)
            command = "ssh -p \(port) -i \(directory)/client -o StrictHostKeyChecking=yes -o UserKnownHostsFile=\(directory)/known_hosts "
                + "-o LogLevel=ERROR -o BatchMode=yes"
            process.executableURL = URL(fileURLWithPath: "/usr/sbin/sshd")
            process.arguments = ["-D", "-e", "-f", config]
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            // Ready once a login works.
            let deadline = Date().addingTimeInterval(10)
            while (try? BlobWorkloads.shell("\(command) 127.0.0.1 true < /dev/null > /dev/null 2>&1")) == nil {
                guard Date() < deadline, process.isRunning else {
                    stop()
                    throw BenchFailure("sshd did not start")
                }
                usleep(50_000)
            }
        }

        func stop() {
            if process.isRunning { process.terminate() }
            process.waitUntilExit()
        }
    }
}
