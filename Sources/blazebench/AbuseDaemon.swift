import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeWire
import Foundation

/// ABUSE on a daemon: `blazed` alone in a child process, sharing a database; a reader joins with an invite and signs
/// `readerOps` membership operations; then the admin revokes it, a writer joins and gets a write. Reports the daemon's
/// resident memory after the flood and the time each member action took.
enum AbuseDaemon {
    static func run(dir: String, readerOps: Int) async throws -> [Result] {
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let child = Process()
        child.executableURL = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("blazed")
        let socket = dir + "/blazed.sock"
        child.arguments = ["--socket", socket, "--data-dir", dir + "/data", "--sync-listen", "127.0.0.1:0", "--log-level", "error"]
        try child.run()
        defer {
            child.terminate()
            child.waitUntilExit()
        }
        var connection: BlazeConnection?
        try waitFor("blazed starting") {
            guard child.isRunning else { throw BenchFailure("ABUSE: blazed exited") }
            connection = try? BlazeConnection(socketPath: socket, timeoutSeconds: 120)
            return connection != nil
        }
        let c = connection!
        let pid = child.processIdentifier
        _ = try c.call(RPC.DbCreate(db: "abuse"))
        _ = try c.call(RPC.DbShare(db: "abuse"))
        guard let listen = try c.call(RPC.SyncStatus()).listen, let port = Int(listen.split(separator: ":").last ?? "") else {
            throw BenchFailure("ABUSE: blazed accepts no peers")
        }
        let start = AbuseWorkloads.memoryMiB(pid)

        // The reader joins, then floods.
        let (reader, readerProbe) = try await joiner(c, role: "reader", port: port)
        let log = readerProbe.state.log
        let space = try requireBench(log.first?.space, "the reader got no log")
        let heads = MembershipState(space: space, ops: log).heads
        let flood = try AbuseWorkloads.flood(space: space, author: reader, parents: heads, count: readerOps)
        let channel = try requireBench(readerProbe.channel, "the reader's connection")
        let floodTime = try seconds {
            for message in flood { try readerProbe.send(message, on: channel) }
            try waitFor("the flood being written", timeout: .seconds(300)) { readerProbe.state.written >= flood.count }
        }
        let afterFlood = AbuseWorkloads.memoryMiB(pid)

        // The admin revokes the reader, a writer joins, and a write reaches it.
        let revoke = try seconds { _ = try c.call(RPC.DbRevoke(db: "abuse", device: hexString(reader.nodeID))) }
        var writerProbe: ProbeDevice?
        let join = try await seconds { writerProbe = try await joiner(c, role: "writer", port: port).1 }
        let write = try seconds {
            _ = try c.call(RPC.DocPut(db: "abuse", collection: "c", doc: ["v": 1], id: "after-flood"))
            try waitFor("the write reaching the writer") { (writerProbe?.state.entries ?? 0) >= 1 }
        }
        writerProbe?.channel?.close(promise: nil)
        readerProbe.channel?.close(promise: nil)
        return [
            Result(
                name: "ABUSE.daemon.readerFlood", unit: "MiB", samples: [afterFlood], better: "lower",
                note: String(
                    format: "blazed RSS after a reader sent %d operations in %.2f s (%.0f MiB at start, peak %.0f); then db.revoke took %.3f s, a join %.2f s, a write reached the new member in %.2f s",
                    readerOps, floodTime, start, AbuseWorkloads.memoryMiB(pid, peak: true), revoke, join, write)),
        ]
    }

    /// A device that joins `abuse` on the daemon with a fresh invite for `role`, over a connection it keeps; returns
    /// once the log lists it.
    static func joiner(_ c: BlazeConnection, role: String, port: Int) async throws -> (DeviceIdentity, ProbeDevice) {
        let invite = try InviteToken(text: try c.call(RPC.DbInvite(db: "abuse", role: role)).token)
        let identity = DeviceIdentity()
        let probe = try ProbeDevice(
            key: try SpaceKey(id: invite.space, capability: invite.capability), identity: identity,
            script: [.join(id: invite.id, device: identity.publicKeys, proof: invite.joinProof(device: identity.publicKeys))])
        probe.channel = try await probe.connect(port: port)
        try waitFor("the \(role) being admitted") {
            let log = probe.state.log
            return log.first.map { MembershipState(space: $0.space, ops: log).member(identity.nodeID) != nil } ?? false
        }
        // Now a member: it asks for what it lacks, as a device does once admitted.
        try probe.send(.state(vector: [:], ownHead: nil), on: try requireBench(probe.channel, "the connection"))
        return (identity, probe)
    }
}

/// `value`, or a benchmark failure naming `what`.
func requireBench<T>(_ value: T?, _ what: String) throws -> T {
    guard let value else { throw BenchFailure("ABUSE: \(what)") }
    return value
}
