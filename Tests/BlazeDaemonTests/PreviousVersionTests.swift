import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import BlazeVector
import Foundation
import Testing

/// The directory holding the previous release's `blazed` and `blaze-relay` (protocol 4 only), built from its commit
/// by `.ci/build-previous` (which `make test` runs first and names here).
let previousBuild = ProcessInfo.processInfo.environment["BLAZE_PREVIOUS_BUILD"].flatMap { $0.isEmpty ? nil : $0 }

/// Mixed versions (SYNC.md §8, "Versions"): the previous release and this build sync both ways directly, through a
/// relay of either build and through a folder, each connection speaking the newest version both ends know.
@Suite(.serialized, .enabled(if: previousBuild != nil, "BLAZE_PREVIOUS_BUILD is not set: `make test` builds the previous release"))
struct PreviousVersionTests {
    let bin = previousBuild ?? ""

    /// A daemon of the previous release accepting peers on a free loopback port.
    func previousDaemon(dir: TempDir = TempDir()) throws -> DaemonProcess {
        try DaemonProcess(arguments: ["--sync-listen", "127.0.0.1:0"], dir: dir, executable: bin + "/blazed")
    }

    /// The protocol versions a daemon says it speaks (`daemon.info` `formats`).
    func protocols(_ c: BlazeConnection) throws -> [Int64?] {
        let f = try c.call("daemon.info")["formats"]
        return [f?["oldestProtocol"]?.intValue, f?["protocol"]?.intValue]
    }

    /// The protocol versions of `c`'s connected links for `db`, and what they rejected.
    func links(_ c: BlazeConnection, _ db: String) throws -> [(version: Int64?, rejected: JSONValue?)] {
        let peers = try c.call("sync.status", ["db": .string(db)])["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
        return peers.filter { $0["connected"] == true }.map { ($0["protocolVersion"]?.intValue, $0["rejected"]) }
    }

    /// Puts `count` bytes (deterministic from `seed`) as a blob on `c`, in a document `id` of `db`; returns its id and
    /// bytes.
    func putBlob(_ c: BlazeConnection, _ dir: TempDir, _ db: String, _ id: String, _ count: Int, seed: UInt64) throws -> (JSONValue, Data) {
        let bytes = Data(BlobDaemonTests().content(count, seed: seed))
        let file = dir.path + "/\(id).bin"
        #expect(FileManager.default.createFile(atPath: file, contents: bytes))
        let put = try c.call("blob.put", ["db": .string(db), "path": .string(file), "type": "application/octet-stream"])
        _ = try c.call("doc.put", ["db": .string(db), "collection": "files", "id": .string(id), "doc": ["file": put["ref"]!]])
        return (try #require(put["blob"]?["id"]), bytes)
    }

    /// Reads blob `id` on `c` into a new file once it can (its document and chunks may still be on their way).
    func getBlob(_ c: BlazeConnection, _ dir: TempDir, _ db: String, _ id: JSONValue, as name: String) -> Data? {
        let out = dir.path + "/\(name).out"
        let done = eventually(timeout: .seconds(90)) {
            try? FileManager.default.removeItem(atPath: out)
            return (try? c.call("blob.get", ["db": .string(db), "blob": id, "path": .string(out)])) != nil
        }
        return done ? try? Data(contentsOf: URL(fileURLWithPath: out)) : nil
    }

    @Test(arguments: [true, false])
    func thePreviousReleaseAndThisBuildSyncBothWaysOverAPeerLink(previousShares: Bool) throws {
        let old = try previousDaemon(), new = try syncDaemon()
        defer {
            old.stop()
            new.stop()
        }
        let (co, cn) = (try old.connect(), try new.connect())
        #expect(try protocols(co) == [nil, 4], "not a build of the previous release")
        #expect(try protocols(cn) == [4, Int64(Handshake.protocols.upperBound)])
        // The joiner dials the one that shared: this build dials the old one, then the other way round.
        let (admin, joiner) = previousShares ? (co, cn) : (cn, co)
        _ = try admin.call("db.create", ["db": "team"])
        _ = try joiner.call("db.join", ["token": .string(try admin.invite("team")), "db": "team"])
        for i in 0..<30 {
            _ = try co.call("doc.put", ["db": "team", "collection": "notes", "id": .string("old\(i)"), "doc": ["by": "old", "i": .int(Int64(i))]])
            _ = try cn.call("doc.put", ["db": "team", "collection": "notes", "id": .string("new\(i)"), "doc": ["by": "new", "i": .int(Int64(i))]])
        }
        _ = try co.call("doc.patch", ["db": "team", "collection": "notes", "id": "new0", "set": ["seen": "by old"]])
        _ = try cn.call("doc.patch", ["db": "team", "collection": "notes", "id": "old0", "incr": ["n": 2]])
        // A vector written here is sealed in the format every member opens: the previous release states none, so 2.
        let vector: JSONValue = ["$vector": .string(VectorValue.encode((0..<768).map { Float($0) / 768 }))]
        _ = try cn.call("doc.put", ["db": "team", "collection": "notes", "id": "vec", "doc": ["e": vector]])
        #expect(try cn.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["entryFormat"] == 2)
        // Blobs both ways (their chunks cross as protocol 4's CHUNK frames).
        let (fromOld, oldBytes) = try putBlob(co, old.dir, "team", "from-old", 2_500_000, seed: 41)
        let (fromNew, newBytes) = try putBlob(cn, new.dir, "team", "from-new", 2_500_000, seed: 42)
        #expect(try eventually {
            let (so, sn) = (try replicaState(co, "team"), try replicaState(cn, "team"))
            return so.docs == 63 && so == sn
        }, "old \(String(describing: try? replicaState(co, "team"))), new \(String(describing: try? replicaState(cn, "team")))")
        #expect(getBlob(cn, new.dir, "team", fromOld, as: "got-old") == oldBytes)
        #expect(getBlob(co, old.dir, "team", fromNew, as: "got-new") == newBytes)
        #expect(try cn.call("doc.get", ["db": "team", "collection": "notes", "id": "new0"])["doc"]?["seen"] == "by old")
        #expect(try co.call("doc.get", ["db": "team", "collection": "notes", "id": "old0"])["doc"]?["n"] == 2)
        #expect(try co.call("doc.get", ["db": "team", "collection": "notes", "id": "vec"])["doc"]?["e"] == vector)
        // This build's side of the link speaks 4 and refused nothing.
        let seen = try links(cn, "team")
        #expect(!seen.isEmpty && seen.allSatisfy { $0.version == 4 && $0.rejected == [:] }, "\(seen)")
        #expect(try links(co, "team").allSatisfy { $0.rejected == [:] })
    }

