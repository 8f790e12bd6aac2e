import BlazeClient
import BlazeStore
import Crypto
import Foundation
import GRDB
import NIOCore
import NIOPosix

/// Baselines measured in the same run as the workloads, so that ratios, not absolute times, are what we keep.
enum Baselines {
    static func rawDatabase(_ dir: String, _ name: String) throws -> DatabaseQueue {
        let queue = try DatabaseQueue(path: "\(dir)/\(name).sqlite")
        try queue.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA journal_mode = WAL")
            try db.execute(sql: "PRAGMA synchronous = FULL")
            try db.execute(
                sql: "CREATE TABLE t(rowid INTEGER PRIMARY KEY, collection TEXT, id TEXT, body TEXT, UNIQUE(collection, id))")
        }
        return queue
    }

    /// B_ins: the same JSON through a prepared INSERT, 1,000 rows per transaction.
    ///
    /// With `indexedFields`, B_ins.idx: the same table with the expression indexes a user index on those fields
    /// creates in a BlazeDB store, so that what remains between it and W1 is the CRDT bookkeeping alone.
    static func inserts(dir: String, n: Int, repeats: Int, texts: [String], indexedFields: [String] = []) throws -> Result {
        let rates = try (0..<repeats).map { r in
            try insertRate(dir: dir, name: "bins\(indexedFields.count)-\(r)", n: n, texts: texts, indexedFields: indexedFields)
        }
        if !indexedFields.isEmpty {
            return Result(
                name: "B_ins.idx", unit: "docs/s", samples: rates, better: "higher",
                note: "B_ins plus BlazeDB's index expressions on \(indexedFields.joined(separator: ", "))")
        }
        return Result(name: "B_ins", unit: "docs/s", samples: rates, better: "higher", note: "raw SQLite, 1,000 per tx")
    }

    /// The documents' ids, formatted before any timing starts (formatting is not part of an insert).
    static func ids(_ n: Int) -> [String] { (0..<n).map { String(format: "doc-%08d", $0) } }

    /// A raw table with the expression indexes BlazeDB builds for user indexes on `indexedFields`.
    static func indexedTable(_ dir: String, _ name: String, indexedFields: [String]) throws -> DatabaseQueue {
        let queue = try rawDatabase(dir, name)
        for (k, field) in indexedFields.enumerated() {
            let columns = QueryCompiler.indexColumns([try FieldPath(field)])
            try queue.write { db in try db.execute(sql: "CREATE INDEX t_\(k) ON t(\(columns)) WHERE collection = 'c'") }
        }
        return queue
    }

    /// One B_ins (or B_ins.idx) sample: documents per second.
    static func insertRate(dir: String, name: String, n: Int, texts: [String], indexedFields: [String]) throws -> Double {
        let queue = try indexedTable(dir, name, indexedFields: indexedFields)
        defer { try? queue.close() }
        let ids = ids(n)
        let t = try seconds {
            for chunk in stride(from: 0, to: n, by: 1000) {
                try queue.write { db in
                    let st = try db.cachedStatement(sql: "INSERT INTO t(collection, id, body) VALUES (?, ?, ?)")
                    for i in chunk..<min(chunk + 1000, n) {
                        try st.execute(arguments: ["c", ids[i], texts[i]])
                    }
                }
            }
        }
        return Double(n) / t
    }

    /// B_upd.idx: plain UPDATEs of whole documents by key in the indexed table of B_ins.idx, 1,000 rows per
    /// transaction: each row's text replaced by `updated` (the same JSON with one field changed, prepared beforehand).
    /// What a store without CRDT bookkeeping pays at least for W1.update's patches (which must also read the row).
    static func updates(
        dir: String, n: Int, repeats: Int, texts: [String], updated: [String], indexedFields: [String]
    ) throws -> Result {
        let rates = try (0..<repeats).map { r in
            try updateRate(dir: dir, name: "bupd-\(r)", n: n, texts: texts, updated: updated, indexedFields: indexedFields)
        }
        return Result(
            name: "B_upd.idx", unit: "docs/s", samples: rates, better: "higher",
            note: "plain UPDATE of the same JSON with one field changed, indexed as B_ins.idx")
    }

    /// One B_upd.idx sample: documents per second (the table is filled first, untimed).
    static func updateRate(
        dir: String, name: String, n: Int, texts: [String], updated: [String], indexedFields: [String]
    ) throws -> Double {
        let queue = try indexedTable(dir, name, indexedFields: indexedFields)
        defer { try? queue.close() }
        let ids = ids(n)
        try queue.write { db in
            let st = try db.cachedStatement(sql: "INSERT INTO t(collection, id, body) VALUES (?, ?, ?)")
            for i in 0..<n { try st.execute(arguments: ["c", ids[i], texts[i]]) }
        }
        let t = try seconds {
            for chunk in stride(from: 0, to: n, by: 1000) {
                try queue.write { db in
                    let st = try db.cachedStatement(sql: "UPDATE t SET body = ? WHERE collection = ? AND id = ?")
                    for i in chunk..<min(chunk + 1000, n) {
                        try st.execute(arguments: [updated[i], "c", ids[i]])
                    }
                }
            }
        }
        return Double(n) / t
    }

    /// B_auto: the same INSERT, one transaction (and one WAL fsync) per row.
    static func autocommit(dir: String, n: Int, repeats: Int, texts: [String]) throws -> Result {
        var rates: [Double] = []
        for r in 0..<repeats {
            let queue = try rawDatabase(dir, "bauto\(r)")
            let ids = ids(n)
            let t = try seconds {
                for i in 0..<n {
                    try queue.write { db in
                        try db.cachedStatement(sql: "INSERT INTO t(collection, id, body) VALUES (?, ?, ?)")
                            .execute(arguments: ["c", ids[i], texts[i]])
                    }
                }
            }
            rates.append(Double(n) / t)
        }
        return Result(name: "B_auto", unit: "docs/s", samples: rates, better: "higher", note: "raw SQLite, autocommit")
    }

    /// B_get: in-process point read through an expression index; per-read latency.
    static func pointReads(dir: String, n: Int, texts: [String]) throws -> Result {
        let queue = try rawDatabase(dir, "bget")
        try queue.write { db in
            let st = try db.cachedStatement(sql: "INSERT INTO t(collection, id, body) VALUES (?, ?, ?)")
            for i in 0..<n { try st.execute(arguments: ["c", String(format: "doc-%08d", i), texts[i]]) }
            try db.execute(sql: "CREATE INDEX t_email ON t(json_extract(body, '$.email'))")
        }
        var latencies: [Double] = []
        try queue.read { db in
            let st = try db.cachedStatement(sql: "SELECT body FROM t WHERE json_extract(body, '$.email') = ?")
            for i in 0..<n {
                let key = "user\((i * 7919) % n)@example.com"
                let s = DispatchTime.now().uptimeNanoseconds
                _ = try String.fetchOne(st, arguments: [key])
                latencies.append(Double(DispatchTime.now().uptimeNanoseconds - s) / 1000)
            }
        }
        return Result(name: "B_get", unit: "µs", samples: latencies, better: "lower", note: "in-process indexed point read")
    }

    /// B_echo: a SwiftNIO Unix-socket echo round trip of a 300-byte line, from a blocking client.
    static func echo(dir: String, n: Int) async throws -> Result {
        final class Echo: ChannelInboundHandler, Sendable {
            typealias InboundIn = ByteBuffer
            typealias OutboundOut = ByteBuffer
            func channelRead(context: ChannelHandlerContext, data: NIOAny) {
                context.writeAndFlush(data, promise: nil)
            }
        }
        let path = "\(dir)/echo.sock"
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(Echo()) }
            }
            .bind(unixDomainSocketPath: path).get()
        defer { server.close(promise: nil) }
        let line = Array(repeating: UInt8(ascii: "x"), count: 299) + [0x0A]
        let (latencies, _) = try onThreads(1, count: n, setup: { _ in try BlazeConnection(socketPath: path, timeoutSeconds: 30) }) {
            context, _ in
            let c = context as! BlazeConnection
            try c.send(line)
            _ = try c.readLine()
        }
        return Result(name: "B_echo", unit: "µs", samples: latencies, better: "lower", note: "NIO Unix socket, 300 B")
    }

    /// B_echo.async: the same echo served through NIOAsyncChannel and one Swift task per connection (how blazed served
    /// requests until the handler-based path), to show what that bridge costs.
    static func asyncEcho(dir: String, n: Int) async throws -> Result {
        let path = "\(dir)/echo-async.sock"
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(unixDomainSocketPath: path) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                }
            }
        let serving = Task {
            try await withThrowingDiscardingTaskGroup { group in
                try await server.executeThenClose { inbound in
                    for try await connection in inbound {
                        group.addTask {
                            try? await connection.executeThenClose { input, output in
                                for try await chunk in input { try await output.write(chunk) }
                            }
                        }
                    }
                }
            }
        }
        defer { serving.cancel() }
        let line = Array(repeating: UInt8(ascii: "x"), count: 299) + [0x0A]
        let (latencies, _) = try onThreads(1, count: n, setup: { _ in try BlazeConnection(socketPath: path, timeoutSeconds: 30) }) {
            context, _ in
            let c = context as! BlazeConnection
            try c.send(line)
            _ = try c.readLine()
        }
        return Result(name: "B_echo.async", unit: "µs", samples: latencies, better: "lower", baseline: "B_echo",
            note: "NIOAsyncChannel + task (blazed's former request path)")
    }

    /// B_crypto: ChaCha20-Poly1305 sealing of 4 KiB and Ed25519 signatures, per second.
    static func crypto(n: Int) throws -> [Result] {
        let key = SymmetricKey(size: .bits256)
        let payload = Data(repeating: 7, count: 4096)
        let aead = try seconds { for _ in 0..<n { _ = try ChaChaPoly.seal(payload, using: key) } }
        let signer = Curve25519.Signing.PrivateKey()
        let message = Data(repeating: 1, count: 64)
        var signature = Data()
        let sign = try seconds { for _ in 0..<n { signature = try signer.signature(for: message) } }
        let verify = seconds { for _ in 0..<n { _ = signer.publicKey.isValidSignature(signature, for: message) } }
        return [
            Result(name: "B_crypto.aead", unit: "MB/s", samples: [Double(n) * 4096 / aead / 1e6], better: "higher", note: "ChaChaPoly 4 KiB"),
            Result(name: "B_crypto.sign", unit: "ops/s", samples: [Double(n) / sign], better: "higher", note: "Ed25519 sign"),
            Result(name: "B_crypto.verify", unit: "ops/s", samples: [Double(n) / verify], better: "higher", note: "Ed25519 verify"),
        ]
    }
}
