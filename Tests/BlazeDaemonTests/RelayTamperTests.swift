import BlazeClient
import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeSync
import BlazeTestSupport
import BlazeWire
import Foundation
import Logging
import NIOCore
import NIOPosix
import Synchronization
import Testing

@testable import BlazeRelay

/// A relay in this process whose outgoing batches a test rewrites (`RelayServer.tamper`), for real daemons.
final class TamperingRelay: @unchecked Sendable {
    // @unchecked: the server is Sendable; `dir` is only touched by the owning test.
    let dir = TempDir()
    let server: RelayServer
    let address: String

    init() async throws {
        var logger = Logger(label: "tampering-relay")
        logger.logLevel = .critical
        server = RelayServer(
            store: try RelayStore(path: dir.path + "/relay.db"), identity: DeviceIdentity(),
            group: MultiThreadedEventLoopGroup.singleton, logger: logger)
        address = "ws://127.0.0.1:\(try await server.listen(host: "127.0.0.1", port: 0))/v1/sync"
    }

    /// From now on, every batch the relay sends goes through `rewrite` (nil: sent as stored).
    func tamper(_ rewrite: (@Sendable (EntryBatch) -> [EntryBatch])?) { server.tamper.withLock { $0 = rewrite } }

    func stop() async { await server.shutdown() }
}

/// What a relay may do to the batches it sends, short of forging one (it cannot sign).
enum Tampering: String, CaseIterable, CustomStringConvertible, Sendable {
    /// A byte of the first entry's ciphertext flipped.
    case flip
    /// The first entry of each batch left out.
    case drop
    /// Each batch held back and sent after the next one.
    case reorder
    /// Each batch sent twice.
    case replay

    var description: String { rawValue }

    /// The rewrite, with whatever state it keeps (one relay, all its connections).
    func rewrite() -> @Sendable (EntryBatch) -> [EntryBatch] {
        switch self {
        case .flip:
            return { batch in
                var bytes = batch.entries[0].bytes
                bytes[bytes.count - 20] ^= 0x01
                var altered = batch
                altered.entries[0] = try! SealedEntry(stored: bytes, hash: batch.entries[0].hash)
                return [altered]
            }
        case .drop:
            return { batch in
                guard batch.entries.count > 1 else { return [] }
                return [EntryBatch(origin: batch.origin, entries: Array(batch.entries.dropFirst()), head: batch.head)]
            }
        case .reorder:
            let held = Mutex<EntryBatch?>(nil)
            return { batch in
                held.withLock { h in
                    guard let before = h else {
                        h = batch
                        return []
                    }
                    h = nil
                    return [batch, before]
                }
            }
        case .replay:
            return { [$0, $0] }
        }
    }
}

