import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Synchronization
import Testing

/// What one writer of the chaos test got acknowledged, and how many of its writes ended without an answer.
struct WriterTally: Sendable {
    var acknowledged: [String] = []
    /// Writes whose connection ended before the reply (the daemon was killed or stopped): each may or may not have
    /// committed.
    var unanswered = 0
}

/// The writers of the chaos test: when to stop, and each one's tally.
final class ChaosWriters: Sendable {
    let stopping = Atomic<Bool>(false)
    let tallies: Mutex<[WriterTally]>

    init(count: Int) { tallies = Mutex(Array(repeating: WriterTally(), count: count)) }
}

/// Writer `index` of `writers`: increments a shared counter on the daemon at `socket` until told to stop, each
/// increment in one transaction with a document named after it, reconnecting whenever the daemon goes away. The pauses
/// pace the writes; nothing waits on them.
func chaosWriter(socket: String, index: Int, writers: ChaosWriters) {
    let tag = "\(index)"
    var client: BlazeConnection?
    var i = 0
    while !writers.stopping.load(ordering: .relaxed) {
        guard let c = client ?? (try? BlazeConnection(socketPath: socket, timeoutSeconds: 20)) else {
            usleep(50_000)
            continue
        }
        client = c
        i += 1
        let id = "inc-\(tag)-\(i)"
        do {
            _ = try c.call(
                "tx.commit",
                [
                    "db": "ring",
                    "ops": [
                        ["op": "patch", "collection": "k", "id": "counter", "incr": ["n": 1]],
                        ["op": "put", "collection": "inc", "id": .string(id), "doc": ["by": .string(tag)]],
                    ],
                ])
            writers.tallies.withLock { $0[index].acknowledged.append(id) }
        } catch let error as RPCError where error.kind == "shutting_down" {
            client = nil  // refused, not applied: the daemon is stopping
        } catch let error as RPCError {
            Issue.record("writer \(tag): \(error)")
            return
        } catch {
            writers.tallies.withLock { $0[index].unanswered += 1 }
            client = nil
        }
        usleep(10_000)
    }
}

