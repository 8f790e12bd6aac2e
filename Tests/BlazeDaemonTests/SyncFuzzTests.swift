import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Synchronization
import Testing

/// What the sync fuzzer generates from its seed: honest chains that must end up on every replica, hostile changes
/// that are well formed and signed but must be refused, forks, and structural damage to any of these.
struct SyncFuzzer {
    var rng: SeededRandom
    let key: SpaceKey
    /// Honest origins: each sends its whole chain so far in every batch (a batch always links to genesis, so a lost
    /// connection never breaks its chain), and a new origin starts when a chain reaches 20 entries.
    private(set) var honest: [(member: HostileMember, entries: [SealedEntry])] = []
    private(set) var counts: [String: Int] = [:]

    /// Throwaway origins for hostile changes and `STATE` heads (every change they sign is refused, so reusing them
    /// costs nothing and saves generating keys for every message).
    private let throwaway: [HostileMember]

    init(seed: UInt64, key: SpaceKey) {
        rng = SeededRandom(seed: seed)
        self.key = key
        throwaway = (0..<32).map { _ in HostileMember(key: key) }
    }

    /// Ids of every document the honest chains wrote.
    var honestIDs: [String] {
        honest.flatMap { chain in chain.entries.indices.map { "ok-\(chain.member.originHex.prefix(12))-\($0 + 1)" } }
    }

    /// The next messages to send, in order, over one connection: one, or both halves of a fork (which must reach
    /// the same replica: two replicas that each stored one branch of a forked origin can never agree on it).
    mutating func next(over member: HostileMember) -> [[UInt8]] {
        let roll = Int.random(in: 0..<100, using: &rng)
        let (kind, messages): (String, [[UInt8]])
        switch roll {
        case 0..<18: (kind, messages) = ("ping", [[HostileMember.pingType]])
        case 18..<36: (kind, messages) = ("state", [state(over: member)])
        case 36..<46: (kind, messages) = ("honest", [honestBatch()])
        case 46..<79: (kind, messages) = ("hostile", [hostileChange()])
        case 79..<82: (kind, messages) = ("acks", [acknowledgements(over: member)])
        case 82..<85: (kind, messages) = ("snapshot", [snapshotMessage(over: member)])
        case 85..<87: (kind, messages) = ("fork", forkPair())
        default: (kind, messages) = ("damaged", [damage(anyMessage(over: member))])
        }
        counts[kind, default: 0] += messages.count
        return messages
    }

    /// Every honest chain whole, for the final clean delivery.
    func honestBatches() -> [[UInt8]] {
        honest.filter { !$0.entries.isEmpty }.map { $0.member.message(for: $0.entries) }
    }

    private mutating func anyMessage(over member: HostileMember) -> [UInt8] {
        switch Int.random(in: 0..<6, using: &rng) {
        case 0: return state(over: member)
        case 1: return honestBatch()
        case 2: return forkPair()[0]
        case 3: return acknowledgements(over: member)
        case 4: return snapshotMessage(over: member)
        default: return hostileChange()
        }
    }