/// A relay that tampers with what it forwards never leaves a device in a corrupt state, and one that withholds
/// entries while forwarding changes that depend on them is seen in `sync.status` (Protocol/RELAY.md, "A relay that
/// cheats").
@Suite(.serialized) struct RelayTamperTests {
    @Test(arguments: Tampering.allCases) func aTamperingRelayNeverCorruptsADevice(how: Tampering) async throws {
        let relay = try await TamperingRelay()
        let a = try syncDaemon(), b = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        let capability = try ca.relayCapability("team")
        _ = try await relay.server.add(try RelayCapability(text: capability))
        _ = try cb.call("peer.remove", ["db": "team", "address": .string(try a.syncAddress())])
        // What the relay forwards of A's writes is tampered with, so B is the one it cheats. (Tampering with what it
        // sends A too would make A refuse it and close its link again and again, taking with it A's batches not yet
        // stored: A's uploads would lag for as long as the relay cheats, which is its right, not what this tests.)
        let rewrite = how.rewrite()
        let origin = try #require(NodeID(hex: try nodeID(ca, "team")))
        relay.tamper { batch in batch.origin == origin ? rewrite(batch) : [batch] }
        for c in [ca, cb] { _ = try c.call("peer.add", ["db": "team", "address": .string(relay.address)]) }
        // A writes in several sealings, so the relay forwards several batches.
        var written: [String: Int64] = [:]
        for i in 0..<30 {
            _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": .string("d\(i)"), "doc": ["i": .int(Int64(i))]])
            written["d\(i)"] = Int64(i)
            if i % 10 == 9 { #expect(await waitUntil { relay.server.counters.entriesStored >= i + 1 }) }
        }
        // Whatever B holds meanwhile is A's data exactly: a prefix of A's writes, never an altered or foreign value.
        #expect(await waitUntil {
            // (The collection does not exist on B before its first document arrives.)
            let docs = (try? cb.call("query.find", ["db": "team", "collection": "c"]))?["docs"]?.arrayValue ?? []
            for d in docs {
                guard let id = d["_id"]?.stringValue, let i = d["i"]?.intValue, written[id] == i else { return false }
            }
            switch how {
            case .replay: return docs.count == 30
            case .flip, .drop, .reorder: return true
            }
        })
        if how == .flip || how == .drop {
            // Refused and counted on B's link to the relay.
            #expect(try await waitUntil {
                let peer = try cb.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue?.first {
                    $0["peer"]?.stringValue == relay.address
                }
                return (peer?["rejected"]?.objectValue ?? [:]).values.contains { ($0.intValue ?? 0) > 0 }
            })
        }
        // The relay behaves again; B's next connection to it brings everything, and B ends where A is.
        relay.tamper(nil)
        _ = try cb.call("peer.remove", ["db": "team", "address": .string(relay.address)])
        _ = try cb.call("peer.add", ["db": "team", "address": .string(relay.address)])
        #expect(try await waitUntil { try replicaState(ca, "team") == replicaState(cb, "team") && replicaState(cb, "team").docs == 30 })
        // The relay never sent A back what A uploaded (not even while storing it), so A had nothing to refuse.
        let aLink = try ca.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue?.first {
            $0["peer"]?.stringValue == relay.address
        }
        let (received, refused) = (aLink?["receivedEntries"]?.intValue, aLink?["rejected"]?.objectValue ?? [:])
        #expect(received == 0 && refused.isEmpty, "\(String(describing: aLink))")
        a.stop()
        b.stop()
        await relay.stop()
    }

    @Test func entriesWithheldWhileLaterChangesAreForwardedAreReportedInSyncStatus() async throws {
        let relay = try await TamperingRelay()
        let a = try syncDaemon(), b = try syncDaemon(), c = try syncDaemon()
        let ca = try a.connect(), cb = try b.connect(), cc = try c.connect()
        _ = try ca.call("db.create", ["db": "team"])
        for x in [cb, cc] { _ = try x.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"]) }
        let capability = try ca.relayCapability("team")
        _ = try await relay.server.add(try RelayCapability(text: capability))
        let nc = try nodeID(cc, "team")
        // The relay keeps back every entry of C's.
        relay.tamper { batch in batch.origin.hex == nc ? [] : [batch] }
        // B reaches only the relay; A reaches C directly and the relay.
        _ = try cb.call("peer.remove", ["db": "team", "address": .string(try a.syncAddress())])
        for x in [ca, cb] { _ = try x.call("peer.add", ["db": "team", "address": .string(relay.address)]) }
        for i in 0..<5 { _ = try cc.call("doc.put", ["db": "team", "collection": "c", "id": .string("c\(i)"), "doc": ["i": .int(Int64(i))]]) }
        let seqC = try ownSeq(cc, "team")
        #expect(await waitUntil { (try? ca.call("doc.get", ["db": "team", "collection": "c", "id": "c4"])) != nil }, "A has C's writes")
        // A writes after seeing C's: its change depends on them. The relay forwards A's, not C's.
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "a0", "doc": ["after": "c4"]])
        func waiting() throws -> [JSONValue] {
            try cb.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["waiting"]?.arrayValue ?? []
        }
        #expect(try await waitUntil { try waiting().contains { $0["origin"]?.stringValue == nc } })
        let w = try #require(try waiting().first { $0["origin"]?.stringValue == nc })
        #expect(w["upTo"]?.intValue == seqC && w["held"]?.intValue == 0)
        #expect(w["via"] == [.string(relay.address)], "the relay brought the change that waits")
        #expect((w["sinceMs"]?.intValue ?? 0) > 0)
        // B does not show A's change before what it depends on: it waits (parked), nothing is half-applied.
        #expect(throws: (any Error).self) { try cb.call("doc.get", ["db": "team", "collection": "c", "id": "a0"]) }
        // Once the entries arrive (the relay behaves; B reconnects), nothing waits and B is where A is.
        relay.tamper(nil)
        _ = try cb.call("peer.remove", ["db": "team", "address": .string(relay.address)])
        _ = try cb.call("peer.add", ["db": "team", "address": .string(relay.address)])
        #expect(try await waitUntil { try replicaState(ca, "team") == replicaState(cb, "team") && waiting().isEmpty })
        for d in [a, b, c] { d.stop() }
        await relay.stop()
    }
}

extension TamperingRelay {
    /// The space id of `capability`.
    func space(_ capability: String) throws -> SpaceID { try RelayCapability(text: capability).space }
}

