import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import GRDB
import Testing

/// Blobs through a relay (Protocol/RELAY.md, "Blob chunks"): a device leaves the chunks it holds on the relay, and a
/// device that is never online at the same time fetches them there; a copy the relay holds bad is dropped and
/// restored by the holder's next connection; strangers neither upload nor learn anything.
@Suite(.serialized) struct BlobRelayTests {
    /// Rows of the relay's chunk table.
    func relayChunks(_ relay: RelayProcess) throws -> Int {
        if let pg = relay.postgres {
            return Int(try pg.psql("SELECT count(*) FROM relay_chunks").trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
        }
        return try relay.count("relay_chunks")
    }

    /// Runs `sql` on the relay's store.
    func runSQL(_ relay: RelayProcess, _ sql: String) throws {
        if let pg = relay.postgres {
            _ = try pg.psql(sql)
        } else {
            try DatabaseQueue(path: relay.dataDir + "/relay.db").write { try $0.execute(sql: sql) }
        }
    }

    /// Chunk leases of the relay not renewed since they were set to 0.
    func staleLeases(_ relay: RelayProcess) throws -> Int {
        let sql = "SELECT count(*) FROM relay_chunk_leases WHERE kept_ms = 0"
        if let pg = relay.postgres { return Int(try pg.psql(sql).trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1 }
        return try DatabaseQueue(path: relay.dataDir + "/relay.db").read { try Int.fetchOne($0, sql: sql) } ?? -1
    }

    /// Replaces the relay's copy of one chunk with another chunk's (well formed, but not the chunk its id names).
    func spoilOneChunk(_ relay: RelayProcess) throws {
        let sql = """
            UPDATE relay_chunks SET bytes = (SELECT bytes FROM relay_chunks ORDER BY id LIMIT 1 OFFSET 1) \
            WHERE id = (SELECT id FROM relay_chunks ORDER BY id LIMIT 1)
            """
        if let pg = relay.postgres {
            _ = try pg.psql(sql)
        } else {
            try DatabaseQueue(path: relay.dataDir + "/relay.db").write { try $0.execute(sql: sql) }
        }
    }

    @Test(arguments: [false, true])
    func aBlobLeftOnARelayIsFetchedThereAfterItsHolderStopped(postgres: Bool) throws {
        let pg = postgres ? try PostgresServer() : nil
        let relay = try RelayProcess(postgres: pg)
        let dirA = TempDir()
        var a = try syncDaemon(dir: dirA)
        let b = try syncDaemon()
        defer {
            a.stop()
            b.stop()
            relay.stop()
        }
        var ca = try a.connect()
        let cb = try b.connect()
        // From now on the two never meet: A leaves the blob on the relay and stops before B comes.
        try BlobResumeTests().meetThroughRelay(a, ca, b, cb, relay)
        let marker = Array("plaintext that must never reach the relay".utf8)
        var bytes = BlobDaemonTests().content(6_000_000, seed: 11)
        bytes.replaceSubrange(3_000_000..<(3_000_000 + marker.count), with: marker)
        let file = dirA.path + "/clip.bin"
        #expect(FileManager.default.createFile(atPath: file, contents: Data(bytes)))
        let put = try ca.call("blob.put", ["db": "team", "path": .string(file), "type": "video/mp4"])
        _ = try ca.call("doc.put", ["db": "team", "collection": "files", "id": "clip", "doc": ["file": put["ref"]!]])
        let id = try #require(put["blob"]?["id"])
        let chunks = try #require(put["chunks"]?.intValue.map { Int($0) })
        // Every chunk and the manifest reach the relay.
        #expect(eventually(timeout: .seconds(60)) { (try? relayChunks(relay)) == chunks + 1 }, "the relay holds \((try? relayChunks(relay)) ?? -1)")
        if pg == nil {
            for suffix in ["", "-wal"] {
                let held = (try? Data(contentsOf: URL(fileURLWithPath: relay.dataDir + "/relay.db" + suffix))) ?? Data()
                #expect(held.range(of: Data(marker)) == nil, "plaintext in the relay's file")
            }
        }
        a.stop()
        // A copy the relay holds bad (here: another chunk's bytes under its id; the relay cannot tell) is refused by
        // the reader, which reports it: the relay drops it, and the holder's next connection restores it.
        try spoilOneChunk(relay)

        // B reaches only the relay: the document, then the blob's content, come from there.
        _ = try cb.call("peer.add", ["db": "team", "address": .string(relay.address)])
        #expect(eventually(timeout: .seconds(30)) {
            (try? cb.call("doc.get", ["db": "team", "collection": "files", "id": "clip"]))?["doc"]?["file"]?["$blob"]?["id"] == id
        })
        let out = b.dir.path + "/clip.out"
        #expect((try? cb.call("blob.get", ["db": "team", "blob": id, "path": .string(out)])) == nil,
            "a blob with a chunk no source holds good was read")
        #expect(eventually(timeout: .seconds(60)) { (try? relayChunks(relay)) == chunks }, "the spoiled copy was not dropped")
        let rejected = try cb.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue?
            .compactMap { $0["rejected"]?["bad_chunk"]?.intValue }.reduce(0, +)
        #expect(rejected == 1, "the reader did not count the bad copy")

