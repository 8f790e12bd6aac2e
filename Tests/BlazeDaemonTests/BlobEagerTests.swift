import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

/// Blobs fetched before they are read: those of the documents of a device's eager collections, up to its size bound,
/// and those it pins; with their progress reported to subscriptions that ask for it, and resumed after a restart.
@Suite(.serialized) struct BlobEagerTests {
    typealias Pair = BlobSyncTests.Pair

    /// Puts `bytes` as a blob on `c` (not referenced yet); returns its reference, id and chunk count.
    func blob(_ bytes: [UInt8], on c: BlazeConnection, dir: String, name: String) throws -> (ref: JSONValue, id: String, chunks: Int) {
        let file = dir + "/\(name).bin"
        #expect(FileManager.default.createFile(atPath: file, contents: Data(bytes)))
        let put = try c.call("blob.put", ["db": "notes", "path": .string(file), "type": "image/jpeg"])
        return (put["ref"]!, try #require(put["blob"]?["id"]?.stringValue), try #require(put["chunks"]?.intValue.map { Int($0) }))
    }

    /// `blob.stat`'s held chunks of `id` on `c`.
    func held(_ c: BlazeConnection, _ id: String) throws -> Int {
        Int(try c.call("blob.stat", ["db": "notes", "blob": .string(id)])["heldChunks"]?.intValue ?? -1)
    }

    /// Reads `c`'s notifications until blob `id`'s fetch ends; returns its progress events in order.
    func progress(of id: String, on c: BlazeConnection) throws -> [RPCSchema.BlobProgress] {
        var events: [RPCSchema.BlobProgress] = []
        for _ in 0..<10_000 {
            let n = try c.nextNotification(RPCNotification.Subscription.self)
            #expect(n.events == nil, "a subscription of another collection got document events")
            events += (n.blobs ?? []).filter { $0.blob == id }
            if let last = events.last, last.state != .fetching { return events }
        }
        Issue.record("blob \(id)'s fetch never ended")
        return events
    }

    @Test func eagerCollectionsHaveTheirBlobsFetchedAsDocumentsArriveUpToTheSizeBound() throws {
        let (pair, _) = try Pair.make(bDials: false)
        defer { pair.stop() }
        let policy = try pair.cb.call("blob.policy", ["db": "notes", "eager": ["photos", "photos"], "maxBytes": 4_000_000])
        #expect(policy == ["eager": ["photos"], "maxBytes": 4_000_000])
        #expect(try pair.cb.call("blob.policy", ["db": "notes"]) == policy)
        // Progress only: a collection no document is in.
        let watcher = try pair.b.connect()
        _ = try watcher.call("subscribe", ["db": "notes", "collection": "none", "blobs": true])

        let dir = pair.a.dir.path
        let big = try blob(BlobDaemonTests().content(6_000_000, seed: 1), on: pair.ca, dir: dir, name: "big")
        let small = try blob(BlobDaemonTests().content(3_000_000, seed: 2), on: pair.ca, dir: dir, name: "small")
        let other = try blob(BlobDaemonTests().content(1_000_000, seed: 3), on: pair.ca, dir: dir, name: "other")
        // One transaction: B queues them in this order, so once `small` is held `big` was looked at.
        _ = try pair.ca.call("tx.commit", ["db": "notes", "ops": [
            ["op": "put", "collection": "photos", "id": "big", "doc": ["file": big.ref]],
            ["op": "put", "collection": "photos", "id": "small", "doc": ["file": small.ref]],
            ["op": "put", "collection": "files", "id": "other", "doc": ["file": other.ref]],
        ]])
        let events = try progress(of: small.id, on: watcher)
        #expect(events.last?.state == .held && events.last?.heldChunks == small.chunks && events.last?.size == 3_000_000)
        #expect(try held(pair.cb, small.id) == small.chunks)
        // Over the bound (its manifest says so), and not in an eager collection: neither fetched.
        #expect(try held(pair.cb, big.id) == 0)
        #expect(try held(pair.cb, other.id) == 0)

        // A pin fetches any blob, and is listed.
        #expect(try pair.cb.call("blob.pin", ["db": "notes", "blob": .string(other.id)]) == ["blob": .string(other.id), "pinned": true, "already": false])
        #expect(try progress(of: other.id, on: watcher).last?.state == .held)
        #expect(try held(pair.cb, other.id) == other.chunks)
        let list = try pair.cb.call("blob.list", ["db": "notes"])
        let rows = Dictionary(uniqueKeysWithValues: (list["blobs"]?.arrayValue ?? []).map { ($0["id"]?.stringValue ?? "", $0) })
        #expect(rows.count == 3 && list["next"] == .null)
        #expect(rows[other.id]?["pinned"] == true && rows[other.id]?["heldBytes"] == 1_000_000 && rows[other.id]?["references"] == 1)
        #expect(rows[small.id]?["pinned"] == false && rows[small.id]?["heldChunks"] == .int(Int64(small.chunks)))
        #expect(rows[big.id]?["heldChunks"] == 0 && rows[big.id]?["type"] == "image/jpeg")
        // Pages by id.
        let first = try pair.cb.call("blob.list", ["db": "notes", "limit": 2])
        let rest = try pair.cb.call("blob.list", ["db": "notes", "after": try #require(first["next"])])
        #expect(((first["blobs"]?.arrayValue ?? []) + (rest["blobs"]?.arrayValue ?? [])).compactMap { $0["id"]?.stringValue } == rows.keys.sorted())
        #expect(try pair.cb.call("blob.unpin", ["db": "notes", "blob": .string(other.id)]) == ["blob": .string(other.id), "pinned": false, "was": true])
        #expect(try pair.cb.call("blob.unpin", ["db": "notes", "blob": .string(other.id)])["was"] == false)

        // Turned off: a new document's blob is not fetched (the reference is what arrives).
        _ = try pair.cb.call("blob.policy", ["db": "notes", "eager": []])
        let later = try blob(BlobDaemonTests().content(500_000, seed: 4), on: pair.ca, dir: dir, name: "later")
        _ = try pair.ca.call("doc.put", ["db": "notes", "collection": "photos", "id": "later", "doc": ["file": later.ref]])
        #expect(eventually(timeout: .seconds(30)) {
            (try? pair.cb.call("doc.get", ["db": "notes", "collection": "photos", "id": "later"])) != nil
        })
        #expect(try held(pair.cb, later.id) == 0)
    }

    /// A large eager blob reports progress window by window; a kill -9 (or a clean stop) of the fetching device in
    /// the middle is resumed at its start, from the chunks it stored, without a read asking.
    @Test(arguments: [true, false])
    func anEagerFetchCutByARestartGoesOnFromWhereItWas(kill9: Bool) throws {
        // A dials B through a proxy that stalls after 60 MiB, so the restart always cuts the fetch in the middle (a
        // fast machine, or a watcher slow to read its progress, would otherwise see it finish first). 96 MiB is about
        // 70 chunks (the cuts depend on the space's key), so the first window of 32 (about 45 MiB) always arrives and
        // the whole never does.
        let (pair, proxyOrNil) = try Pair.make(bDials: false) { try LinkProxy(targetPort: $0.port) }
        let proxy = try #require(proxyOrNil)
        defer {
            proxy.shutdown()
            pair.stop()
        }
        _ = try pair.cb.call("blob.policy", ["db": "notes", "eager": ["*"]])
        let watcher = try pair.b.connect()
        _ = try watcher.call("subscribe", ["db": "notes", "collection": "none", "blobs": true])
        let bytes = BlobDaemonTests().content(96 << 20, seed: 5)
        let large = try blob(bytes, on: pair.ca, dir: pair.a.dir.path, name: "large")
        proxy.stall(after: 60 << 20)
        _ = try pair.ca.call("doc.put", ["db": "notes", "collection": "photos", "id": "large", "doc": ["file": large.ref]])
        // The first window's progress: some chunks held, not all.
        var first: RPCSchema.BlobProgress?
        for _ in 0..<10_000 where first == nil {
            first = (try watcher.nextNotification(RPCNotification.Subscription.self).blobs ?? []).first { $0.blob == large.id }
        }
        #expect(first?.state == .fetching)
        #expect((first?.heldChunks ?? 0) > 0 && (first?.heldChunks ?? .max) < large.chunks && first?.chunks == large.chunks)

        try pair.b.restart(kill9: kill9)
        let cb = try pair.b.connect()
        #expect(try held(cb, large.id) < large.chunks, "the fetch finished before the restart")
        try proxy.set(.open)
        #expect(eventually(timeout: .seconds(120)) { (try? held(cb, large.id)) == large.chunks }, "the fetch did not go on")
        // Fewer chunks came after the restart than the blob has: it went on, not over.
        let received = try cb.call("sync.status", ["db": "notes"])["databases"]?.arrayValue?.first?["peers"]?.arrayValue?
            .compactMap { $0["chunksReceived"]?.intValue }.reduce(0, +) ?? 0
        #expect(received > 0 && received < Int64(large.chunks), "\(received) of \(large.chunks) chunks fetched after the restart")
        let out = pair.b.dir.path + "/large.out"
        _ = try cb.call("blob.get", ["db": "notes", "blob": .string(large.id), "path": .string(out)])
        #expect((try? Data(contentsOf: URL(fileURLWithPath: out))) == Data(bytes))
    }

    /// A pin made while no device holding the blob is connected is tried again until one is.
    @Test func aPinWaitsForADeviceThatHoldsTheBlob() throws {
        let (pair, _) = try Pair.make(bDials: false)
        defer { pair.stop() }
        let other = try blob(BlobDaemonTests().content(2_000_000, seed: 6), on: pair.ca, dir: pair.a.dir.path, name: "other")
        pair.a.stop(kill9: false)
        #expect(try pair.cb.call("blob.pin", ["db": "notes", "blob": .string(other.id)])["already"] == false)
        #expect(try pair.cb.call("blob.pin", ["db": "notes", "blob": .string(other.id)])["already"] == true)
        try pair.a.start()
        #expect(eventually(timeout: .seconds(90)) { (try? held(pair.cb, other.id)) == other.chunks }, "the pin was never fetched")
    }

    /// A member's documents may name any number of blobs nobody holds: they fail and wait, and a real blob named
    /// after them still comes.
    @Test func referencesToBlobsNobodyHoldsDoNotHoldUpTheOthers() throws {
        let (pair, _) = try Pair.make(bDials: false)
        defer { pair.stop() }
        _ = try pair.cb.call("blob.policy", ["db": "notes", "eager": ["photos"]])
        let fakes: [JSONValue] = (0..<2_000).map { _ in
            ["$blob": ["id": .string((0..<32).map { _ in String(format: "%02x", UInt8.random(in: 0...255)) }.joined()), "size": 10]]
        }
        _ = try pair.ca.call("doc.put", ["db": "notes", "collection": "photos", "id": "fakes", "doc": ["files": .array(fakes)]])
        let real = try blob(BlobDaemonTests().content(1_500_000, seed: 8), on: pair.ca, dir: pair.a.dir.path, name: "real")
        _ = try pair.ca.call("doc.put", ["db": "notes", "collection": "photos", "id": "real", "doc": ["file": real.ref]])
        #expect(eventually(timeout: .seconds(120)) { (try? held(pair.cb, real.id)) == real.chunks }, "the real blob never came")
        // B answers throughout.
        #expect(try pair.cb.call("blob.list", ["db": "notes", "limit": 1])["next"] != .null)
    }

    /// A fetch whose manifest no device has reports its failure to subscribers.
    @Test func aPinNobodyCanServeIsReportedFailed() throws {
        let d = try DaemonProcess()
        defer { d.stop() }
        let c = try d.connect()
        let watcher = try d.connect()
        _ = try watcher.call("subscribe", ["db": "default", "blobs": true])
        let id = String(repeating: "ab", count: 32)
        _ = try c.call("blob.pin", ["db": "default", "blob": .string(id)])
        let events = try progress(of: id, on: watcher)
        #expect(events.count == 1 && events.last?.state == .failed && events.last?.error?.kind == "blob_not_found" && events.last?.chunks == 0)
    }

    @Test func badPolicyAndPinRequestsAreRefusedAndAPolicySurvivesARestart() throws {
        let dir = TempDir()
        var d = try DaemonProcess(dir: dir)
        defer { d.stop() }
        var c = try d.connect()
        func kind(_ params: [String: JSONValue], _ method: String) -> String? {
            do {
                _ = try c.call(method, params)
                return nil
            } catch let error as RPCError {
                return error.kind
            } catch {
                return "\(error)"
            }
        }
        #expect(kind(["db": "default", "eager": ["bad name!"]], "blob.policy") == "invalid_name")
        #expect(kind(["db": "default", "eager": .array((0...256).map { .string("c\($0)") })], "blob.policy") == "too_large")
        #expect(kind(["db": "default", "maxBytes": -1], "blob.policy") == "invalid_argument")
        #expect(kind(["db": "default", "eager": "photos"], "blob.policy") == "invalid_params")
        #expect(kind(["db": "nope", "eager": []], "blob.policy") == "database_not_found")
        #expect(kind(["db": "default", "blob": "xyz"], "blob.pin") == "invalid_blob")
        #expect(kind(["db": "default"], "blob.unpin") == "invalid_params")
        #expect(kind(["db": "nope", "blob": .string(String(repeating: "a", count: 64))], "blob.pin") == "database_not_found")
        #expect(kind(["db": "default", "limit": 0], "blob.list") == "invalid_argument")
        #expect(kind(["db": "default", "after": "12"], "blob.list") == "invalid_blob")
        #expect(kind(["db": "default", "blobs": "yes"], "subscribe") == "invalid_params")
        #expect(try c.call("blob.list", ["db": "default"]) == ["blobs": [], "next": .null])
        // The policy survives a restart.
        _ = try c.call("blob.policy", ["db": "default", "eager": ["*"], "maxBytes": 10])
        d.stop()
        d = try DaemonProcess(dir: dir)
        c = try d.connect()
        #expect(try c.call("blob.policy", ["db": "default"]) == ["eager": ["*"], "maxBytes": 10])
    }
}
