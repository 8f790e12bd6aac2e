import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeSync
import BlazeWire
import Foundation
import NIOCore

/// ABUSE: what hostile devices cost a relay and a daemon, and whether members still work meanwhile (issue #49's scale
/// runs). On the relay (`blaze-relay` with its default limits, behind a trusted proxy at 127.0.0.1):
/// - a reader signs `readerOps` membership operations; the admin's revocation of it still reaches a writer;
/// - a capability holder streams snapshot pieces without a manifest over `partConnections` connections;
/// - one client behind the proxy opens `proxyConnections` connections; a member still reconnects and syncs.
/// On a daemon (`AbuseDaemon`): the same reader flood, then `db.revoke`, a join and a write round trip.
/// Each reports the process's resident memory, sampled while the abuse lasts.
enum AbuseWorkloads {
    /// A log made by `admin`, adding each of `members` with its role, and the space key of epoch 1.
    struct Log {
        let space: SpaceID
        let genesis: [UInt8]
        let ops: [MembershipOp]
        var key: SpaceKey { try! SpaceKey(id: space, epoch: 1, secrets: [1: genesis]) }
    }

    static func makeLog(admin: DeviceIdentity, members: [(DeviceIdentity, MemberRole)]) throws -> Log {
        let salt = SpaceKey.randomBytes(16)
        let space = MembershipOp.spaceID(creator: admin.publicKeys, salt: salt)
        let genesis = SpaceKey.randomSecret()
        let create = try MembershipOp(
            space: space, author: admin, timeMs: 1_000, parents: [], action: .create(salt: salt),
            envelopes: [try KeyEnvelope(sealing: genesis, space: space, epoch: 1, keyOp: KeyEnvelope.thisOp, to: admin.publicKeys)])
        var ops = [create]
        for (device, role) in members {
            ops.append(
                try MembershipOp(
                    space: space, author: admin, timeMs: 1_000 + UInt64(ops.count), parents: [ops.last!.hash],
                    action: .add(device: device.publicKeys, role: role),
                    envelopes: [try KeyEnvelope(sealing: genesis, space: space, epoch: 1, keyOp: create.hash, to: device.publicKeys)]))
        }
        return Log(space: space, genesis: genesis, ops: ops)
    }

    /// `count` operations signed by `author` (a reader: every one void), naming `parents`, in `MEMBERS` messages.
    static func flood(space: SpaceID, author: DeviceIdentity, parents: [EntryHash], count: Int) throws -> [PeerMessage] {
        let ops = try (0..<count).map { i in
            try MembershipOp(space: space, author: author, timeMs: 10_000 + UInt64(i), parents: parents, action: .grant)
        }
        return PeerMessage.members(chunking: ops, order: [])
    }

    /// A snapshot piece of about 1 MiB that parses (its bounds) but was sealed by no one.
    static func junkPart(index: UInt32) throws -> PeerMessage {
        var bytes: [UInt8] = []
        bytes.appendBE(index)
        bytes += [UInt8](repeating: 0, count: 32)
        bytes.appendBE(UInt32(1))
        bytes += SpaceKey.randomBytes(12)
        bytes += [UInt8](repeating: 0xA5, count: (1 << 20) + 16)
        return .snapshotPart(try SnapshotPart(bytes: bytes))
    }

    /// Tells the person running the benchmark which phase runs (stderr).
    static func progress(_ line: String) { FileHandle.standardError.write(Data((line + "\n").utf8)) }