    /// An `ACKS` message (SYNC.md §11): acknowledgements signed by the connected member or a throwaway one, of this
    /// space or another, naming random origins at any sequence, issued at any time (zero, now, far ahead).
    private mutating func acknowledgements(over member: HostileMember) -> [UInt8] {
        var out: [UInt8] = [7]
        let n = Int.random(in: 0...3, using: &rng)
        out.appendBE(UInt32(n))
        for _ in 0..<n {
            var vector: [[UInt8]: UInt64] = [:]
            for _ in 0..<Int.random(in: 0..<5, using: &rng) {
                let origin = honest.isEmpty || Bool.random(using: &rng)
                    ? (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) }
                    : honest[Int.random(in: 0..<honest.count, using: &rng)].member.origin
                vector[origin] = bigSeq()
            }
            let signer = Bool.random(using: &rng) ? member : throwaway.randomElement(using: &rng)!
            let space = Int.random(in: 0..<5, using: &rng) == 0 ? (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) } : key.id
            let issued: UInt64 = [0, UInt64(HostileMember.clockNow()), UInt64.max / 2, UInt64.random(in: 0...UInt64.max, using: &rng)]
                .randomElement(using: &rng)!
            let ack = Acknowledgement(space: space, vector: vector, issuedMs: issued, identity: signer.identity)
            out.appendBE(UInt32(ack.bytes.count))
            out += ack.bytes
        }
        return out
    }

    /// An unrequested `SNAPSHOT_PART` (sealed with the space's key, or random bytes) or `SNAPSHOT` manifest (signed
    /// by the connected member, naming pieces and heads that were never sent).
    private mutating func snapshotMessage(over member: HostileMember) -> [UInt8] {
        func random(_ n: Int) -> [UInt8] { (0..<n).map { _ in UInt8.random(in: 0...255, using: &rng) } }
        switch Int.random(in: 0..<3, using: &rng) {
        case 0:
            let part = SnapshotPart.seal(
                random(Int.random(in: 0..<512, using: &rng)), index: UInt32.random(in: 0..<3, using: &rng),
                prev: Bool.random(using: &rng) ? [UInt8](repeating: 0, count: 32) : random(32), key: key)
            return [8] + part.bytes
        case 1:
            return [8] + random(Int.random(in: 0..<128, using: &rng))
        default:
            var heads: [[UInt8]: (seq: UInt64, hash: [UInt8])] = [:]
            for _ in 0..<Int.random(in: 0..<4, using: &rng) { heads[random(16)] = (bigSeq(), random(32)) }
            let manifest = SnapshotManifest(
                space: key.id, createdMs: UInt64(HostileMember.clockNow()), parts: UInt32.random(in: 0..<4, using: &rng),
                lastPart: random(32), heads: heads, identity: member.identity)
            return [9] + manifest.bytes
        }
    }

    private mutating func bigSeq() -> UInt64 {
        switch Int.random(in: 0..<4, using: &rng) {
        case 0: return UInt64.random(in: 0..<50, using: &rng)
        case 1: return SyncBounds.maxSeq - UInt64.random(in: 1..<3, using: &rng)
        default: return UInt64.random(in: 0..<SyncBounds.maxSeq, using: &rng)
        }
    }

    /// A `STATE` naming random origins at sequences within the bound (valid), sometimes with an own head of a
    /// throwaway origin (never an honest one: a head signed over another entry would be fork evidence).
    private mutating func state(over member: HostileMember) -> [UInt8] {
        var vector: [(origin: [UInt8], seq: UInt64)] = []
        for _ in 0..<Int.random(in: 0..<6, using: &rng) {
            let origin: [UInt8] =
                honest.isEmpty || Bool.random(using: &rng)
                ? (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) }
                : honest[Int.random(in: 0..<honest.count, using: &rng)].member.origin
            vector.append((origin, bigSeq()))
        }
        let head: [UInt8]? =
            Int.random(in: 0..<5, using: &rng) == 0
            ? throwaway.randomElement(using: &rng)!.head(
                seq: max(1, bigSeq()), hash: (0..<32).map { _ in UInt8.random(in: 0...255, using: &rng) })
            : nil
        return HostileMember.state(vector, ownHead: head)
    }

    private mutating func honestBatch() -> [UInt8] {
        if honest.isEmpty || honest[honest.count - 1].entries.count >= 20 || Int.random(in: 0..<40, using: &rng) == 0 {
            honest.append((HostileMember(key: key), []))
        }
        let i = Int.random(in: 0..<honest.count, using: &rng)
        var chain = honest[i]
        if chain.entries.count < 20 {
            // Each entry is sealed once (a second sealing of the same seq would be a fork) and resent as it is.
            let seq = chain.entries.count + 1
            let id = "ok-\(chain.member.originHex.prefix(12))-\(seq)"
            let change = chain.member.changeText(
                seq: Int64(seq), hlc: HostileMember.clockNow(), deps: seq > 1 ? [chain.member.originHex: Int64(seq - 1)] : [:],
                ops: [HostileMember.docOp("fuzz", id, set: ["seq": .int(Int64(seq)), "by": .string(chain.member.originHex)])])
            chain.entries.append(
                SealedEntry.seal(
                    change, space: key, origin: chain.member.origin, seq: UInt64(seq),
                    prev: chain.entries.last?.hash ?? SealedEntry.genesis))
            honest[i] = chain
        }
        return chain.member.message(for: chain.entries)
    }

    /// One signed, well-formed entry of a throwaway origin whose change breaks a bound; every such change writes a
    /// document whose id starts with `h-`, and none may ever be stored.
    private mutating func hostileChange() -> [UInt8] {
        let m = throwaway.randomElement(using: &rng)!
        let id = "h-\(m.originHex.prefix(12))"
        let now = HostileMember.clockNow()
        func doc(_ collection: String = "fuzz", _ docID: String? = nil, cl: Int64 = 1, set: [String: JSONValue] = ["x": 1],
            incr: [String: JSONValue]? = nil) -> JSONValue
        {
            HostileMember.docOp(collection, docID ?? id, cl: cl, set: set, incr: incr)
        }
        let payload: [UInt8]
        switch Int.random(in: 0..<16, using: &rng) {
        case 0: payload = m.changeText(seq: 1, hlc: -Int64.random(in: 1...Int64.max, using: &rng), ops: [doc()])
        case 1: payload = m.changeText(seq: 1, hlc: now + (Int64.random(in: 700_000...Int64(1) << 40, using: &rng) << 16), ops: [doc()])
        case 2: payload = m.changeText(seq: 1, hlc: now, ops: [doc(cl: [0, 2, -5, Int64.max, (1 << 48) + 1, (1 << 17) + 1][Int.random(in: 0..<6, using: &rng)])])
        case 3:
            payload = m.changeText(
                seq: 1, hlc: now,
                ops: [doc(), .object(["k": "del", "c": "fuzz", "i": .string(id), "l": .int([1, 3, Int64.max, 1 << 50][Int.random(in: 0..<4, using: &rng)])])])
        case 4: payload = m.changeText(seq: 1, hlc: now, ops: [doc(incr: ["n": ["lots", true, .null, ["a": 1], [1]][Int.random(in: 0..<5, using: &rng)]])])
        case 5: payload = m.changeText(seq: 1, hlc: now, ops: [doc(["", "a b", "_sys", String(repeating: "c", count: 300), "x/../y"][Int.random(in: 0..<5, using: &rng)])])
        case 6: payload = m.changeText(seq: 1, hlc: now, ops: [doc("fuzz", "h-" + String(repeating: "i", count: 600))])
        case 7: payload = m.changeText(seq: 1, hlc: now, ops: [doc(set: [["_x", "", "_id"][Int.random(in: 0..<3, using: &rng)]: 1])])
        case 8: payload = m.changeText(seq: 2, hlc: now, ops: [doc()])
        case 9:
            payload = Array(
                (#"{"o":"\#(String(repeating: "ab", count: 16))","s":1,"h":\#(now),"d":{},"x":[\#(doc().jsonText)]}"#).utf8)
        case 10: payload = Array(["not json", "[1,2]", "{}", String(repeating: "[", count: 200), "{\"o\":1}"][Int.random(in: 0..<5, using: &rng)].utf8)
        case 11: payload = m.changeText(seq: 1, hlc: now, deps: [m.originHex: Int64.max], ops: [doc()])
        case 12:
            payload = m.changeText(
                seq: 1, hlc: now, ops: [.object(["k": "index", "n": .string(["", "a b", String(repeating: "n", count: 300)][Int.random(in: 0..<3, using: &rng)]), "c": "fuzz", "f": ["x"]]), doc()])
        case 13: payload = m.changeText(seq: 1, hlc: now, ops: [.object(["k": "nope", "c": "fuzz", "i": .string(id)]), doc()])
        case 14:
            var nested: JSONValue = 1
            for _ in 0..<80 { nested = .array([nested]) }
            payload = m.changeText(seq: 1, hlc: now, ops: [doc(set: ["deep": nested])])
        default: payload = m.changeText(seq: 1, hlc: now, ops: [doc(cl: 1, set: ["n": 1]), .object(["k": "doc", "c": "fuzz", "i": .string(id), "l": "one"])])
        }
        return m.signedRun([payload]).message
    }

    /// A fork: two different seq-1 entries of one throwaway origin, both signed.
    private mutating func forkPair() -> [[UInt8]] {
        let m = HostileMember(key: key)
        return (0..<2).map { _ in
            let change = m.changeText(
                seq: 1, hlc: HostileMember.clockNow(),
                ops: [HostileMember.docOp("forks", "f-\(m.originHex.prefix(12))-\(UInt32.random(in: 0...UInt32.max, using: &rng))")])
            return m.signedRun([change]).message
        }
    }

    /// Flips, truncates, extends or rewrites parts of a message.
    private mutating func damage(_ message: [UInt8]) -> [UInt8] {
        var m = message
        switch Int.random(in: 0..<6, using: &rng) {
        case 0:
            for _ in 0..<Int.random(in: 1...4, using: &rng) where !m.isEmpty {
                m[Int.random(in: 0..<m.count, using: &rng)] ^= UInt8.random(in: 1...255, using: &rng)
            }
        case 1: m = Array(m.prefix(Int.random(in: 0..<max(1, m.count), using: &rng)))
        case 2: m += (0..<Int.random(in: 1...64, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
        case 3: if !m.isEmpty { m[0] = UInt8.random(in: 0...255, using: &rng) }
        case 4:
            // A 4- or 8-byte field somewhere set to an extreme value.
            let width = Bool.random(using: &rng) ? 4 : 8
            if m.count > width {
                let at = Int.random(in: 0...(m.count - width), using: &rng)
                let fill: UInt8 = Bool.random(using: &rng) ? 0xFF : 0x00
                for i in at..<(at + width) { m[i] = fill }
                if fill == 0 { m[at] = 0x80 }
            }
        default:
            // An over-long varint (2^63 or beyond) spliced in.
            let at = Int.random(in: 0...m.count, using: &rng)
            m.insert(contentsOf: [0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01], at: at)
        }
        return m
    }
}

/// Local writers of the sync fuzzer: each writes new documents to one daemon until told to stop, reconnecting while
/// its daemon restarts; what was acknowledged and how many writes went unanswered (the daemon went away first).
final class LocalWriters: Sendable {
    let stopping = Atomic<Bool>(false)
    let acknowledged = Mutex<[String]>([])
    let unanswered = Atomic<Int>(0)
    let group = DispatchGroup()

    /// Starts one writer per socket; each tags its ids with the matching tag and writes at most 1,000 documents.
    init(sockets: [(socket: String, tag: String)]) {
        for (socket, tag) in sockets {
            group.enter()
            Thread { [self] in
                defer { group.leave() }
                var client: BlazeConnection?
                var i = 0
                while !stopping.load(ordering: .relaxed) && i < 1_000 {
                    guard let c = client ?? (try? BlazeConnection(socketPath: socket, timeoutSeconds: 60)) else {
                        usleep(50_000)  // the daemon is restarting: try again in a moment
                        continue
                    }
                    client = c
                    let id = "\(tag)\(i)"
                    i += 1
                    do {
                        _ = try c.call("doc.put", ["db": "team", "collection": "local", "id": .string(id), "doc": ["i": .int(Int64(i))]])
                        acknowledged.withLock { $0.append(id) }
                    } catch {
                        unanswered.add(1, ordering: .relaxed)
                        client = nil
                    }
                }
            }.start()
        }
    }

    /// Stops the writers and waits (bounded) for them.
    func stop() -> Bool {
        stopping.store(true, ordering: .relaxed)
        return group.wait(timeout: .now() + 120) == .success
    }
}

@Suite(.serialized) struct SyncFuzzTests {
    /// The seeded sync fuzzer: up to 100,000 messages (`BLAZE_FUZZ_MESSAGES`) within `BLAZE_FUZZ_SECONDS` (240) from
    /// members holding the key, against two live daemons while local clients write. B dials A and A dials nobody (a
    /// one-way link); a third of the way through B is killed (kill -9) and restarted, two thirds of the way A is
    /// restarted (SIGTERM), each on the same port. Afterwards both are up, serve local clients, hold every honest
    /// change and none of the refused ones, and a clean replica that joins converges with them.
    @Test func seededSyncFuzzerLeavesDaemonsUpAndConverged() throws {
        let seed = testSeed("sync fuzzer")
        let environment = ProcessInfo.processInfo.environment
        let total = Int(environment["BLAZE_FUZZ_MESSAGES"] ?? "") ?? 100_000
        let budget = Double(environment["BLAZE_FUZZ_SECONDS"] ?? "") ?? 240
        print("sync fuzzer seed \(seed), \(total) messages within \(Int(budget)) s (replay with BLAZE_SEED=\(seed))")
        let a = try SyncTarget()
        let b = try RestartingDaemon()
        // The target's space is a legacy one: any holder of its key (the fuzzer) is a member.
        _ = try b.connect().call("db.join", ["token": .string(a.key.token!), "db": "team"])
        _ = try b.connect().call("peer.add", ["db": "team", "address": .string(a.node.address)])
        let ports = [a.port, b.port]

        // Local clients write on both daemons throughout.
        let writers = LocalWriters(sockets: [(a.node.socket, "a"), (b.socket, "b")])

        var fuzzer = SyncFuzzer(seed: seed, key: a.key)
        var sent = 0, connections = 0
        var members: [HostileMember?] = [nil, nil]
        var refusedInARow = 0
        let started = Date()
        var generation = 0.0
        var restarts = 0
        // Rejections A counted before its restart (its counters start again from zero).
        var rejectedBefore: [String: Int64] = [:]
        while sent < total && Date().timeIntervalSince(started) < budget {
            let progress = max(Double(sent) / Double(total), Date().timeIntervalSince(started) / budget)
            if restarts == 0 && progress >= 1.0 / 3 {
                try b.restart(kill9: true)
                members[1]?.close()
                members[1] = nil
                restarts = 1
            } else if restarts == 1 && progress >= 2.0 / 3 {
                rejectedBefore = try a.rejected()
                try a.restart(kill9: false)
                members[0]?.close()
                members[0] = nil
                restarts = 2
            }
            let target = sent % 2
            if members[target] == nil {
                let m = HostileMember(key: a.key)
                do {
                    try m.connect(port: ports[target])
                    // Claim to hold what the daemon holds (its first STATE), so that it does not send its whole log
                    // to every fuzzing connection; what it commits later is still pushed and drained.
                    let vector = try m.receive().flatMap(HostileMember.vector(ofState:)) ?? []
                    try m.send(HostileMember.state(vector))
                } catch {
                    // Refused or closed before it began (the per-address handshake rate after many refusals): a
                    // bounded number of times in a row, with a short pause, then the test fails.
                    m.close()
                    refusedInARow += 1
                    try #require(refusedInARow < 200, "the daemon refused 200 connections in a row: \(error)")
                    usleep(20_000)
                    continue
                }
                refusedInARow = 0
                m.startDraining()
                members[target] = m
                connections += 1
            }
            let generating = Date()
            let messages = fuzzer.next(over: members[target]!)
            generation += Date().timeIntervalSince(generating)
            do {
                for message in messages {
                    try members[target]!.send(message)
                    sent += 1
                }
            } catch {
                // The daemon closed the connection (it refused something): reconnect and go on.
                members[target]!.close()
                members[target] = nil
            }
        }
        for m in members { m?.close() }
        let seconds = Date().timeIntervalSince(started)
        print(
            "sync fuzzer: \(sent) messages over \(connections) connections in \(Int(seconds)) s "
                + "(\(Int(generation)) s generating them), \(restarts) restarts; "
                + "\(fuzzer.counts.sorted { $0.key < $1.key })")
        #expect(restarts == 2, "both daemons were restarted")

        // Both daemons are up and serve local clients.
        try a.expectServing()
        #expect(b.isRunning)
        #expect(writers.stop())

        // Every honest chain, delivered whole over a clean connection to each daemon, is stored everywhere. The
        // connections stay open until the end: closing a socket with unread data resets it, and the daemon's
        // kernel would drop what it had not read yet. A daemon may still close a delivery connection (its handshake
        // rate after the fuzzer's many refused connections, a batch it is still applying when its timeout strikes):
        // that is an expected outcome of fuzzing, so the delivery starts over on a new connection, a bounded number
        // of times.
        var deliveries: [HostileMember] = []
        defer { for m in deliveries { m.close() } }
        for port in ports {
            var attempt = 0
            while true {
                attempt += 1
                let m = HostileMember(key: a.key)
                do {
                    try m.connect(port: port)
                    m.startDraining()
                    for batch in fuzzer.honestBatches() { try m.send(batch) }
                    deliveries.append(m)
                    break
                } catch {
                    m.close()
                    try #require(attempt < 50, "the honest chains could not be delivered to port \(port): \(error)")
                    usleep(100_000)
                }
            }
        }
        let honestIDs = fuzzer.honestIDs
        let localIDs = writers.acknowledged.withLock { $0 }
        let unanswered = writers.unanswered.load(ordering: .relaxed)
        let cc = try syncDaemon()
        let clean = try cc.connect()
        _ = try clean.call("db.join", ["token": .string(a.key.token!), "db": "team"])
        _ = try clean.call("peer.add", ["db": "team", "address": .string(a.node.address)])
        let replicas = [a.client, try b.connect(), clean]
        let converged = try eventually(timeout: .seconds(120)) {
            let states = try replicas.map { try replicaState($0, "team") }
            let fuzzCount = try a.client.call("query.count", ["db": "team", "collection": "fuzz"])["count"]?.intValue
            return Set(states.map(\.hash)).count == 1 && fuzzCount == Int64(honestIDs.count)
        }
        let final = try replicas.map { try replicaState($0, "team") }
        let cleanSync = try clean.call("sync.status", ["db": "team"]).jsonText
        #expect(converged, "replicas: \(final); clean replica's sync: \(cleanSync)")
        for c in replicas {
            // Not one refused change was stored: the fuzz collection holds the honest documents and nothing else.
            let count = { (filter: JSONValue) in try c.call("query.count", ["db": "team", "collection": "fuzz", "where": filter]) }
            #expect(try count([:])["count"]?.intValue == Int64(honestIDs.count))
            #expect(try count(["_id": ["$prefix": "ok-"]])["count"]?.intValue == Int64(honestIDs.count))
            for page in stride(from: 0, to: honestIDs.count, by: 5_000) {
                let ids = honestIDs[page..<min(honestIDs.count, page + 5_000)]
                let found = try c.call(
                    "doc.getMany", ["db": "team", "collection": "fuzz", "ids": .array(ids.map(JSONValue.string))])["docs"]?.arrayValue ?? []
                #expect(found.count == ids.count && found.allSatisfy { $0 != .null }, "honest documents missing")
            }
            // Every acknowledged local write is there; a write left unanswered by a restart may or may not be.
            let local = try c.call("query.count", ["db": "team", "collection": "local"])["count"]?.intValue ?? -1
            #expect(local >= Int64(localIDs.count) && local <= Int64(localIDs.count + unanswered), "\(local) local documents")
            let found = try c.call(
                "doc.getMany", ["db": "team", "collection": "local", "ids": .array(localIDs.map(JSONValue.string))])["docs"]?.arrayValue ?? []
            #expect(found.count == localIDs.count && found.allSatisfy { $0 != .null }, "acknowledged local writes missing")
        }
        let rejected = try a.rejected().merging(rejectedBefore, uniquingKeysWith: +)
        print("sync fuzzer: rejections on A \(rejected.sorted { $0.key < $1.key })")
        for reason in ["malformed", "invalid_change", "clock_ahead", "bad_payload", "fork"] {
            #expect(rejected[reason, default: 0] > 0, "no \(reason) rejection: \(rejected)")
        }
        a.daemon.stop()
        b.stop(kill9: false)
        cc.stop()
    }
}