/// Sync under chaos with real processes: links that go only one way, daemons killed and restarted, paths cut and
/// stalled.
@Suite(.serialized) struct RingChaosTests {
    /// Three daemons, each dialing only the next around a ring (0 → 1 → 2 → 0) through a proxy standing for the
    /// network path, while writers on all three increment one counter. For `BLAZE_CHAOS_SECONDS` (40) a seeded
    /// schedule kill -9s daemons (restarted a moment later), restarts them with SIGTERM, and cuts and stalls paths.
    /// Then everything heals: all three converge, and the counter equals the number of committed increments, which is
    /// every acknowledged one plus at most the unanswered ones.
    @Test func threeDaemonsLinkedOneWayAroundARingConvergeAfterKillsRestartsPartitionsAndStalls() throws {
        let seed = testSeed("ring chaos")
        var rng = SeededRandom(seed: seed)
        let chaos = Double(ProcessInfo.processInfo.environment["BLAZE_CHAOS_SECONDS"] ?? "") ?? 40
        // Short timeouts, so that a stalled path is given up on (and redialed) within seconds.
        let nodes = try (0..<3).map { _ in try RestartingDaemon(arguments: ["--sync-timeout", "3", "--sync-handshake-timeout", "2"]) }
        let c0 = try nodes[0].connect()
        _ = try c0.call("db.create", ["db": "ring"])
        _ = try c0.call("doc.put", ["db": "ring", "collection": "k", "id": "counter", "doc": ["n": 0]])
        for node in nodes.dropFirst() {
            let c = try node.connect()
            _ = try c.call("db.join", ["token": .string(try c0.invite("ring")), "db": "ring"])
            _ = try c.call("peer.remove", ["db": "ring", "address": .string(nodes[0].address)])
        }
        // Proxy i stands for the path to daemon i; daemon i dials only daemon i+1.
        let proxies = try nodes.map { try LinkProxy(targetPort: $0.port) }
        defer { for p in proxies { p.shutdown() } }
        for i in 0..<3 {
            _ = try nodes[i].connect().call("peer.add", ["db": "ring", "address": .string("127.0.0.1:\(proxies[(i + 1) % 3].port)")])
        }
        #expect(try eventually {
            let counts = try nodes.map { try $0.connect().call("query.count", ["db": "ring", "collection": "k"])["count"] }
            return counts.allSatisfy { $0 == 1 }
        }, "the ring carries the first write everywhere")

        let writers = ChaosWriters(count: 3)
        let running = DispatchGroup()
        for i in 0..<3 {
            running.enter()
            let socket = nodes[i].socket
            Thread {
                defer { running.leave() }
                chaosWriter(socket: socket, index: i, writers: writers)
            }.start()
        }

        // The schedule: every 0.2–1.5 s one event; a killed daemon comes back and a cut or stalled path opens again
        // after 0.2–5 s.
        var log: [String] = []
        var restartAt: [Int: ContinuousClock.Instant] = [:]
        var openAt: [Int: ContinuousClock.Instant] = [:]
        let started = ContinuousClock.now
        let end = started + .milliseconds(Int64(chaos * 1000))
        func stamp() -> String { String(format: "%5.1f", Double((ContinuousClock.now - started).components.seconds)) }
        while ContinuousClock.now < end {
            let now = ContinuousClock.now
            for (i, due) in restartAt where due <= now {
                try nodes[i].start()
                restartAt[i] = nil
                log.append("\(stamp()) start \(i)")
            }
            for (p, due) in openAt where due <= now {
                try proxies[p].set(.open)
                openAt[p] = nil
                log.append("\(stamp()) open path to \(p)")
            }
            let target = Int(rng.next() % 3)
            let later = now + .milliseconds(Int64(200 + rng.next() % 4_800))
            switch rng.next() % 5 {
            case 0 where nodes[target].isRunning:
                nodes[target].stop(kill9: true)
                restartAt[target] = later
                log.append("\(stamp()) kill -9 \(target)")
            case 1 where nodes[target].isRunning:
                try nodes[target].restart(kill9: false)
                log.append("\(stamp()) SIGTERM and restart \(target)")
            case 2 where proxies[target].mode == .open:
                try proxies[target].set(.partitioned)
                openAt[target] = later
                log.append("\(stamp()) cut path to \(target)")
            case 3 where proxies[target].mode == .open:
                try proxies[target].set(.stalled)
                openAt[target] = later
                log.append("\(stamp()) stall path to \(target)")
            default:
                break
            }
            usleep(UInt32(200_000 + rng.next() % 1_300_000))
        }
        writers.stopping.store(true, ordering: .relaxed)
        #expect(running.wait(timeout: .now() + 120) == .success)

        // Heal: every path open, every daemon running.
        for p in proxies { try p.set(.open) }
        for node in nodes where !node.isRunning { try node.start() }
        log.append("\(stamp()) healed")
        let healed = ContinuousClock.now
        let clients = try nodes.map { try $0.connect() }
        let committed = { (c: BlazeConnection) in try c.call("query.count", ["db": "ring", "collection": "inc"])["count"]?.intValue ?? -1 }
        let counter = { (c: BlazeConnection) in try c.call("doc.get", ["db": "ring", "collection": "k", "id": "counter"])["doc"]?["n"]?.intValue ?? -1 }
        var last = ""
        let converged = try eventually(timeout: .seconds(120), interval: .milliseconds(50)) {
            let states = try clients.map { try replicaState($0, "ring") }
            let counts = try clients.map(committed), counters = try clients.map(counter)
            last = "states \(states), committed \(counts), counters \(counters)"
            return Set(states.map(\.hash)).count == 1 && Set(counts).count == 1 && counters == counts
        }
        let seconds = Double((ContinuousClock.now - healed).components.attoseconds) / 1e18 + Double((ContinuousClock.now - healed).components.seconds)
        let tallies = writers.tallies.withLock { $0 }
        let acknowledged = tallies.flatMap(\.acknowledged)
        let unanswered = tallies.map(\.unanswered).reduce(0, +)
        print(
            "ring chaos: \(log.count) events, \(acknowledged.count) increments acknowledged, \(unanswered) unanswered; "
                + "converged \(converged) in \(String(format: "%.2f", seconds)) s after healing")
        #expect(converged, "seed \(seed): \(last)\n\(log.joined(separator: "\n"))")
        guard converged else { return }
        // The counter is exactly the committed increments: every acknowledged one, and at most the unanswered ones.
        let total = try committed(clients[0])
        #expect(total >= Int64(acknowledged.count) && total <= Int64(acknowledged.count + unanswered), "\(total) committed")
        for c in clients {
            for page in stride(from: 0, to: acknowledged.count, by: 2_000) {
                let ids = acknowledged[page..<min(acknowledged.count, page + 2_000)]
                let found = try c.call("doc.getMany", ["db": "ring", "collection": "inc", "ids": .array(ids.map(JSONValue.string))])["docs"]?
                    .arrayValue ?? []
                #expect(found.count == ids.count && found.allSatisfy { $0 != .null }, "an acknowledged increment is missing")
            }
        }
        for node in nodes { node.stop(kill9: false) }
    }
}