    /// Resident memory of process `pid` (VmRSS), or its peak (`VmHWM`), MiB.
    static func memoryMiB(_ pid: Int32, peak: Bool = false) -> Double {
        let field = peak ? "VmHWM:" : "VmRSS:"
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix(field) })
        else { return 0 }
        return (Double(line.split(separator: " ").dropFirst().first ?? "") ?? 0) / 1024
    }

    static func run(dir: String, quick: Bool) async throws -> [Result] {
        let relay = try await relayRuns(
            dir: dir + "/abuse-relay", readerOps: quick ? 1_000 : 10_000, partConnections: quick ? 10 : 100,
            proxyConnections: quick ? 100 : 1_000, partsEach: quick ? 8 : 64)
        let daemon = try await AbuseDaemon.run(dir: dir + "/abuse-daemon", readerOps: quick ? 1_000 : 10_000)
        return relay + daemon
    }

    static func relayRuns(
        dir: String, readerOps: Int, partConnections: Int, proxyConnections: Int, partsEach: Int
    ) async throws -> [Result] {
        let admin = DeviceIdentity(), writer = DeviceIdentity(), reader = DeviceIdentity()
        let log = try makeLog(admin: admin, members: [(writer, .writer), (reader, .reader)])
        let relay = try RelayChild(dataDir: dir, postgres: nil, arguments: ["--trusted-proxy", "127.0.0.1/32"])
        defer { relay.stop() }
        try relay.addSpaces([RelayCapability(key: log.key).text])
        let pid = relay.process.processIdentifier
        let path = WebSocketBytes.defaultPath
        let start = memoryMiB(pid)

        // The admin brings the log; the writer receives it.
        let adminProbe = try ProbeDevice(key: log.key, identity: admin, script: [.members(log.ops), .state(vector: [:], ownHead: nil)])
        let adminChannel = try await adminProbe.connect(port: relay.port, path: path, forwardedFor: "203.0.113.1")
        defer { adminChannel.close(promise: nil) }
        let writerProbe = try ProbeDevice(key: log.key, identity: writer, script: [.state(vector: [:], ownHead: nil)])
        let writerChannel = try await writerProbe.connect(port: relay.port, path: path, forwardedFor: "203.0.113.2")
        try waitFor("the writer getting the log") { writerProbe.state.ops.count == log.ops.count }

        // 1. The reader floods the log; the admin revokes it, and the writer gets the removal.
        progress("ABUSE relay: a reader's flood of \(readerOps) operations")
        let floodMessages = try flood(space: log.space, author: reader, parents: [log.ops.last!.hash], count: readerOps)
        let readerProbe = try ProbeDevice(key: log.key, identity: reader, script: [.state(vector: [:], ownHead: nil)] + floodMessages)
        let readerChannel = try await readerProbe.connect(port: relay.port, path: path, forwardedFor: "203.0.113.3")
        defer { readerChannel.close(promise: nil) }
        let epoch2 = SpaceKey.randomSecret()
        let removal = try MembershipOp(
            space: log.space, author: admin, timeMs: 50_000, parents: [log.ops.last!.hash],
            action: .remove(device: reader.nodeID, cutoff: 0, epoch: 2),
            envelopes: try [admin, writer].map {
                try KeyEnvelope(sealing: epoch2, space: log.space, epoch: 2, keyOp: KeyEnvelope.thisOp, to: $0.publicKeys)
            })
        let revoke = try seconds {
            try adminProbe.send(.members([removal]), on: adminChannel)
            try waitFor("the revocation reaching the writer") { writerProbe.state.ops.contains(removal.hash) }
        }
        let afterFlood = memoryMiB(pid)
        readerChannel.close(promise: nil)

        // 2. Snapshot pieces without a manifest, from a capability holder, over many connections at once.
        progress("ABUSE relay: snapshot pieces without a manifest on \(partConnections) connections")
        let holderKey = try SpaceKey(id: log.space, capability: log.key.capability)
        // One encoded piece, shared by every connection's script.
        let part = try junkPart(index: 0).encoded()
        let state = try PeerMessage.state(vector: [:], ownHead: nil).encoded()
        var partsPeak = afterFlood
        var holders: [(ProbeDevice, any Channel)] = []
        var unanswered = 0
        for i in 0..<partConnections {
            let probe = ProbeDevice(key: holderKey, identity: DeviceIdentity(), encoded: [state] + Array(repeating: part, count: partsEach))
            // A relay busy reading may not accept within the connect timeout: that connection counts as cut off.
            guard let channel = try? await probe.connect(port: relay.port, path: path, forwardedFor: "198.51.100.\(i % 250)") else {
                unanswered += 1
                continue
            }
            holders.append((probe, channel))
            partsPeak = max(partsPeak, memoryMiB(pid))
        }
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline, !holders.allSatisfy({ $0.0.state.closed || $0.0.state.written == partsEach + 1 }) {
            partsPeak = max(partsPeak, memoryMiB(pid))
            usleep(20_000)
        }
        let cutOff = holders.filter { $0.0.state.closed }.count + unanswered
        let sentAll = holders.filter { $0.0.state.written == partsEach + 1 }.count
        for (_, channel) in holders { channel.close(promise: nil) }

        // The admin writes under the new epoch; the writer gets it.
        let newKey = try SpaceKey(id: log.space, epoch: 2, secrets: [1: log.genesis, 2: epoch2])
        let entry = SealedEntry.seal([UInt8](repeating: 0x7B, count: 200), space: newKey, origin: admin.nodeID, seq: 1, prev: SealedEntry.genesis)
        let batch = EntryBatch(origin: NodeID(bytes: admin.nodeID), entries: [entry], head: SignedHead(signing: entry, identity: admin))
        try adminProbe.send(.entries(batch), on: adminChannel)
        try waitFor("the writer getting the admin's entry (admin \(adminProbe.state), writer \(writerProbe.state))") {
            writerProbe.state.entries >= 1
        }
        writerChannel.close(promise: nil)

        // 3. One client behind the proxy opens many connections; the writer reconnects through the proxy and syncs.
        progress("ABUSE relay: \(proxyConnections) connections from one client behind the proxy")
        var crowd: [any Channel] = []
        var crowdProbes: [ProbeDevice] = []
        for _ in 0..<proxyConnections {
            let probe = try ProbeDevice(key: holderKey, identity: DeviceIdentity(), script: [.state(vector: [:], ownHead: nil)])
            if let channel = try? await probe.connect(port: relay.port, path: path, forwardedFor: "198.51.100.7") {
                crowd.append(channel)
                crowdProbes.append(probe)
            }
        }
        defer { for channel in crowd { channel.close(promise: nil) } }
        try waitFor("the crowd's connections being answered", timeout: .seconds(60)) {
            crowdProbes.allSatisfy { $0.state.established || $0.state.closed }
        }
        let held = crowdProbes.filter { $0.state.established && !$0.state.closed }.count
        let crowdMemory = memoryMiB(pid)
        let back = try ProbeDevice(key: newKey, identity: writer, script: [.state(vector: [:], ownHead: nil)])
        var backChannel: (any Channel)?
        let rejoin = try await seconds {
            backChannel = try await back.connect(port: relay.port, path: path, forwardedFor: "203.0.113.2")
            try waitFor("the writer syncing beside the crowd") { back.state.entries >= 1 && back.state.ops.contains(removal.hash) }
        }
        backChannel?.close(promise: nil)
        let peak = memoryMiB(pid, peak: true)
        return [
            Result(
                name: "ABUSE.relay.readerFlood", unit: "MiB", samples: [afterFlood], better: "lower",
                note: String(
                    format: "relay RSS after a reader sent %d operations (%.0f MiB at start); the admin's revocation reached a writer in %.2f s",
                    readerOps, start, revoke)),
            Result(
                name: "ABUSE.relay.partsFlood", unit: "MiB", samples: [partsPeak], better: "lower",
                note: "relay RSS at its highest while a capability holder sent up to \(partsEach) MiB of snapshot pieces without a manifest on each of \(partConnections) connections (\(cutOff) cut off, \(sentAll) sent all); the writer still synced"),
            Result(
                name: "ABUSE.relay.proxyCrowd", unit: "MiB", samples: [crowdMemory], better: "lower",
                note: String(
                    format: "relay RSS with one client behind the proxy trying %d connections (%d held); a member reconnected and synced in %.2f s; relay peak %.0f MiB",
                    proxyConnections, held, rejoin, peak)),
        ]
    }
}