    /// `previous` names what runs the previous release: the relay (both devices this build's) or one device (the
    /// relay this build's).
    @Test(arguments: ["relay", "device"])
    func thePreviousReleaseAndThisBuildSyncThroughARelay(previous: String) throws {
        let relay = try RelayProcess(executable: previous == "relay" ? bin + "/blaze-relay" : nil)
        let dirA = TempDir()
        var a = try syncDaemon(dir: dirA)
        let b = previous == "device" ? try previousDaemon() : try syncDaemon()
        defer {
            a.stop()
            b.stop()
            relay.stop()
        }
        var ca = try a.connect()
        let cb = try b.connect()
        // From now on A and B meet only through the relay, never online together.
        try BlobResumeTests().meetThroughRelay(a, ca, b, cb, relay)
        for i in 0..<40 {
            _ = try ca.call("doc.put", ["db": "team", "collection": "notes", "id": .string("a\(i)"), "doc": ["text": .string("A \(i)")]])
        }
        // A vector, once A's link to the relay is up: sealed in format 2, which a relay (or device) of the previous
        // release carries; a relay of that release made A state that it can be sent format 2 only.
        #expect(eventually { (try? links(ca, "team"))?.isEmpty == false })
        let vector: JSONValue = ["$vector": .string(VectorValue.encode((0..<768).map { Float($0 % 17) / 17 }))]
        _ = try ca.call("doc.put", ["db": "team", "collection": "notes", "id": "vec", "doc": ["e": vector]])
        #expect(try ca.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["entryFormat"] == 2)
        let (blob, bytes) = try putBlob(ca, dirA, "team", "clip", 3_000_000, seed: 7)
        let seqA = try ownSeq(ca, "team")
        let na = try nodeID(ca, "team")
        #expect(try eventually { try relay.held()[na] == seqA }, "the relay holds A's \(seqA) entries")
        #expect(eventually(timeout: .seconds(60)) {
            (try? BlobRelayTests().relayChunks(relay)) == Int((try? ca.call("blob.stat", ["db": "team", "blob": blob]))?["chunks"]?.intValue ?? -1) + 1
        }, "every chunk and the manifest reached the relay")
        a.stop()
        _ = try cb.call("peer.add", ["db": "team", "address": .string(relay.address)])
        #expect(try eventually { try replicaState(cb, "team").docs == 42 })
        #expect(try cb.call("doc.get", ["db": "team", "collection": "notes", "id": "vec"])["doc"]?["e"] == vector)
        #expect(getBlob(cb, b.dir, "team", blob, as: "clip") == bytes)
        for i in 0..<25 {
            _ = try cb.call("doc.put", ["db": "team", "collection": "notes", "id": .string("b\(i)"), "doc": ["text": .string("B \(i)")]])
        }
        _ = try cb.call("doc.patch", ["db": "team", "collection": "notes", "id": "a0", "set": ["text": "edited by B"]])
        let seqB = try ownSeq(cb, "team"), nb = try nodeID(cb, "team")
        #expect(try eventually { try relay.held()[nb] == seqB }, "the relay holds B's \(seqB) entries")
        a = try syncDaemon(dir: dirA)
        ca = try a.connect()
        #expect(try eventually { try replicaState(ca, "team") == replicaState(cb, "team") })
        #expect(try ca.call("doc.get", ["db": "team", "collection": "notes", "id": "a0"])["doc"]?["text"] == "edited by B")
        // Each of this build's links to the relay speaks the newest version both know.
        let expected: Int64 = previous == "relay" ? 4 : Int64(Handshake.protocols.upperBound)
        for c in previous == "relay" ? [ca, cb] : [ca] {
            let seen = try links(c, "team")
            #expect(!seen.isEmpty && seen.allSatisfy { $0.version == expected && $0.rejected == [:] }, "\(seen)")
        }
    }

    @Test(arguments: [true, false])
    func thePreviousReleaseAndThisBuildSyncThroughAFolder(previousShares: Bool) throws {
        let old = try previousDaemon(), new = try syncDaemon()
        defer {
            old.stop()
            new.stop()
        }
        let (co, cn) = (try old.connect(), try new.connect())
        let (admin, joiner) = previousShares ? (co, cn) : (cn, co)
        _ = try admin.call("db.create", ["db": "team"])
        _ = try joiner.call("db.join", ["token": .string(try admin.invite("team")), "db": "team"])
        // The folder is the only path once the joiner forgets its peer.
        #expect(try eventually { try members(admin, "team").count == 2 })
        for peer in try joiner.call("peer.list", ["db": "team"])["peers"]?.arrayValue ?? [] {
            _ = try joiner.call("peer.remove", ["db": "team", "address": peer["address"] ?? .null])
        }
        let folder = TempDir()
        for c in [co, cn] { _ = try c.call("folder.add", ["db": "team", "path": .string(folder.path)]) }
        for i in 0..<30 {
            _ = try co.call("doc.put", ["db": "team", "collection": "notes", "id": .string("old\(i)"), "doc": ["i": .int(Int64(i))]])
            _ = try cn.call("doc.put", ["db": "team", "collection": "notes", "id": .string("new\(i)"), "doc": ["i": .int(Int64(i))]])
        }
        let (fromOld, oldBytes) = try putBlob(co, old.dir, "team", "from-old", 1_500_000, seed: 3)
        let (fromNew, newBytes) = try putBlob(cn, new.dir, "team", "from-new", 1_500_000, seed: 4)
        #expect(try eventually {
            let (so, sn) = (try replicaState(co, "team"), try replicaState(cn, "team"))
            return so.docs == 62 && so == sn
        })
        #expect(getBlob(cn, new.dir, "team", fromOld, as: "got-old") == oldBytes)
        #expect(getBlob(co, old.dir, "team", fromNew, as: "got-new") == newBytes)
        for c in [co, cn] {
            let status = try folderStatus(c, folder.path)
            #expect(status["lastError"] == .null, "\(status)")
        }
    }
}

