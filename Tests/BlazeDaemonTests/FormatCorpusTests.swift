import BlazeClient
import BlazeProtocol
import BlazeStore
import BlazeCrypto
import BlazeRelay
import BlazeTestSupport
import Crypto
import Foundation
import GRDB
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The compatibility corpus (`Tests/Fixtures/corpus/`): files earlier builds wrote — two devices' data directories
/// sharing a database (documents, nested fields, a deleted document, a conflict, an index, a blob, membership of two,
/// compaction done; vectors and a vector index from database format 16) and a local database, a relay's SQLite file, a shared folder and a backup — with what each held
/// (`expected.json`). Every later build must open them, read the same, and sync from them (README, "Upgrades and file
/// formats"). A new entry is made with `BLAZE_MAKE_CORPUS=DIR swift test --filter makeACorpusEntry`.
@Suite(.serialized) struct FormatCorpusTests {
    /// The corpus's root in the source tree.
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path + "/Fixtures/corpus"

    /// The corpus's entries (one directory per build that made one), oldest first.
    static var entries: [String] {
        ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? []).filter { !$0.hasPrefix(".") }.sorted()
    }

    @Test func daemonInfoNamesTheFormatsThisBuildWrites() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        // Each the constant its files carry (README, "Upgrades and file formats").
        #expect(try d.connect().call("daemon.info")["formats"] == [
            "database": .int(Int64(DatabaseFormat.current)), "keystore": .int(Int64(KeystoreFormat.current)),
            "folder": .int(Int64(FolderFiles.version)), "entry": .int(Int64(EntryHeader.newestVersion)), "protocol": .int(Int64(Handshake.protocols.upperBound)),
            "oldestProtocol": .int(Int64(Handshake.protocols.lowerBound)),
        ])
    }

    @Test func theCorpusHasAnEntry() {
        #expect(!Self.entries.isEmpty, "the corpus at \(Self.root) is empty")
    }

    @Test(arguments: entries) func aCorpusEntryOpensReadsTheSameAndSyncs(entry: String) throws {
        let source = Self.root + "/" + entry
        let expected = try JSONParser().parse(String(contentsOfFile: source + "/expected.json", encoding: .utf8))
        let work = TempDir()
        let relayDir = TempDir()
        for part in ["a", "b", "folder"] { try copyPrivately(source + "/" + part, to: work.path + "/" + part) }
        try copyPrivately(source + "/relay", to: relayDir.path + "/relay")

        // Each device reads what it held: documents, the conflict, history, members, the blob, the local database.
        let a = try DaemonProcess(arguments: ["--sync-listen", "127.0.0.1:0"], dir: TempDir(), dataDir: work.path + "/a")
        let b = try DaemonProcess(arguments: ["--sync-listen", "127.0.0.1:0"], dir: TempDir(), dataDir: work.path + "/b")
        defer {
            a.stop(expectErrors: true)
            b.stop(expectErrors: true)
        }
        let ca = try a.connect(), cb = try b.connect()
        for (name, c) in [("a", ca), ("b", cb)] {
            let held = try #require(expected[name])
            #expect(try Self.snapshot(c) == held, "device \(name) of corpus entry \(entry) reads differently")
        }
        let blob = try #require(expected["blob"])
        for c in [ca, cb] {
            #expect(try Self.blobDigest(c, id: try #require(blob["id"])) == blob["sha256"])
        }

        // Migrated by this build, the corpus's files have exactly the schema a new file of this build has: a format
        // changed by editing a shipped migration instead of adding one fails here.
        _ = try ca.call("db.create", ["db": "fresh"])
        for old in ["notes", "local", "default"] {
            #expect(
                try Self.schema(work.path + "/a/databases/\(old).db") == Self.schema(work.path + "/a/databases/fresh.db"),
                "database \(old) of corpus entry \(entry), migrated, differs from a new one")
        }
        #expect(try Self.schema(work.path + "/b/databases/notes.db") == Self.schema(work.path + "/a/databases/fresh.db"))

        // The backup restores to the state it was taken at.
        let restored = try ca.call("db.restore", ["path": .string(source + "/notes.backup"), "db": "restored"])
        #expect(restored["stateHash"] == expected["backup"]?["stateHash"])
        #expect(restored["documents"] == expected["backup"]?["documents"])

        // The devices sync from these files: directly, then through the relay's file, then through the folder.
        let node = { (c: BlazeConnection) throws -> String in try #require(try c.call("db.info", ["db": "notes"])["nodeId"]?.stringValue) }
        func converged(_ marker: String) throws -> Bool {
            try eventually(timeout: .seconds(60), interval: .milliseconds(100)) {
                let (sa, sb) = (try replicaState(ca, "notes"), try replicaState(cb, "notes"))
                func has(_ c: BlazeConnection, _ id: String) -> Bool {
                    (try? c.call("doc.get", ["db": "notes", "collection": "notes", "id": .string(id)])) != nil
                }
                return sa == sb && has(cb, marker) && has(ca, marker + "-b")
            }
        }
        func write(_ marker: String) throws {
            _ = try ca.call("doc.put", ["db": "notes", "collection": "notes", "id": .string(marker), "doc": ["by": .string(try node(ca))]])
            _ = try cb.call("doc.put", ["db": "notes", "collection": "notes", "id": .string(marker + "-b"), "doc": ["by": .string(try node(cb))]])
        }
        func dropPeers(_ c: BlazeConnection) throws {
            for peer in try c.call("peer.list", ["db": "notes"])["peers"]?.arrayValue ?? [] {
                _ = try c.call("peer.remove", ["db": "notes", "address": peer["address"] ?? .null])
            }
        }
        // The corpus devices keep no link of the maker's (it removed them): each transport below is the only one.
        for c in [ca, cb] {
            #expect(try c.call("peer.list", ["db": "notes"])["peers"]?.arrayValue?.isEmpty == true)
            #expect(try c.call("folder.list", ["db": "notes"])["folders"]?.arrayValue?.isEmpty == true)
        }
        _ = try cb.call("peer.add", ["db": "notes", "address": .string(try a.syncAddress())])
        try write("direct")
        #expect(try converged("direct"), "the corpus devices do not sync directly")
        #expect(try Self.received(cb, from: try a.syncAddress()) > 0, "nothing came over the direct link")
        try dropPeers(cb)

        let relay = try RelayProcess(dir: relayDir)
        defer { relay.stop(errorsExpected: true) }
        #expect(try relay.held().values.reduce(0, +) > 0, "the relay's file lost what it held")
        // Its file, migrated, has the schema of a new relay file of this build (as the databases above).
        let freshRelay = TempDir()
        _ = try RelayStore(path: freshRelay.path + "/relay.db")
        #expect(try Self.schema(relayDir.path + "/relay/relay.db") == Self.schema(freshRelay.path + "/relay.db"))
        for c in [ca, cb] { _ = try c.call("peer.add", ["db": "notes", "address": .string(relay.address)]) }
        try write("relayed")
        #expect(try converged("relayed"), "the corpus devices do not sync through the corpus relay")
        for c in [ca, cb] { #expect(try Self.received(c, from: relay.address) > 0, "nothing came through the relay") }
        for c in [ca, cb] { try dropPeers(c) }

        for c in [ca, cb] { _ = try c.call("folder.add", ["db": "notes", "path": .string(work.path + "/folder")]) }
        try write("foldered")
        #expect(try converged("foldered"), "the corpus devices do not sync through the corpus folder")
        for c in [ca, cb] { #expect(try Self.received(c, from: "folder:" + work.path + "/folder") > 0, "nothing came through the folder") }
    }

    /// Makes a corpus entry with this build into `BLAZE_MAKE_CORPUS` (run by hand when a format changes; the entry is
    /// then committed under `Tests/Fixtures/corpus/`).
    @Test(.enabled(if: ProcessInfo.processInfo.environment["BLAZE_MAKE_CORPUS"] != nil))
    func makeACorpusEntry() throws {
        let out = try #require(ProcessInfo.processInfo.environment["BLAZE_MAKE_CORPUS"])
        #expect(!FileManager.default.fileExists(atPath: out), "\(out) exists")
        let (dirA, dirB, folder) = (TempDir(), TempDir(), TempDir())
        let relay = try RelayProcess()
        let a = try syncDaemon(dir: dirA), b = try syncDaemon(dir: dirB)
        let ca = try a.connect(), cb = try b.connect()
        let target: [String: JSONValue] = ["db": "notes", "collection": "notes"]
        func putDoc(_ c: BlazeConnection, _ id: String, _ doc: JSONValue) throws {
            _ = try c.call("doc.put", target.merging(["id": .string(id), "doc": doc]) { $1 })
        }
        _ = try ca.call("db.create", ["db": "notes"])
        _ = try ca.call("index.create", ["db": "notes", "collection": "notes", "fields": ["title"]])
        try putDoc(ca, "n1", ["title": "first", "tags": ["a", "b"], "meta": ["pages": 3, "draft": true]])
        try putDoc(ca, "n2", ["title": "second", "score": 1.5])
        _ = try ca.call("doc.patch", target.merging(["id": "n2", "set": ["meta.pages": 7], "incr": ["views": 2]]) { $1 })
        // Vectors (database format 16): a vector index and two documents holding vectors.
        _ = try ca.call("index.create", ["db": "notes", "collection": "notes", "fields": ["emb"], "vector": ["dimensions": 3, "metric": "l2"]])
        _ = try ca.call("doc.patch", target.merging(["id": "n1", "set": ["emb": ["$vector": [1, 0, 0.5]]]]) { $1 })
        _ = try ca.call("doc.patch", target.merging(["id": "n2", "set": ["emb": ["$vector": [0, 1, -0.25]]]]) { $1 })
        try putDoc(ca, "n3", ["title": "gone soon"])
        _ = try ca.call("doc.delete", target.merging(["id": "n3"]) { $1 })
        // A blob of 300 kB (one chunk), referred to by a document.
        var generator = SeededRandom(seed: 20261127)
        let bytes = (0..<300_000).map { _ in UInt8(truncatingIfNeeded: generator.next()) }
        let file = dirA.path + "/photo.bin"
        #expect(FileManager.default.createFile(atPath: file, contents: Data(bytes)))
        let put = try ca.call("blob.put", ["db": "notes", "path": .string(file), "type": "image/jpeg"])
        try putDoc(ca, "photo", ["caption": "a photo", "image": try #require(put["ref"])])

        _ = try cb.call("db.join", ["token": .string(try ca.invite("notes")), "db": "notes"])
        _ = try cb.call("peer.add", ["db": "notes", "address": .string(try a.syncAddress())])
        #expect(try eventually { try replicaState(ca, "notes") == replicaState(cb, "notes") })
        // A conflict: both edit one field while apart.
        _ = try cb.call("sync.pause", ["db": "notes"])
        _ = try ca.call("doc.patch", target.merging(["id": "n1", "set": ["title": "from a"]]) { $1 })
        _ = try cb.call("doc.patch", target.merging(["id": "n1", "set": ["title": "from b"]]) { $1 })
        _ = try cb.call("sync.resume", ["db": "notes"])
        #expect(try eventually {
            try replicaState(ca, "notes") == replicaState(cb, "notes")
                && cb.call("conflict.list", ["db": "notes"])["conflicts"]?.arrayValue?.count == 1
        })
        // An entry of format 3 (entry format 3: a vector as bytes), once each device holds the other's statement.
        #expect(eventually { EntryFormatDaemonTests.entryFormat(ca, "notes") == 3 && EntryFormatDaemonTests.entryFormat(cb, "notes") == 3 })
        try putDoc(ca, "n5", ["title": "sealed with its vector as bytes", "emb": ["$vector": [0.5, 0.5, -0.5]]])
        #expect(try eventually { try replicaState(ca, "notes") == replicaState(cb, "notes") })
        // B holds the blob too.
        #expect(try Self.blobDigest(cb, id: try #require(put["blob"]?["id"])) == .string(hexString(Array(SHA256.hash(data: bytes)))))
        // Through the relay and the folder as well, so both hold what those transports leave.
        try relay.addSpace(try ca.relayCapability("notes"))
        for c in [ca, cb] {
            _ = try c.call("peer.add", ["db": "notes", "address": .string(relay.address)])
            _ = try c.call("folder.add", ["db": "notes", "path": .string(folder.path)])
        }
        try putDoc(ca, "n4", ["title": "after the relay"])
        #expect(try eventually { try replicaState(ca, "notes") == replicaState(cb, "notes") && relay.held().values.reduce(0, +) > 0 })
        #expect(eventually { filesUnder(folder.path).contains { $0.hasSuffix("/assets/" + (put["blob"]?["id"]?.stringValue ?? "-")) } })
        for c in [ca, cb] { _ = try c.call("db.compact", ["db": "notes"]) }
        _ = try ca.call("db.create", ["db": "local"])
        _ = try ca.call("doc.put", ["db": "local", "collection": "todo", "id": "t1", "doc": ["text": "only here", "done": false]])

        // The links go before the files are kept: a corpus device must not dial the maker's ports or folder.
        for c in [ca, cb] {
            for peer in try c.call("peer.list", ["db": "notes"])["peers"]?.arrayValue ?? [] {
                _ = try c.call("peer.remove", ["db": "notes", "address": peer["address"] ?? .null])
            }
            _ = try c.call("folder.remove", ["db": "notes", "path": .string(folder.path)])
        }
        try FileManager.default.createDirectory(atPath: out, withIntermediateDirectories: true)
        let backup = try ca.call("db.backup", ["db": "notes", "path": .string(out + "/notes.backup")])
        let expected: JSONValue = [
            "a": try Self.snapshot(ca), "b": try Self.snapshot(cb),
            "blob": ["id": try #require(put["blob"]?["id"]), "sha256": .string(hexString(Array(SHA256.hash(data: bytes))))],
            "backup": ["stateHash": try #require(backup["stateHash"]), "documents": try #require(backup["documents"])],
        ]
        a.stop()
        b.stop()
        relay.stop()
        try FileManager.default.copyItem(atPath: a.dataDir, toPath: out + "/a")
        try FileManager.default.copyItem(atPath: b.dataDir, toPath: out + "/b")
        try FileManager.default.copyItem(atPath: relay.dataDir, toPath: out + "/relay")
        try FileManager.default.copyItem(atPath: folder.path, toPath: out + "/folder")
        try (expected.jsonText + "\n").write(toFile: out + "/expected.json", atomically: true, encoding: .utf8)
    }

    /// What a device holds that a later build must read the same: every database's state hash and documents, the
    /// notes' conflicts, a document's history and the members.
    static func snapshot(_ c: BlazeConnection) throws -> JSONValue {
        func docs(_ db: String, _ collection: String) throws -> JSONValue {
            try c.call("query.find", ["db": .string(db), "collection": .string(collection), "sort": "_id", "limit": 1000])["docs"] ?? .null
        }
        let members = (try c.call("db.members", ["db": "notes"])["members"]?.arrayValue ?? []).map { m -> JSONValue in
            ["device": m["device"] ?? .null, "role": m["role"] ?? .null]
        }
        let history = try c.call("doc.history", ["db": "notes", "collection": "notes", "id": "n2"])["entries"]?.arrayValue ?? []
        var out: [String: JSONValue] = [
            "notes": [
                "stateHash": try c.call("db.info", ["db": "notes"])["stateHash"] ?? .null,
                "docs": try docs("notes", "notes"),
                "conflicts": try c.call("conflict.list", ["db": "notes"])["conflicts"] ?? .null,
                "history": .array(history.map { ["type": $0["type"] ?? .null, "change": $0["change"] ?? .null, "hlc": $0["hlc"] ?? .null] }),
                "members": .array(members.sorted { ($0["device"]?.stringValue ?? "") < ($1["device"]?.stringValue ?? "") }),
                "indexes": try c.call("index.list", ["db": "notes", "collection": "notes"])["indexes"] ?? .null,
            ]
        ]
        // Entries with a vector index (from database format 16): what the nearest search answers.
        let indexes = try c.call("index.list", ["db": "notes", "collection": "notes"])["indexes"]?.arrayValue ?? []
        if let vector = indexes.first(where: { $0["vector"] != nil }) {
            let r = try c.call("query.nearest", [
                "db": "notes", "collection": "notes", "field": vector["fields"]?.arrayValue?.first ?? .null, "vector": [1, 0.1, 0.4], "k": 2,
            ])
            // The ids and the index, not the distances: a later build may sum the products in another order.
            let ids = (r["results"]?.arrayValue ?? []).map { $0["doc"]?["_id"] ?? .null }
            if case .object(var notes)? = out["notes"] {
                notes["nearest"] = ["ids": .array(ids), "index": r["index"] ?? .null, "metric": r["metric"] ?? .null]
                out["notes"] = .object(notes)
            }
        }
        if (try c.call("db.list")["databases"]?.arrayValue ?? []).contains(where: { $0["name"] == "local" }) {
            out["local"] = ["stateHash": try c.call("db.info", ["db": "local"])["stateHash"] ?? .null, "docs": try docs("local", "todo")]
        }
        return .object(out)
    }

    /// The BlazeDB schema objects of the database file at `path` (type, name, SQL), without user indexes, vector
    /// indexes' triggers and SQLite's statistics.
    static func schema(_ path: String) throws -> [[String?]] {
        var config = GRDB.Configuration()
        config.readonly = true
        let queue = try DatabaseQueue(path: path, configuration: config)
        defer { try? queue.close() }
        return try queue.read { db in
            try Row.fetchAll(db, sql: "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'ux\\_%' ESCAPE '\\' AND name NOT LIKE 'vx\\_%' ESCAPE '\\' AND name NOT LIKE 'sqlite_stat%' ORDER BY name")
                .map { [$0["type"], $0["name"], $0["sql"]] }
        }
    }

    /// Entries the device behind `c` received from `peer` (its name in `sync.status`) for `notes`.
    static func received(_ c: BlazeConnection, from peer: String) throws -> Int64 {
        let peers = try c.call("sync.status", ["db": "notes"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue ?? []
        return peers.filter { $0["peer"]?.stringValue == peer }.reduce(0) { $0 + ($1["receivedEntries"]?.intValue ?? 0) }
    }

    /// SHA-256 (hex) of blob `id` of `notes` as the device behind `c` reads it.
    static func blobDigest(_ c: BlazeConnection, id: JSONValue) throws -> JSONValue {
        var hasher = SHA256()
        var offset: Int64 = 0
        while true {
            let part = try c.call("blob.read", ["db": "notes", "blob": id, "offset": .int(offset)])
            let data = try #require(part["data"]?.stringValue.flatMap { Data(base64Encoded: $0) })
            if data.isEmpty { break }
            hasher.update(data: data)
            offset += Int64(data.count)
            if offset >= part["size"]?.intValue ?? 0 { break }
        }
        return .string(hexString(Array(hasher.finalize())))
    }
}

/// Copies `source` to `target` with the modes a data directory needs (directories 0700, files 0600): git keeps only
/// the executable bit, and the daemon refuses key files others can read.
func copyPrivately(_ source: String, to target: String) throws {
    try FileManager.default.copyItem(atPath: source, toPath: target)
    chmod(target, 0o700)
    for name in (FileManager.default.enumerator(atPath: target)?.allObjects as? [String]) ?? [] {
        var isDir: ObjCBool = false
        let path = target + "/" + name
        _ = FileManager.default.fileExists(atPath: path, isDirectory: &isDir)
        chmod(path, isDir.boolValue ? 0o700 : 0o600)
    }
}
