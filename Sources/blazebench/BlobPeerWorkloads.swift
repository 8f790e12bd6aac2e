import BlazeClient
import BlazeProtocol
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// BLOB, between devices: a file put on one daemon and fetched by another over a loopback peer link (`blob.get`),
/// against `rsync` of the same file to an rsync daemon on loopback (with `--fsync`, as every fetched chunk is synced),
/// in the same run.
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
        var fetch: [Double] = [], rsync: [Double] = []
        var chunks = 0
        let rsyncd = try? RsyncDaemon(directory: work + "/rsync")
        defer { rsyncd?.stop() }
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
            if r % 2 == 1 { try copyByRsync() }
            fetch.append(mib / (try seconds { _ = try cb.call("blob.get", ["db": .string(name), "blob": put["blob"]!["id"]!, "path": .string(out)]) }))
            guard FileManager.default.contentsEqual(atPath: out, andPath: source) else { throw BenchFailure("BLOB.peer: the fetched blob differs") }
            unlink(out)
            if r % 2 == 0 { try copyByRsync() }
        }
        var rows = [
            Result(
                name: "B4.peerFetch", unit: "MiB/s", samples: fetch, better: "higher",
                baseline: rsyncd == nil ? nil : "B4.rsync", target: "≥ 0.8× rsync",
                note: "\(megabytes) MiB in \(chunks) chunks put on A, fetched by B over a loopback peer link (blob.get: sealed, opened, checked, each chunk synced)"),
        ]
        if !rsync.isEmpty {
            rows.insert(Result(name: "B4.rsync", unit: "MiB/s", samples: rsync, better: "higher", note: "rsync --fsync of the same file to an rsync daemon on loopback"), at: 0)
            rows[1].paired["B4.rsync"] = zip(fetch, rsync).map { $0 / $1 }
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
