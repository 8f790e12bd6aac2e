import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import BlazeVector
import Foundation
import Testing

/// Entry format 3 between daemons (SYNC.md §6, "Entry formats"): once each member has the other's statement, vectors
/// cross as bytes, over a peer link and through a folder; the documents arrive exactly as written.
@Suite struct EntryFormatDaemonTests {
    /// The format `db`'s changes are sealed in on the daemon behind `c` (`sync.status` `entryFormat`).
    static func entryFormat(_ c: BlazeConnection, _ db: String) -> Int64? {
        (try? c.call("sync.status", ["db": .string(db)]))?["databases"]?.arrayValue?.first?["entryFormat"]?.intValue
    }

    /// Bytes received from every peer of `db`.
    static func receivedBytes(_ c: BlazeConnection, _ db: String) throws -> Int64 {
        let peers = try c.call("sync.status", ["db": .string(db)])["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
        return peers.reduce(0) { $0 + ($1["receivedBytes"]?.intValue ?? 0) }
    }

    /// Every document of `collection` in `db`, by id, as stored.
    static func documents(_ c: BlazeConnection, _ db: String, _ collection: String) throws -> [String: JSONValue] {
        let docs = try c.call("query.find", ["db": .string(db), "collection": .string(collection), "limit": 1000])["docs"]?.arrayValue ?? []
        return Dictionary(uniqueKeysWithValues: docs.map { ($0["_id"]?.stringValue ?? "", $0) })
    }

    @Test func overAPeerLinkVectorsCrossAsBytesOnceBothSidesStatedTheyOpenThem() throws {
        let a = try syncDaemon(), b = try syncDaemon()
        defer {
            a.stop()
            b.stop()
        }
        let (ca, cb) = (try a.connect(), try b.connect())
        _ = try ca.call("db.create", ["db": "photos"])
        // Alone in its space, a device seals the newest format: no other member needs to read it.
        _ = try ca.call("db.share", ["db": "photos"])
        #expect(Self.entryFormat(ca, "photos") == 3)
        _ = try cb.call("db.join", ["token": .string(try ca.invite("photos")), "db": "photos"])
        #expect(eventually(timeout: .seconds(60)) { Self.entryFormat(ca, "photos") == 3 && Self.entryFormat(cb, "photos") == 3 })
        #expect(eventually { (try? Self.receivedBytes(cb, "photos")) ?? 0 > 0 })
        let before = try Self.receivedBytes(cb, "photos")
        let rows = VectorDaemonTests.vectors(200, 768, seed: 3).enumerated().map { (id: "p\($0.offset)", v: $0.element) }
        try VectorDaemonTests.write(rows, to: ca, db: "photos", collection: "p")
        #expect(eventually(timeout: .seconds(60)) { (try? cb.call("query.count", ["db": "photos", "collection": "p"]))?["count"] == 200 })
        #expect(try Self.documents(cb, "photos", "p") == Self.documents(ca, "photos", "p"))
        // 200 vectors are 614,400 bytes of float32 and 819,200 of base64: what crossed (with the rest of each
        // document, padding, framing and control messages) is far from the base64.
        let received = try Self.receivedBytes(cb, "photos") - before
        #expect(received > 614_400 && received < 720_000, "\(received) bytes for 200 vectors")
        // B's writes go back in format 3 too.
        _ = try cb.call("doc.patch", ["db": "photos", "collection": "p", "id": "p7", "set": ["v": ["$vector": [1.5, -2, 0.25]]]])
        #expect(eventually(timeout: .seconds(30)) {
            (try? ca.call("doc.get", ["db": "photos", "collection": "p", "id": "p7"]))?["doc"]?["v"] == ["$vector": "AADAPwAAAMAAAIA+"]
        })
    }

    @Test func throughAFolderTheStatementsAndTheVectorsTravelInItsFiles() throws {
        // The devices join over protocol 5, so the folder is the only way their statements can travel.
        let team = try FolderTeam(count: 2, arguments: ["--folder-poll-interval", "0.1"], setup: ["BLAZE_SYNC_PROTOCOLS": "4-5"])
        defer { team.stopAll() }
        let (a, b) = (team.clients[0], team.clients[1])
        #expect(Self.entryFormat(a, "team") == 2 && Self.entryFormat(b, "team") == 2)
        let folder = TempDir()
        for c in team.clients { _ = try c.call("folder.add", ["db": "team", "path": .string(folder.path)]) }
        #expect(eventually(timeout: .seconds(60)) { Self.entryFormat(a, "team") == 3 && Self.entryFormat(b, "team") == 3 })
        let space = try spaceOf(a)
        #expect(FileManager.default.fileExists(atPath: "\(folder.path)/\(space)/\(team.nodes[1])/.formats"))
        let rows = VectorDaemonTests.vectors(50, 768, seed: 4).enumerated().map { (id: "v\($0.offset)", v: $0.element) }
        try VectorDaemonTests.write(rows, to: a, db: "team", collection: "p")
        #expect(eventually(timeout: .seconds(60)) { (try? count(b, "p")) == 50 })
        #expect(try Self.documents(b, "team", "p") == Self.documents(a, "team", "p"))
        // A's segments hold the 50 vectors as bytes (153,600), not as base64 (204,800).
        let own = "\(folder.path)/\(space)/\(team.nodes[0])"
        let segments = filesUnder(own).filter { $0.hasSuffix(".seg") }
        let bytes = segments.reduce(0) { $0 + ((try? FileManager.default.attributesOfItem(atPath: own + "/" + $1)[.size] as? Int) ?? 0) }
        #expect(bytes > 153_600 && bytes < 190_000, "\(bytes) bytes of segments")
        #expect(try folderStatus(b, folder.path)["rejected"] == [:])
    }

    /// Devices that met over protocol 5 and then only through a relay (SQLite, or PostgreSQL) learn each other's
    /// statements there, each while the other is offline, and then send vectors as bytes through it.
    @Test(arguments: [false, true])
    func throughARelayTheStatementsReachDevicesThatNeverMeet(postgres: Bool) throws {
        let pg = postgres ? try PostgresServer() : nil
        let relay = try RelayProcess(postgres: pg)
        let (dirA, dirB) = (TempDir(), TempDir())
        let old = ["BLAZE_SYNC_PROTOCOLS": "4-5"]
        var a = try syncDaemon(dir: dirA, environment: old), b = try syncDaemon(dir: dirB, environment: old)
        defer {
            a.stop()
            b.stop()
            relay.stop()
        }
        var (ca, cb) = (try a.connect(), try b.connect())
        try BlobResumeTests().meetThroughRelay(a, ca, b, cb, relay)
        #expect(eventually { (try? members(ca, "team").count) == 2 })
        #expect(Self.entryFormat(ca, "team") == 2 && Self.entryFormat(cb, "team") == 2)
        // Both start again speaking protocol 6, and are never online together from now on.
        a.stop()
        b.stop()
        a = try syncDaemon(dir: dirA)
        ca = try a.connect()
        #expect(eventually(timeout: .seconds(30)) { (try? relay.count("relay_formats")) == 1 }, "A's statement reached the relay")
        a.stop()
        b = try syncDaemon(dir: dirB)
        cb = try b.connect()
        _ = try cb.call("peer.add", ["db": "team", "address": .string(relay.address)])
        #expect(eventually(timeout: .seconds(30)) { Self.entryFormat(cb, "team") == 3 }, "B learned A's statement from the relay")
        #expect(eventually(timeout: .seconds(30)) { (try? relay.count("relay_formats")) == 2 })
        b.stop()
        a = try syncDaemon(dir: dirA)
        ca = try a.connect()
        #expect(eventually(timeout: .seconds(30)) { Self.entryFormat(ca, "team") == 3 }, "A learned B's statement from the relay")
        let rows = VectorDaemonTests.vectors(50, 768, seed: 5).enumerated().map { (id: "r\($0.offset)", v: $0.element) }
        try VectorDaemonTests.write(rows, to: ca, db: "team", collection: "p")
        let seqA = try ownSeq(ca, "team")
        let na = try nodeID(ca, "team")
        #expect(eventually(timeout: .seconds(60)) { (try? relay.held()[na]) == seqA }, "the relay holds A's entries")
        a.stop()
        b = try syncDaemon(dir: dirB)
        cb = try b.connect()
        #expect(eventually(timeout: .seconds(60)) { (try? cb.call("query.count", ["db": "team", "collection": "p"]))?["count"] == 50 })
        let onB = try Self.documents(cb, "team", "p")
        #expect(rows.allSatisfy { onB[$0.id]?["v"] == ["$vector": .string(VectorValue.encode($0.v))] })
        let received = try Self.receivedBytes(cb, "team")
        #expect(received < 50 * 4096, "\(received) bytes received by B for 50 vectors")
    }

    /// A device speaking protocol 5 (as the previous release does) is refused when it joins a space holding entries
    /// of format 3 (the invite stays unused); a member whose daemon went back to protocol 5 is not sent them, and the
    /// sender says why; both get them once they speak protocol 6.
    @Test func devicesOfAnOlderProtocolAreRefusedOrNotSentEntriesOfFormatThree() throws {
        let a = try syncDaemon(), b = try syncDaemon(), dirC = TempDir()
        let older = ["BLAZE_SYNC_PROTOCOLS": "4-5"]
        var c = try syncDaemon(dir: dirC, environment: older)
        defer {
            a.stop()
            b.stop()
            c.stop()
        }
        let (ca, cb) = (try a.connect(), try b.connect())
        var cc = try c.connect()
        _ = try ca.call("db.create", ["db": "photos"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("photos")), "db": "photos"])
        #expect(eventually(timeout: .seconds(60)) { Self.entryFormat(ca, "photos") == 3 && Self.entryFormat(cb, "photos") == 3 })
        _ = try ca.call("doc.put", ["db": "photos", "collection": "p", "id": "v1", "doc": ["e": ["$vector": [0.25, -1, 3]]]])
        #expect(eventually(timeout: .seconds(30)) { (try? cb.call("doc.get", ["db": "photos", "collection": "p", "id": "v1"])) != nil })
        let token = try ca.invite("photos")
        do {
            _ = try cc.call("db.join", ["token": .string(token), "db": "photos"])
            Issue.record("a device speaking protocol 5 joined a space holding entries of format 3")
        } catch {
            #expect("\(error)".contains("upgrade_required"), "\(error)")
        }
        #expect(try ca.call("sync.status")["invitesRefused"]?["upgrade_required"] == 1)

        // Upgraded, C joins with the same invite and gets the entry.
        c.stop()
        c = try syncDaemon(dir: dirC)
        cc = try c.connect()
        _ = try cc.call("db.join", ["token": .string(token), "db": "photos"])
        #expect(eventually(timeout: .seconds(30)) {
            (try? cc.call("doc.get", ["db": "photos", "collection": "p", "id": "v1"]))?["doc"]?["e"] == ["$vector": "AACAPgAAgL8AAEBA"]
        })
        #expect(eventually(timeout: .seconds(30)) { Self.entryFormat(ca, "photos") == 3 })
        // C's daemon goes back to protocol 5 (its statement still says 3): A does not send it what it sealed in format 3.
        c.stop()
        c = try syncDaemon(dir: dirC, environment: older)
        cc = try c.connect()
        _ = try ca.call("doc.put", ["db": "photos", "collection": "p", "id": "v2", "doc": ["e": ["$vector": [1, 2, 3]]]])
        var told: String?
        #expect(eventually(timeout: .seconds(30)) {
            let peers = (try? ca.call("sync.status", ["db": "photos"]))?["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
            told = peers.compactMap { $0["lastError"]?.stringValue }.first { $0.contains("entry format 3") }
            return told != nil
        })
        #expect(told?.contains("this device (sync protocol 5) cannot open: upgrade it") == true, "\(told ?? "-")")
        #expect(throws: (any Error).self) { try cc.call("doc.get", ["db": "photos", "collection": "p", "id": "v2"]) }
        #expect(try cc.call("sync.status", ["db": "photos"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue?
            .allSatisfy { $0["rejected"] == [:] } == true, "C was sent nothing it refused")
        c.stop()
        c = try syncDaemon(dir: dirC)
        cc = try c.connect()
        #expect(eventually(timeout: .seconds(30)) { (try? cc.call("doc.get", ["db": "photos", "collection": "p", "id": "v2"])) != nil })
    }
}
