import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// BLOB memory (B8): a large file moved between two `blazed` processes over each transport (a peer link, a relay
/// with SQLite and with PostgreSQL, a shared folder), with each daemon's peak resident memory above its idle memory
/// while it puts, serves and fetches the file. The target: a fixed budget, whatever the file's size.
enum BlobMemoryWorkloads {
    /// The transports, by row name.
    enum Transport: String, CaseIterable {
        case peer, relaySQLite, relayPostgres, folder
    }

    /// Runs every transport on a file of `megabytes` MiB (the PostgreSQL relay only when its server binaries are
    /// installed).
    static func run(dir: String, megabytes: Int) throws -> [Result] {
        let work = dir + "/blob-memory"
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: work) }
        let source = work + "/source"
        try BlobWorkloads.writeRandomFile(source, bytes: megabytes << 20)
        var rows: [Result] = []
        for transport in Transport.allCases {
            let postgres: PostgresServer?
            if transport == .relayPostgres {
                guard let server = try? PostgresServer() else { continue }
                postgres = server
            } else {
                postgres = nil
            }
            defer { postgres?.stop() }
            do {
                rows += try measure(transport, source: source, megabytes: megabytes, dir: work + "/\(transport.rawValue)", postgres: postgres)
            } catch {
                throw BenchFailure("B8.\(transport.rawValue): \(error)")
            }
        }
        return rows
    }

    /// One transport: A puts the file; B fetches it (`blob.get`) through the transport, A stopped first unless it
    /// is the peer B fetches from.
    static func measure(_ transport: Transport, source: String, megabytes: Int, dir: String, postgres: PostgresServer?) throws
        -> [Result]
    {
        let a = try DaemonChild(dir: dir + "/a"), b = try DaemonChild(dir: dir + "/b")
        var relay: RelayChild?
        defer {
            a.stop()
            b.stop()
            relay?.stop()
        }
        let db: JSONValue = "m"
        _ = try a.c.call("db.create", ["db": db])
        _ = try a.c.call("db.share", ["db": db])
        let token = try require(try a.c.call("db.invite", ["db": db, "role": "writer"])["token"], "an invite")
        _ = try b.c.call("db.join", ["token": token, "db": db])
        // Through a relay or a folder the two never meet: B forgets A's address.
        var via = try require(a.listen, "A's address")
        var relayIdle = 0.0
        switch transport {
        case .peer: break
        case .relaySQLite, .relayPostgres:
            let r = try RelayChild(dataDir: dir + "/relay", postgres: postgres?.url)
            relay = r
            relayIdle = AbuseWorkloads.memoryMiB(r.process.processIdentifier)
            try r.addSpaces([try require(try a.c.call("db.relayCapability", ["db": db])["capability"]?.stringValue, "a capability")])
            _ = try b.c.call("peer.remove", ["db": db, "address": .string(via)])
            via = "ws://127.0.0.1:\(r.port)/v1/sync"
            _ = try a.c.call("peer.add", ["db": db, "address": .string(via)])
        case .folder:
            let folder = dir + "/folder"
            try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
            _ = try b.c.call("peer.remove", ["db": db, "address": .string(via)])
            via = "folder:" + folder
            _ = try a.c.call("folder.add", ["db": db, "path": .string(folder)])
        }

        // The put, on A.
        a.resetPeak()
        let putIdle = a.residentMiB()
        let put = try a.c.call("blob.put", ["db": db, "path": .string(source)])
        let putPeak = a.peakMiB() - putIdle
        let chunks = try require(put["chunks"]?.intValue, "a chunk count")
        let blob = try require(put["blob"]?["id"], "a blob id")
        _ = try a.c.call("doc.put", ["db": db, "collection": "files", "id": "f", "doc": ["file": try require(put["ref"], "a ref")]])
        if transport != .peer {
            // A leaves every chunk and the manifest there, then stops: B can only fetch from the relay or folder.
            try waitFor("B8.\(transport.rawValue): A's upload", timeout: .seconds(900)) {
                // What the relay stored (a chunk A sent may still be on its way to the relay's store).
                if let relay { return (relay.metric("blaze_relay_chunks_stored_total") ?? 0) >= Double(chunks + 1) }
                return try chunksSent(a.c) >= chunks + 1
            }
            a.stop()
            if case .folder = transport {
                _ = try b.c.call("folder.add", ["db": db, "path": .string(String(via.dropFirst("folder:".count)))])
            } else {
                _ = try b.c.call("peer.add", ["db": db, "address": .string(via)])
            }
        }
        try waitFor("B8.\(transport.rawValue): the document on B") {
            (try? b.c.call("doc.get", ["db": db, "collection": "files", "id": "f"]))?["doc"] != nil
        }

        // The fetch, on B (and the serving, on A when it is the peer).
        a.resetPeak()
        b.resetPeak()
        let (serveIdle, fetchIdle) = (a.residentMiB(), b.residentMiB())
        let out = dir + "/out"
        let time = try seconds { _ = try b.c.call("blob.get", ["db": db, "blob": blob, "path": .string(out)]) }
        let fetchPeak = b.peakMiB() - fetchIdle
        let servePeak = transport == .peer ? a.peakMiB() - serveIdle : nil
        guard FileManager.default.contentsEqual(atPath: out, andPath: source) else {
            throw BenchFailure("B8.\(transport.rawValue): the fetched blob differs")
        }
        unlink(out)
        let peaks = [putPeak, fetchPeak] + (servePeak.map { [$0] } ?? [])
        let note =
            "\(megabytes) MiB in \(chunks) chunks, two blazed processes: peak RSS above idle "
            + String(format: "%.0f MiB for A's put, %.0f MiB for B's fetch", putPeak, fetchPeak)
            + (servePeak.map { String(format: ", %.0f MiB for A serving it", $0) } ?? "")
            + (relay.map { String(format: "; the relay's peak %.0f MiB above its idle %.0f", AbuseWorkloads.memoryMiB($0.process.processIdentifier, peak: true) - relayIdle, relayIdle) } ?? "")
            + String(format: "; fetched at %.0f MiB/s", Double(megabytes) / time)
        return [
            Result(
                name: "B8.\(transport.rawValue)", unit: "MiB", samples: [peaks.max() ?? 0], better: "lower",
                target: "≤ 64 MiB above idle", note: note)
        ]
    }

    /// Chunks `c` has sent over all its links (A's one link: the folder; a chunk is counted once written there).
    static func chunksSent(_ c: BlazeConnection) throws -> Int64 {
        let peers = try c.call("sync.status", ["db": "m"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
        return peers.compactMap { $0["chunksSent"]?.intValue }.reduce(0, +)
    }

    /// `blazed` in a child process of its own, listening for peers on loopback.
    final class DaemonChild {
        let process = Process()
        let c: BlazeConnection
        /// Its sync address, `127.0.0.1:port`.
        let listen: String?

        init(dir: String) throws {
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            process.executableURL = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
                .appendingPathComponent("blazed")
            let socket = dir + "/blazed.sock"
            process.arguments = ["--socket", socket, "--data-dir", dir + "/data", "--sync-listen", "127.0.0.1:0", "--log-level", "error"]
            process.environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("BLAZEDB_") }
                .merging(["XDG_CONFIG_HOME": dir + "/config"]) { $1 }
            try process.run()
            var connection: BlazeConnection?
            let child = process
            try waitFor("blazed starting") {
                guard child.isRunning else { throw BenchFailure("B8: blazed exited") }
                connection = try? BlazeConnection(socketPath: socket, timeoutSeconds: 900)
                return connection != nil
            }
            c = try require(connection)
            var address: String?
            let client = c
            try waitFor("blazed listening for peers") {
                address = try client.call("sync.status")["listen"]?.stringValue
                return address != nil
            }
            listen = address
        }

        /// Starts its peak (VmHWM) again from its resident memory now.
        func resetPeak() {
            try? "5".write(toFile: "/proc/\(process.processIdentifier)/clear_refs", atomically: false, encoding: .utf8)
        }

        func residentMiB() -> Double { AbuseWorkloads.memoryMiB(process.processIdentifier) }
        func peakMiB() -> Double { AbuseWorkloads.memoryMiB(process.processIdentifier, peak: true) }

        func stop() {
            guard process.isRunning else { return }
            process.terminate()
            process.waitUntilExit()
        }
    }
}