/// A device that shares no protocol version with this build (one speaking only a future version 6, simulated with
/// `BLAZE_SYNC_PROTOCOLS`) is refused with an error naming both, whichever side dials.
@Suite(.serialized) struct NewerProtocolTests {
    @Test(arguments: [true, false])
    func aDeviceSpeakingOnlyANewerProtocolIsRefusedNamingTheVersions(newerDials: Bool) throws {
        let dirNewer = TempDir()
        var newer = try syncDaemon(dir: dirNewer)
        let current = try syncDaemon()
        defer {
            newer.stop()
            current.stop()
        }
        let cc = try current.connect()
        var cn = try newer.connect()
        _ = try cc.call("db.create", ["db": "team"])
        _ = try cn.call("db.join", ["token": .string(try cc.invite("team")), "db": "team"])
        for peer in try cn.call("peer.list", ["db": "team"])["peers"]?.arrayValue ?? [] {
            _ = try cn.call("peer.remove", ["db": "team", "address": peer["address"] ?? .null])
        }
        newer.stop()
        newer = try DaemonProcess(
            arguments: ["--sync-listen", "127.0.0.1:0"], dir: dirNewer, environment: ["BLAZE_SYNC_PROTOCOLS": "7-7"])
        cn = try newer.connect()
        let (dialer, listener) = newerDials ? (cn, current) : (cc, newer)
        _ = try dialer.call("peer.add", ["db": "team", "address": .string(try listener.syncAddress())])
        // The dialing side learns it once the listener's proof holds, and says which versions each speaks and which
        // side to upgrade.
        let expected = newerDials
            ? "the peer speaks sync protocol 4–\(Handshake.protocols.upperBound), this build speaks sync protocol 7: the peer must upgrade"
            : "the peer speaks sync protocol 7, this build speaks sync protocol 4–\(Handshake.protocols.upperBound): upgrade this device"
        var peer: JSONValue?
        #expect(eventually {
            peer = (try? dialer.call("sync.status", ["db": "team"]))?["databases"]?.arrayValue?.first?["peers"]?.arrayValue?.first
            return peer?["rejected"]?["incompatible_protocol"]?.intValue ?? 0 >= 1
        }, "\(String(describing: peer))")
        #expect(peer?["lastError"]?.stringValue == "incompatible protocol: " + expected)
        #expect(peer?["connected"] == false && (peer?["protocolVersion"] ?? .null) == .null)
    }
}