/// Two daemons of one space whose only path is an in-process relay on a `StallingBackend`; A's first document has
/// reached B through it.
struct StallingTeam {
    let dir = TempDir()
    let backend: StallingBackend
    let server: RelayServer
    let address: String
    let a: DaemonProcess, b: DaemonProcess
    let ca: BlazeConnection, cb: BlazeConnection

    init(storeTimeout: TimeAmount) async throws {
        backend = StallingBackend(try RelayStore(path: dir.path + "/relay.db"))
        var logger = Logger(label: "stalling-relay")
        logger.logLevel = .critical
        server = RelayServer(
            store: backend, identity: DeviceIdentity(), group: MultiThreadedEventLoopGroup.singleton, logger: logger,
            storeTimeout: storeTimeout)
        address = "ws://127.0.0.1:\(try await server.listen(host: "127.0.0.1", port: 0))/v1/sync"
        (a, b) = (try syncDaemon(), try syncDaemon())
        (ca, cb) = (try a.connect(), try b.connect())
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        _ = try await server.add(try RelayCapability(text: try ca.relayCapability("team")))
        _ = try cb.call("peer.remove", ["db": "team", "address": .string(try a.syncAddress())])
        for c in [ca, cb] { _ = try c.call("peer.add", ["db": "team", "address": .string(address)]) }
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "before", "doc": ["v": 1]])
        let receiver = cb
        let arrived = await waitUntil { (try? receiver.call("doc.get", ["db": "team", "collection": "c", "id": "before"])) != nil }
        #expect(arrived)
    }
}

/// A relay whose store stops answering closes the connections waiting on it once `storeTimeout` passes, so devices
/// reconnect instead of waiting on a link that sends nothing (Protocol/RELAY.md, "Metrics").
@Suite struct RelayStallTests {
    @Test func aStoreThatStopsAnsweringClosesTheConnectionsWaitingOnItAndDevicesCatchUpAfter() async throws {
        let t = try await StallingTeam(storeTimeout: .milliseconds(500))
        let (backend, server, a, b, ca, cb) = (t.backend, t.server, t.a, t.b, t.ca, t.cb)

        // The store stops answering while A writes: what A sends waits on it, and so would A's link, for good.
        backend.stalled.store(true, ordering: .relaxed)
        for i in 0..<5 { _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": .string("d\(i)"), "doc": ["i": .int(Int64(i))]]) }
        #expect(await waitUntil { server.counters.storeTimeouts >= 1 }, "the waiting connection is closed")
        let metrics = String(decoding: server.metrics.render(relay: server), as: UTF8.self)
        #expect(metrics.contains("blaze_relay_store_failures_total{reason=\"timeout\"} "), "\(metrics)")
        // The store answers again: the devices' next connections carry everything.
        backend.stalled.store(false, ordering: .relaxed)
        #expect(try await waitUntil { try replicaState(ca, "team") == replicaState(cb, "team") && replicaState(cb, "team").docs == 6 })
        a.stop()
        b.stop()
        await server.shutdown()
    }

    /// A batch the relay stores after the device that sent it closed its connection is counted and passed on to the
    /// other devices at once, not at their next round.
    @Test func aBatchStoredAfterItsSenderLeftStillReachesTheOthers() async throws {
        let t = try await StallingTeam(storeTimeout: .seconds(30))
        let (backend, server, address, a, b, ca, cb) = (t.backend, t.server, t.address, t.a, t.b, t.ca, t.cb)
        #expect(await waitUntil { server.gate.current.total == 2 })
        let stored = server.counters.entriesStored

        // A's next batch waits on the store, and A leaves meanwhile: the relay sees its connection close first.
        backend.storesHeld.store(true, ordering: .relaxed)
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "late", "doc": ["v": 2]])
        let na = try #require(NodeID(hex: try nodeID(ca, "team")))
        #expect(await waitUntil { backend.heldOrigins.withLock { $0.contains(na) } })
        _ = try ca.call("peer.remove", ["db": "team", "address": .string(address)])
        #expect(await waitUntil { server.gate.current.total == 1 })
        backend.storesHeld.store(false, ordering: .relaxed)
        // B asks for nothing new meanwhile: only the relay passing the batch on brings it.
        #expect(await waitUntil { (try? cb.call("doc.get", ["db": "team", "collection": "c", "id": "late"])) != nil })
        #expect(server.counters.entriesStored > stored)
        // Neither device sent the relay back what the relay had sent it.
        #expect(backend.storesAddingNothing.load(ordering: .relaxed) == 0)
        a.stop()
        b.stop()
        await server.shutdown()
    }
}
