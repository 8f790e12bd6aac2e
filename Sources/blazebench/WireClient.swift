// The PEERS workload's client: one blocking client for blazed's, PostgreSQL's and Redis's wire protocols, so the
// servers are measured through the same code path. The workload is in PeerWorkloads.swift.

import BlazeClient
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A blocking client of one of the three protocols over a Unix socket: sends a prebuilt request and reads exactly
/// one reply, failing on an error reply. The same code path for every server, so the figures compare the servers.
final class WireClient {
    enum Kind: Sendable { case blazed, postgres, redis }

    let kind: Kind
    private let fd: Int32
    private var buffer = [UInt8](repeating: 0, count: 1 << 16)
    private var start = 0
    private var end = 0

    init(_ kind: Kind, socket: String) throws {
        self.kind = kind
        fd = try BlazeConnection.connectUnix(socket, timeoutSeconds: 120)
        if kind == .postgres { try postgresStartup() }
    }

    deinit { close(fd) }

    /// Connects once the server at `socket` answers, within 60 s, while `process` runs.
    static func waitForServer(_ kind: Kind, socket: String, process: Process) throws -> WireClient {
        let deadline = Date().addingTimeInterval(60)
        while true {
            if let c = try? WireClient(kind, socket: socket) {
                try c.call(kind == .redis ? resp(["PING"]) : PeerWorkloads.line("daemon.info", "{}"))
                return c
            }
            guard Date() < deadline, process.isRunning else { throw ClientError("\(kind) did not start at \(socket)") }
            usleep(20_000)
        }
    }

    /// Sends `request` and reads its one reply.
    func call(_ request: [UInt8]) throws {
        try request.withUnsafeBytes { raw in
            var sent = 0
            while sent < raw.count {
                let n = write(fd, raw.baseAddress! + sent, raw.count - sent)
                guard n > 0 else { throw ClientError("write failed: \(String(cString: strerror(errno)))") }
                sent += n
            }
        }
        switch kind {
        case .blazed: try readLine()
        case .redis: try readRESP()
        case .postgres: try readUntilReady()
        }
    }

    private func fill() throws {
        if start == end {
            (start, end) = (0, 0)
        } else if end == buffer.count {
            if start > 0 {
                buffer.replaceSubrange(0..<(end - start), with: buffer[start..<end])
                (start, end) = (0, end - start)
            } else {
                buffer += [UInt8](repeating: 0, count: buffer.count)
            }
        }
        let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress! + end, $0.count - end) }
        guard n > 0 else { throw ClientError("read failed or connection closed (\(n))") }
        end += n
    }

    /// The index just past the next `\n` at or after `from`, reading more as needed.
    private func lineEnd(from: Int) throws -> Int {
        var i = from
        while true {
            while i < end {
                if buffer[i] == 0x0A { return i + 1 }
                i += 1
            }
            let offset = i - start
            try fill()
            i = start + offset
        }
    }

    private func need(_ count: Int) throws {
        while end - start < count { try fill() }
    }

    // blazed: one line; an error response starts `{"error"` (members are written in sorted order).
    private func readLine() throws {
        let stop = try lineEnd(from: start)
        let prefix = Array("{\"error\"".utf8)
        if stop - start >= prefix.count, Array(buffer[start..<(start + prefix.count)]) == prefix {
            throw ClientError("blazed: " + String(decoding: buffer[start..<stop], as: UTF8.self))
        }
        start = stop
    }

    // Redis: one RESP reply (simple string, error, integer or bulk string).
    private func readRESP() throws {
        let stop = try lineEnd(from: start)
        let type = buffer[start]
        let header = String(decoding: buffer[(start + 1)..<(stop - 2)], as: UTF8.self)
        start = stop
        switch type {
        case UInt8(ascii: "-"): throw ClientError("redis: " + header)
        case UInt8(ascii: "$"):
            guard let length = Int(header) else { throw ClientError("redis: bad bulk length \(header)") }
            if length >= 0 {
                try need(length + 2)
                start += length + 2
            }
        default: break
        }
    }

    // PostgreSQL: messages until ReadyForQuery; an ErrorResponse fails the call after it.
    private func readUntilReady() throws {
        var failure: String?
        while true {
            try need(5)
            let type = buffer[start]
            let length = Int(buffer[start + 1]) << 24 | Int(buffer[start + 2]) << 16 | Int(buffer[start + 3]) << 8 | Int(buffer[start + 4])
            try need(1 + length)
            if type == UInt8(ascii: "E") {
                failure = String(decoding: buffer[(start + 5)..<(start + 1 + length)].map { $0 == 0 ? 0x20 : $0 }, as: UTF8.self)
            }
            start += 1 + length
            if type == UInt8(ascii: "Z") { break }
        }
        if let failure { throw ClientError("postgres: " + failure) }
    }

    private func postgresStartup() throws {
        var body: [UInt8] = [0, 3, 0, 0]
        for s in ["user", "blaze", "database", "postgres"] { body += Array(s.utf8) + [0] }
        body.append(0)
        try call(Self.int32(body.count + 4) + body)
        for sql in Self.pgSchema { try call(Self.pgQuery(sql)) }
        for (name, sql) in Self.pgStatements {
            try call(Self.pgMessage("P", Array(name.utf8) + [0] + Array(sql.utf8) + [0, 0, 0]) + Self.pgMessage("S", []))
        }
    }

    static let pgSchema = [
        "CREATE TABLE IF NOT EXISTS docs (id text PRIMARY KEY, body jsonb NOT NULL)",
        "CREATE INDEX IF NOT EXISTS docs_email ON docs ((body->'email'))",
        "CREATE INDEX IF NOT EXISTS docs_age ON docs ((body->'age'))",
        // The `insert.plain` row's table: what an outside client's first table looks like, no secondary index.
        "CREATE TABLE IF NOT EXISTS plain (id text PRIMARY KEY, body jsonb NOT NULL)",
    ]

    static let pgStatements = [
        ("get", "SELECT body FROM docs WHERE id = $1"),
        ("one", "SELECT 1"),
        ("ins", "INSERT INTO docs(id, body) VALUES ($1, $2)"),
        ("insplain", "INSERT INTO plain(id, body) VALUES ($1, $2)"),
        ("find", "SELECT body FROM docs WHERE body->'age' = $1::jsonb LIMIT 10"),
    ]

    static func int32(_ v: Int) -> [UInt8] { [UInt8(v >> 24 & 0xFF), UInt8(v >> 16 & 0xFF), UInt8(v >> 8 & 0xFF), UInt8(v & 0xFF)] }

    static func pgMessage(_ type: Character, _ body: [UInt8]) -> [UInt8] {
        [type.asciiValue!] + int32(body.count + 4) + body
    }

    /// A simple-protocol query.
    static func pgQuery(_ sql: String) -> [UInt8] { pgMessage("Q", Array(sql.utf8) + [0]) }

    /// Bind, Execute and Sync of a prepared statement with text parameters.
    static func pgExecute(_ statement: String, _ params: [String]) -> [UInt8] {
        var bind: [UInt8] = [0] + Array(statement.utf8) + [0, 0, 0, 0, UInt8(params.count)]
        for p in params { bind += int32(p.utf8.count) + Array(p.utf8) }
        bind += [0, 0]
        return pgMessage("B", bind) + pgMessage("E", [0, 0, 0, 0, 0]) + pgMessage("S", [])
    }

    /// A RESP command.
    static func resp(_ args: [String]) -> [UInt8] {
        var s = "*\(args.count)\r\n"
        for a in args { s += "$\(a.utf8.count)\r\n\(a)\r\n" }
        return Array(s.utf8)
    }
}