        // Leases that ran out long ago (as if nobody had named the chunks since): the holder's next connection
        // renews every chunk it holds (CHUNK_KEEP), so none is left to a lease sweep.
        try runSQL(relay, "UPDATE relay_chunk_leases SET kept_ms = 0")
        a = try syncDaemon(dir: dirA)
        ca = try a.connect()
        #expect(eventually(timeout: .seconds(60)) { (try? relayChunks(relay)) == chunks + 1 }, "the holder did not restore it")
        #expect(eventually(timeout: .seconds(60)) { (try? staleLeases(relay)) == 0 }, "the holder did not keep its chunks")
        var got: JSONValue?
        #expect(eventually(timeout: .seconds(60)) {
            got = try? cb.call("blob.get", ["db": "team", "blob": id, "path": .string(out)])
            return got != nil
        })
        #expect(got?["bytes"] == 6_000_000)
        #expect((try? Data(contentsOf: URL(fileURLWithPath: out))) == Data(bytes))
        let received = try cb.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue?
            .compactMap { $0["chunksReceived"]?.intValue }.reduce(0, +)
        #expect((received ?? 0) >= Int64(chunks), "the content did not come from the relay")
        _ = ca
    }

    /// A blob that only devices without its content still refer to stays on the relay: the holder is gone for good,
    /// and B, which never read the blob, fetches its manifest when the relay is due to be told what to keep, and
    /// names every piece, so no lease runs out while B connects; the content itself stays on the relay.
    @Test func aBlobOnlyDevicesWithoutItsContentReferToStaysOnTheRelay() throws {
        let relay = try RelayProcess()
        let a = try syncDaemon(), dirB = TempDir()
        var b = try syncDaemon(dir: dirB)
        defer {
            a.stop()
            b.stop()
            relay.stop()
        }
        let ca = try a.connect()
        var cb = try b.connect()
        let resume = BlobResumeTests()
        try resume.meetThroughRelay(a, ca, b, cb, relay)
        let (id, chunks) = try resume.put(BlobDaemonTests().content(5_000_000, seed: 31), on: ca, dir: a.dir.path, doc: "film")
        #expect(eventually(timeout: .seconds(60)) { (try? relayChunks(relay)) == Int(chunks) + 1 }, "the upload")
        a.stop()
        _ = try cb.call("peer.add", ["db": "team", "address": .string(relay.address)])
        #expect(eventually(timeout: .seconds(30)) {
            (try? cb.call("doc.get", ["db": "team", "collection": "files", "id": "film"]))?["doc"]?["file"]?["$blob"]?["id"] == id
        })
        // Leases that ran out long ago; B's next connection (after a restart) names the manifest and every piece.
        try runSQL(relay, "UPDATE relay_chunk_leases SET kept_ms = 0")
        #expect(try staleLeases(relay) == Int(chunks) + 1)
        b.stop()
        b = try syncDaemon(dir: dirB)
        cb = try b.connect()
        #expect(eventually(timeout: .seconds(60)) { (try? staleLeases(relay)) == 0 }, "B did not keep the blob it refers to")
        let stat = try cb.call("blob.stat", ["db": "team", "blob": id])
        #expect(stat["chunks"]?.intValue == chunks)
        #expect(stat["heldChunks"]?.intValue == 0, "B fetched the content, not only the manifest")
        #expect(try relayChunks(relay) == Int(chunks) + 1)
    }

    @Test func strangersNeitherUploadNorLearnWhatTheRelayHolds() throws {
        let relay = try RelayProcess()
        let (a, ca, capability) = try sharedTeam(servedBy: relay)
        defer {
            a.stop()
            relay.stop()
        }
        // The relay holds the space's log: the stranger is not in it.
        _ = try ca.call("peer.add", ["db": "team", "address": .string(relay.address)])
        #expect(eventually { (try? relay.count("relay_ops")) ?? 0 > 0 })
        let cap = try RelayCapability(text: capability)
        let ids = (0..<3).map { _ in ChunkID(bytes: SpaceKey.randomBytes(32))! }
        // A capability holder outside the log is offered nothing and told nothing is held.
        let stranger = HostileMember(key: cap.key)
        try stranger.connect(port: relay.port, webSocket: "/v1/sync")
        try stranger.send(try PeerMessageBytes.offer(ids))
        try stranger.send(try PeerMessageBytes.want(ids))
        var (answered, missing) = (false, Set<ChunkID>())
        while !(answered && missing.count == ids.count), let message = try stranger.receive() {
            if message.first == 11 {
                #expect(message == [11, 0, 0], "a stranger's offer is taken")
                answered = true
            }
            if message.first == 13 {
                missing.formUnion(RelayChunkUploadTests.ids(message))
            }
        }
        #expect(answered)
        #expect(missing == Set(ids), "a stranger is told some chunks are held")
        // A chunk it was not asked for (however well formed) is refused, and nothing is stored.
        let sealed = SealedChunkLayout.magic + [0, 0, 0, 1] + SpaceKey.randomBytes(12 + SealedChunkLayout.padding + 16)
        try stranger.send([12] + ids[0].bytes + sealed)
        #expect(stranger.awaitClose().error == "bad_chunk")
        #expect(try relay.count("relay_chunks") == 0)
    }
}

/// Chunk messages as a hostile device writes them.
enum PeerMessageBytes {
    static func list(_ type: UInt8, _ ids: [ChunkID]) -> [UInt8] {
        var out: [UInt8] = [type, UInt8(ids.count >> 8), UInt8(ids.count & 0xFF)]
        for id in ids { out += id.bytes }
        return out
    }
    static func offer(_ ids: [ChunkID]) throws -> [UInt8] { list(14, ids) }
    static func want(_ ids: [ChunkID]) throws -> [UInt8] { list(11, ids) }
}
