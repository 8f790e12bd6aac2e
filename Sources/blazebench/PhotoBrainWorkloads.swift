import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeTestSupport
import BlazeSync
import BlazeVector
import Foundation

/// V8: the PhotoBrain shape synced to a new device: `count` photo records, each a 768-d float32 embedding and about
/// 500 bytes of metadata, written one record per change on A, then B joins over loopback TCP and receives them all.
/// Bytes on the wire (every frame B read after the handshake) against the raw float32 bytes plus the metadata's JSON,
/// and the time against the same records without their embeddings, in the same run.
enum PhotoBrainWorkloads {
    /// Record `i`'s metadata: about 500 bytes of JSON, as a photo library keeps per photo.
    static func metadata(_ i: Int) -> [String: JSONValue] {
        [
            "path": .string("/photos/2026/\(String(format: "%02d", i % 12 + 1))/IMG_\(String(format: "%06d", i)).HEIC"),
            "taken": .int(1_764_000_000_000 + Int64(i) * 61_000), "width": 4032, "height": 3024, "bytes": .int(2_400_000 + Int64(i % 997) * 1_013),
            "camera": "iPhone 16 Pro", "lens": "main 24 mm f/1.78", "iso": .int(Int64(50 + i % 800)), "exposure": "1/120",
            "place": ["lat": .double(52.52 + Double(i % 100) / 1000), "lon": .double(13.405 + Double(i % 77) / 1000), "name": "Berlin, Mitte"],
            "caption": .string("a photo of the city at dusk, number \(i), with people walking by the river"),
            "tags": ["city", "dusk", "river", .string("album-\(i % 40)")], "favorite": .bool(i % 9 == 0), "faces": .int(Int64(i % 4)),
        ]
    }

    static func run(dir: String, count: Int, dimensions d: Int) async throws -> [Result] {
        var rng = SeededRandom(seed: 2026)
        let embeddings = (0..<count).map { _ in VectorValue.encode((0..<d).map { _ in Float(rng.next() >> 40) / Float(1 << 24) * 2 - 1 }) }
        let withVectors = try await sync(dir: dir + "/v8-vectors", count: count) { i in
            metadata(i).merging(["embedding": ["$vector": .string(embeddings[i])]]) { $1 }
        }
        let docsOnly = try await sync(dir: dir + "/v8-docs", count: count) { metadata($0) }
        let metaBytes = (0..<count).reduce(0) { $0 + JSONValue.object(metadata($1)).jsonText.utf8.count }
        let raw = count * d * 4 + metaBytes
        let wire = Double(withVectors.wire) / Double(raw)
        return [
            Result(
                name: "V8.photoBrain.wire", unit: "× raw", samples: [wire], better: "lower", target: "≤ 1.2×",
                note: String(
                    format: "%d records: %.1f MB received (entry format %d) for %.1f MB of float32 and metadata JSON; the same records without embeddings: %.1f MB",
                    count, Double(withVectors.wire) / 1e6, withVectors.format, Double(raw) / 1e6, Double(docsOnly.wire) / 1e6)),
            Result(
                name: "V8.photoBrain.sync", unit: "s", samples: [withVectors.seconds], better: "lower",
                note: String(
                    format: "initial sync of %d records with %d-d embeddings: %.2f s, %.2f× the same records without them (%.2f s)",
                    count, d, withVectors.seconds, withVectors.seconds / docsOnly.seconds, docsOnly.seconds)),
        ]
    }

    /// Writes `count` records (`record(i)`, one per change) on a new daemon A, seals them, then times a new daemon B
    /// joining and receiving them all; returns the time, the bytes B read and the entry format A sealed in.
    static func sync(dir: String, count: Int, record: (Int) -> [String: JSONValue]) async throws -> (seconds: Double, wire: Int, format: Int) {
        let a = try await Workloads.LocalDaemon(dir: dir + "/a", syncListen: "127.0.0.1:0")
        let b = try await Workloads.LocalDaemon(dir: dir + "/b")
        defer {
            Task {
                await b.stop()
                await a.stop()
                try? FileManager.default.removeItem(atPath: dir)
            }
        }
        let source = try a.daemon.store.create("photos")
        // One change per record, as a library that adds photos as they come writes them.
        for i in 0..<count { _ = try source.apply(.insert(collection: "photos", doc: record(i).merging(["_id": .string("p\(i)")]) { $1 })) }
        let token = try invite(a, source)
        let key = try require(try a.daemon.sync.spaceKey(db: source), "space key")
        let membership = try require(try a.daemon.sync.space(db: source)?.snapshot.membership, "membership log")
        try source.sealLocal(key: key, identity: a.daemon.identity, membership: membership)
        let format = Int(try source.sealingFormat(membership: membership))
        let origin = source.node
        let want = try source.versionVector()[origin]
        var joined: BlazeDatabase?
        let time = try seconds {
            let target = try b.daemon.sync.join(token: token, name: "photos")
            joined = target
            let deadline = Date().addingTimeInterval(600)
            while try target.versionVector()[origin] < want {
                guard Date() < deadline else { throw ClientError("V8: initial sync did not finish in 600 s") }
                usleep(2000)
            }
        }
        let target = try require(joined, "joined database")
        guard try target.summary().documents == count else { throw ClientError("V8: B holds another number of records") }
        return (time, b.daemon.sync.status(db: target).reduce(0) { $0 + $1.receivedBytes }, format)
    }
}
