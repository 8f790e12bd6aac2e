import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeTestSupport
import Foundation
import GRDB
import Synchronization
import Testing

@testable import BlazeDaemon

#if canImport(Glibc)
import Glibc
#endif

@Suite struct RPCSurface {
    @Test func everyMethodWorksOverTheSocketAndDataSurvivesRestart() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        let discovered = try c.call("rpc.discover")["methods"]?.arrayValue?.compactMap { $0["name"]?.stringValue } ?? []
        #expect(Set(discovered) == [
            "rpc.discover", "daemon.info", "db.create", "db.list", "db.info", "db.check", "db.drop", "collection.list", "collection.drop",
            "doc.insert", "doc.get", "doc.getMany", "doc.history", "doc.put", "doc.patch", "doc.delete", "tx.commit",
            "query.find", "query.nearest", "query.count", "query.explain", "query.aggregate", "query.update", "query.delete",
            "index.create", "index.drop", "index.list",
            "conflict.list", "conflict.resolve", "subscribe", "unsubscribe", "db.share", "db.join", "db.invite",
            "db.members", "db.revoke", "db.relayCapability", "peer.add",
            "peer.remove", "peer.list", "folder.add", "folder.remove", "folder.list", "sync.status", "sync.now", "sync.pause", "sync.resume", "daemon.config",
            "daemon.metrics", "db.backup", "db.restore", "db.compact",
            "blob.put", "blob.upload", "blob.append", "blob.finish", "blob.abort", "blob.read", "blob.get", "blob.stat",
            "blob.gc", "blob.pin", "blob.unpin", "blob.policy", "blob.list",
        ])
        #expect(try c.call("daemon.info")["socket"] == .string(d.socket))
        #expect(try c.call("daemon.info")["databases"] == 1)
        #expect(try c.call("db.create", ["db": "app"]) == ["db": "app"])
        #expect(try c.call("daemon.info")["databases"] == 2, "counted at once, though the last listing is recent")
        #expect(try c.call("db.list")["databases"]?.arrayValue?.map { "\($0["name"]?.stringValue ?? "") \(($0["sizeBytes"]?.intValue ?? 0) > 0)" } == ["app true", "default true"])
        let id = try c.call("doc.insert", ["db": "app", "collection": "todos", "doc": ["title": "milk", "n": 1.0]])["id"]
        #expect(id?.stringValue?.count == 36)
        #expect(try c.call("doc.put", ["db": "app", "collection": "todos", "id": "t2", "doc": ["title": "eggs", "n": 2]])
            == ["id": "t2", "created": true])
        _ = try c.call("doc.patch", ["db": "app", "collection": "todos", "id": "t2", "set": ["done": true], "unset": ["n"]])
        #expect(try c.call("doc.get", ["db": "app", "collection": "todos", "id": "t2"])["doc"]
            == ["_id": "t2", "title": "eggs", "done": true])
        let tx = try c.call("tx.commit", ["db": "app", "ops": [
            ["op": "insert", "collection": "todos", "doc": ["_id": "t3", "n": 3]],
            ["op": "delete", "collection": "todos", "id": "t3"],
            ["op": "put", "collection": "notes", "doc": ["_id": "n1", "text": "hi"]],
        ]])
        #expect(tx["results"]?.arrayValue?.count == 3)
        _ = try c.call("index.create", ["db": "app", "collection": "todos", "fields": ["title"]])
        #expect(try c.call("index.list", ["db": "app"])["indexes"]
            == [["name": "todos.title", "collection": "todos", "fields": ["title"]]])
        let found = try c.call("query.find", ["db": "app", "collection": "todos", "where": ["title": ["$prefix": "e"]],
            "fields": ["title"]])
        #expect(found == ["docs": [["_id": "t2", "title": "eggs"]], "cursor": .null])
        #expect(try c.call("query.count", ["db": "app", "collection": "todos"]) == ["count": 2])
        #expect(try c.call("query.explain", ["db": "app", "collection": "todos", "where": ["title": "eggs"]])["indexes"]
            == ["todos.title"])
        let page = try c.call("query.find", ["db": "app", "collection": "todos", "sort": "-title", "limit": 1])
        #expect(page["docs"]?.arrayValue?.first?["_id"] == id)
        let next = try c.call("query.find", ["db": "app", "collection": "todos", "sort": "-title", "limit": 1,
            "cursor": page["cursor"]!])
        #expect(next == ["docs": [["_id": "t2", "title": "eggs", "done": true]], "cursor": .null])
        #expect(try c.call("doc.getMany", ["db": "app", "collection": "todos", "ids": ["t2", "zz"], "fields": []])
            == ["docs": [["_id": "t2"], .null]])
        #expect(try c.call("collection.list", ["db": "app"])["collections"]
            == [["name": "notes", "count": 1], ["name": "todos", "count": 2]])
        #expect(try c.call("db.info", ["db": "app"])["documents"] == 3)
        _ = try c.call("doc.delete", ["db": "app", "collection": "notes", "id": "n1"])
        _ = try c.call("index.drop", ["db": "app", "name": "todos.title"])
        c.close()
        d.stop()

        let again = try DaemonProcess(dir: d.dir)
        let c2 = try again.connect()
        #expect(try c2.call("doc.get", ["db": "app", "collection": "todos", "id": "t2"])["doc"]
            == ["_id": "t2", "title": "eggs", "done": true])
        #expect(try c2.call("daemon.info")["databases"] == 2)
        #expect(try c2.call("db.drop", ["db": "app"]) == ["db": "app", "dropped": true])
        #expect(try c2.call("daemon.info")["databases"] == 1)
        expectRPCError(c2, "db.info", ["db": "app"], code: -32010, kind: "database_not_found")
        again.stop()
    }

    @Test func badInputIsAnsweredAndTheDaemonKeepsServing() throws {
        let d = try DaemonProcess(arguments: ["--max-batch", "3", "--max-depth", "8"])
        let raw = try d.connect()
        let other = try d.connect()
        let cases: [(String, [UInt8], Int, String)] = [
            ("malformed", Array("{\"jsonrpc\":".utf8), -32700, "parse_error"),
            ("invalid utf8", [0x7B, 0x22, 0xFF, 0x22, 0x3A, 0x31, 0x7D], -32700, "invalid_utf8"),
            ("scalar", Array("42".utf8), -32600, "invalid_request"),
            ("empty batch", Array("[]".utf8), -32600, "invalid_request"),
            ("batch over cap", Array(("[" + Array(repeating: #"{"jsonrpc":"2.0","id":1,"method":"db.list"}"#, count: 4)
                .joined(separator: ",") + "]").utf8), -32012, "batch_too_large"),
            ("too deep", Array((#"{"jsonrpc":"2.0","id":1,"method":"db.list","params":{"a":"# + String(repeating: "[", count: 9)
                + String(repeating: "]", count: 9) + "}}").utf8), -32700, "nesting_too_deep"),
            ("1e400", Array(#"{"jsonrpc":"2.0","id":1,"method":"db.info","params":{"db":1e400}}"#.utf8), -32700,
             "number_out_of_range"),
            ("huge int", Array(#"{"jsonrpc":"2.0","id":1,"method":"db.info","params":{"db":99999999999999999999}}"#.utf8),
             -32700, "number_out_of_range"),
        ]
        for (name, bytes, code, kind) in cases {
            try raw.send(bytes + [0x0A])
            let reply = try raw.readMessage()
            #expect(reply["error"]?["code"] == .int(Int64(code)), "\(name): \(reply.jsonText)")
            #expect(reply["error"]?["data"]?["kind"] == .string(kind), "\(name): \(reply.jsonText)")
            #expect(try other.call("db.list")["databases"] != nil, "other client must keep working after \(name)")
        }
        // A notification gets no reply; the next request's reply comes next.
        try raw.send(Array(#"{"jsonrpc":"2.0","method":"db.list"}"#.utf8) + [0x0A])
        #expect(try raw.call("db.list")["databases"] != nil)
        // A batch mixing good, bad and notifications answers each non-notification in order.
        try raw.send(Array(#"[{"jsonrpc":"2.0","id":"a","method":"db.list"},{"jsonrpc":"2.0","method":"db.list"},7]"#.utf8) + [0x0A])
        let batch = try raw.readMessage().arrayValue ?? []
        #expect(batch.count == 2 && batch[0]["id"] == "a" && batch[1]["error"]?["code"] == -32600)

        let c = other
        expectRPCError(c, "no.such", [:], code: -32601, kind: "method_not_found")
        expectRPCError(c, "doc.get", ["db": "default", "collection": "c"], code: -32602)
        expectRPCError(c, "doc.get", ["db": "default", "collection": "c", "id": 5], code: -32602)
        expectRPCError(c, "db.list", ["bogus": 1], code: -32602)
        expectRPCError(c, "doc.insert", ["db": "default", "collection": "c", "doc": [1]], code: -32602)
        expectRPCError(c, "doc.get", ["db": "nope", "collection": "c", "id": "x"], code: -32010, kind: "database_not_found")
        // A collection that does not exist (yet) holds no documents: not found, as any unknown id.
        expectRPCError(c, "doc.get", ["db": "default", "collection": "nope", "id": "x"], code: -32010,
            kind: "document_not_found")
        _ = try c.call("doc.insert", ["db": "default", "collection": "c", "doc": ["_id": "x"]])
        expectRPCError(c, "doc.get", ["db": "default", "collection": "c", "id": "y"], code: -32010, kind: "document_not_found")
        expectRPCError(c, "doc.insert", ["db": "default", "collection": "c", "doc": ["_id": "x"]], code: -32011,
            kind: "document_exists")
        expectRPCError(c, "db.create", ["db": "../etc"], code: -32602, kind: "invalid_name")
        expectRPCError(c, "db.create", ["db": "default"], code: -32011, kind: "database_exists")
        expectRPCError(c, "doc.insert", ["db": "default", "collection": "a/b", "doc": [:]], code: -32602, kind: "invalid_name")
        expectRPCError(c, "doc.insert", ["db": "default", "collection": "c", "doc": ["_secret": 1]], code: -32602,
            kind: "reserved_field")
        expectRPCError(c, "query.find", ["db": "default", "collection": "c", "where": ["a": ["$regex": "x"]]], code: -32602,
            kind: "invalid_filter")
        expectRPCError(c, "query.find", ["db": "default", "collection": "c", "limit": 0], code: -32012)
        expectRPCError(c, "query.find", ["db": "default", "collection": "c", "cursor": "nonsense"], code: -32602,
            kind: "invalid_cursor")
        expectRPCError(c, "tx.commit", ["db": "default", "ops": [["op": "insert", "collection": "c", "doc": ["_id": "z"]],
            ["op": "explode", "collection": "c"]]], code: -32602)
        expectRPCError(c, "tx.commit", ["db": "default", "ops": [["op": "insert", "collection": "c", "doc": ["_id": "z"]],
            ["op": "delete", "collection": "c", "id": "missing"]]], code: -32010, kind: "document_not_found")
        expectRPCError(c, "doc.get", ["db": "default", "collection": "c", "id": "z"], code: -32010)
        expectRPCError(c, "doc.insert", ["db": "default", "collection": "c",
            "doc": ["big": .string(String(repeating: "x", count: 2 << 20))]], code: -32012, kind: "document_too_large")
        expectRPCError(c, "index.drop", ["db": "default", "name": "nope"], code: -32010, kind: "index_not_found")
        d.stop()
    }

    @Test func oversizedLineClosesTheConnectionAndMemoryStaysBounded() throws {
        let d = try DaemonProcess(arguments: ["--max-line-bytes", "1048576"])
        let c = try d.connect()
        _ = try c.call("db.list")
        let before = d.rssKiB()
        let chunk = [UInt8](repeating: UInt8(ascii: "x"), count: 1 << 20)
        var sent = 0
        for _ in 0..<64 {
            do { try c.send(chunk) } catch { break }
            sent += 1
        }
        let reply = try c.readMessage()
        #expect(reply["error"]?["data"]?["kind"] == "line_too_long")
        #expect(try c.readLine() == nil, "connection must be closed after an oversized line")
        let growthMiB = (d.rssKiB() - before) / 1024
        #expect(growthMiB < 24, "daemon RSS grew by \(growthMiB) MiB after \(sent) MiB of oversized input")
        #expect(try d.connect().call("db.list")["databases"] != nil)
        d.stop()
    }

    @Test func connectionLimitHolds() throws {
        let d = try DaemonProcess(arguments: ["--max-connections", "2"])
        let a = try d.connect()
        let b = try d.connect()
        _ = try a.call("db.list")
        _ = try b.call("db.list")
        let third = try d.connect()
        let refusal = try third.readMessage()
        #expect(refusal["error"]?["data"]?["kind"] == "too_many_connections")
        #expect(try third.readLine() == nil)
        // A slot comes free once the daemon has seen a connection close: polled, bounded by a deadline.
        a.close()
        let deadline = Date().addingTimeInterval(30)
        var served = false
        while !served && Date() < deadline {
            served = (try? d.connect(timeout: 10).call("db.list"))?["databases"] != nil
            if !served { usleep(20_000) }
        }
        #expect(served, "no connection was served after one of the two closed")
        _ = try b.call("db.list")
        d.stop()
    }

    @Test func idleConnectionsAreClosed() throws {
        let d = try DaemonProcess(arguments: ["--idle-timeout", "1"])
        let idle = try d.connect()
        // The daemon closes a connection that sends nothing (the client's read timeout bounds the wait).
        #expect(try idle.readLine() == nil)
        // A connection that asks at once is served. On a loaded machine a second can pass between connecting and
        // the request arriving, and the daemon rightly closes that one: a few tries, each a fresh connection.
        var served = false
        for _ in 0..<5 where !served {
            served = (try? d.connect().call("db.list"))?["databases"] != nil
        }
        #expect(served)
        d.stop()
    }
}

@Suite struct Durability {
    @Test func killNineDuringInsertsLosesNoAcknowledgedWrite() throws {
        let dir = TempDir()
        var acknowledged: [String] = []
        var rng = SeededRandom(seed: testSeed("kill -9 timing"))
        for iteration in 0..<20 {
            let d = try DaemonProcess(dir: dir)
            let c = try d.connect()
            let target = Int.random(in: 20...200, using: &rng)
            var n = 0
            while n < target {
                let id = "i\(iteration)-\(n)"
                _ = try c.call("doc.insert", ["db": "default", "collection": "k", "doc": ["_id": .string(id), "n": .int(Int64(n))]])
                acknowledged.append(id)
                n += 1
            }
            // Requests in flight when the daemon dies: written, maybe applied, never acknowledged.
            for extra in 0..<5 {
                let req = RPCRequest(id: .int(Int64(1000 + extra)), method: "doc.insert",
                    params: ["db": "default", "collection": "k", "doc": ["_id": .string("u\(iteration)-\(extra)")]])
                try c.send(req.jsonValue.jsonBytes + [0x0A])
            }
            d.kill9()
            let check = try DatabaseQueue(path: d.dataDir + "/databases/default.db")
            let integrity = try check.read { try String.fetchAll($0, sql: "PRAGMA integrity_check") }
            #expect(integrity == ["ok"], "iteration \(iteration)")
            let stored = Set(try check.read { try String.fetchAll($0, sql: "SELECT id FROM docs WHERE collection = 'k'") })
            try check.close()
            let lost = acknowledged.filter { !stored.contains($0) }
            #expect(lost.isEmpty, "iteration \(iteration): lost \(lost.count) acknowledged inserts, e.g. \(lost.prefix(3))")
        }
        let d = try DaemonProcess(dir: dir)
        let count = try d.connect().call("query.count", ["db": "default", "collection": "k", "where": ["_id": ["$prefix": "i"]]])
        #expect(count == ["count": .int(Int64(acknowledged.count))])
        d.stop()
    }
}

extension Durability {
    /// Eight connections write at once, so their writes share group commits; one write in four is refused (an id
    /// already taken) inside those groups. The daemon is killed while they write. Every acknowledged write is there,
    /// every refused one failed alone, and each acknowledged write is its own change.
    @Test func killNineUnderEightConcurrentWritersLosesNoAcknowledgedWriteAndRefusalsFailAlone() throws {
        let dir = TempDir()
        var rng = SeededRandom(seed: testSeed("kill -9 under 8 writers"))
        var acknowledgedTotal = 0
        for iteration in 0..<5 {
            let d = try DaemonProcess(dir: dir)
            let setup = try d.connect()
            _ = try setup.call("doc.insert", ["db": "default", "collection": "k", "doc": ["_id": .string("taken-\(iteration)")]])
            let socket = d.socket
            let target = Int.random(in: 100...400, using: &rng)
            let acknowledged = Mutex<[String]>([])
            let refusals = Mutex<(ok: Int, wrong: [String])>((0, []))
            let reached = DispatchSemaphore(value: 0)
            let writers = DispatchGroup()
            let (connected, start) = (DispatchGroup(), DispatchSemaphore(value: 0))
            for w in 0..<8 {
                connected.enter()
                writers.enter()
                // Threads of their own: the writers block (on the gate, on the socket), and the global queue's few
                // threads in a full test run may be all taken, which left writers never starting.
                Thread {
                    defer { writers.leave() }
                    // All eight connect before any writes, so that all are writing when the daemon dies.
                    let c = try? BlazeConnection(socketPath: socket, timeoutSeconds: 60)
                    connected.leave()
                    start.wait()
                    guard let c else { return refusals.withLock { $0.wrong.append("writer \(w) could not connect") } }
                    for n in 0..<100_000 {
                        let id = "i\(iteration)-w\(w)-\(n)"
                        let refused = n % 4 == 3
                        let doc: JSONValue = refused ? ["_id": .string("taken-\(iteration)")] : ["_id": .string(id), "w": .int(Int64(w))]
                        do {
                            _ = try c.call("doc.insert", ["db": "default", "collection": "k", "doc": doc])
                            if refused {
                                refusals.withLock { $0.wrong.append("a taken id was accepted") }
                            } else if acknowledged.withLock({ $0.append(id); return $0.count }) == target {
                                reached.signal()
                            }
                        } catch let e as RPCError {
                            refusals.withLock { r in
                                if refused && e.kind == "document_exists" { r.ok += 1 } else { r.wrong.append("\(id): \(e.kind)") }
                            }
                        } catch {
                            return  // the daemon is gone
                        }
                    }
                }.start()
            }
            #expect(connected.wait(timeout: .now() + 60) == .success)
            for _ in 0..<8 { start.signal() }
            #expect(reached.wait(timeout: .now() + 120) == .success, "iteration \(iteration): writers did not reach \(target)")
            d.kill9()
            #expect(writers.wait(timeout: .now() + 60) == .success)
            #expect(refusals.withLock { $0.wrong }.isEmpty, "iteration \(iteration): \(refusals.withLock { $0.wrong.prefix(3) })")
            #expect(refusals.withLock { $0.ok } > 0)
            let check = try DatabaseQueue(path: d.dataDir + "/databases/default.db")
            let integrity = try check.read { try String.fetchAll($0, sql: "PRAGMA integrity_check") }
            #expect(integrity == ["ok"], "iteration \(iteration)")
            let stored = Set(try check.read { try String.fetchAll($0, sql: "SELECT id FROM docs WHERE collection = 'k'") })
            try check.close()
            let acked = acknowledged.withLock { $0 }
            let lost = acked.filter { !stored.contains($0) }
            #expect(lost.isEmpty, "iteration \(iteration): lost \(lost.count) acknowledged inserts, e.g. \(lost.prefix(3))")
            acknowledgedTotal += acked.count
        }
        // After a clean restart: one change per stored document of this device, numbered without gaps.
        let d = try DaemonProcess(dir: dir)
        let c = try d.connect()
        let stored = try c.call("query.count", ["db": "default", "collection": "k", "where": [:]])["count"]?.intValue ?? -1
        #expect(stored >= Int64(acknowledgedTotal + 5))
        d.stop()
        let check = try DatabaseQueue(path: d.dataDir + "/databases/default.db")
        let (changes, top) = try check.read { db in
            (try Int.fetchOne(db, sql: "SELECT count(*) FROM changes") ?? -1, try Int.fetchOne(db, sql: "SELECT max(seq) FROM versions") ?? -2)
        }
        try check.close()
        #expect(Int64(changes) == stored && changes == top, "changes \(changes), top \(top), documents \(stored)")
    }
}

@Suite struct ProtocolDocument {
    /// The generated method table (`RPCMethod`) and the document the daemon serves describe the same methods, in the
    /// same order, with the same summaries and parameter names; every method has a handler.
    @Test func generatedTableMatchesTheProtocolDocument() throws {
        let methods = Methods.discoverDocument["methods"]?.arrayValue ?? []
        #expect(methods.compactMap { $0["name"]?.stringValue } == RPCMethod.allCases.map(\.rawValue))
        for (m, method) in zip(methods, RPCMethod.allCases) {
            #expect(m["summary"]?.stringValue == method.summary, "\(method.rawValue)")
            let names = (m["params"]?.arrayValue ?? []).compactMap { $0["name"]?.stringValue }
            #expect(names == method.parameterNames, "\(method.rawValue)")
        }
        let table = MethodTable()
        #expect(RPCMethod.allCases.allSatisfy { table[$0.rawValue] != nil })
    }

    /// Parameters are checked by the generated types with the daemon's messages.
    @Test func generatedValidationMessages() throws {
        func message(_ body: () throws -> Void) -> String {
            do { try body() } catch let e as RPCError { return e.message } catch { return "\(error)" }
            return "accepted"
        }
        #expect(
            message { _ = try RPC.DocGet(validating: ["db": "d", "collection": "c"]) }
                == "missing required parameter \"id\" for doc.get")
        #expect(
            message { _ = try RPC.DocGet(validating: ["db": "d", "collection": "c", "id": 1]) }
                == "parameter \"id\" of doc.get must be string, got integer")
        #expect(
            message { _ = try RPC.DocGet(validating: ["db": "d", "collection": "c", "id": "x", "zz": 1, "aa": 2]) }
                == "unknown parameter \"aa\" for doc.get; accepted: db, collection, id, fields, at, atTime, vectors")
        #expect(
            message { _ = try RPC.DocGetMany(validating: ["db": "d", "collection": "c", "ids": ["a", 2]]) }
                == "ids[1] must be a string, got integer")
        #expect(
            message { _ = try RPC.QueryFind(validating: ["db": "d", "collection": "c", "sort": 3]) }
                == "parameter \"sort\" of query.find must be string or array, got integer")
        // Null stands for absent, except where any JSON value is accepted.
        let find = try RPC.QueryFind(validating: ["db": "d", "collection": "c", "limit": .null])
        #expect(find.limit == nil)
        let resolve = try RPC.ConflictResolve(validating: ["db": "d", "collection": "c", "id": "i", "field": "f", "value": .null])
        #expect(resolve.value == .null)
        let keep = try RPC.ConflictResolve(validating: ["db": "d", "collection": "c", "id": "i", "field": "f"])
        #expect(keep.value == nil)
        // Integers stay exact in number-typed maps (counter increments); the store judges the values (invalid_patch).
        let patch = try RPC.DocPatch(validating: ["db": "d", "collection": "c", "id": "i", "incr": ["n": .int(Int64.max)]])
        #expect(patch.incr?["n"] == .int(Int64.max))
        #expect(message { _ = try RPC.DocPatch(validating: ["db": "d", "collection": "c", "id": "i", "add": ["n": 1]]) }
            == "add.n must be an array, got integer")
        // The client side: params round-trip, results are read back from their JSON form.
        #expect(try RPC.DocGetMany(validating: RPC.DocGetMany(db: "d", collection: "c", ids: ["a"]).jsonObject).ids == ["a"])
        let result = RPC.DbInfo.Result(
            name: "d", path: "/p", collections: 1, documents: 2, sizeBytes: 3, nodeId: "n", stateHash: "h", versionVector: ["o": 4],
            bytesByTable: ["docs": 4096], lastCompaction: nil, blobs: .init(chunks: 5, bytes: 6))
        let decoded = try RPC.DbInfo.decode(RPC.DbInfo.encode(result))
        #expect(decoded.versionVector == ["o": 4] && decoded.lastCompaction == nil && decoded.blobs.bytes == 6)
        #expect(throws: RPCShapeError.self) { try RPC.DbInfo.decode(["name": "d"]) }
    }

    @Test func rpcDiscoverServesTheDocument() throws {
        let d = try DaemonProcess()
        let served = try d.connect().call("rpc.discover")
        #expect(served == Methods.discoverDocument)
        #expect(served["openrpc"] == "1.2.6")
        d.stop()
    }
}
