import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

/// The daemon's Prometheus metrics (`metrics-listen`, `daemon.metrics`): what they count and who may read them.
@Suite(.serialized) struct MetricsTests {
    /// The samples of an exposition text by series (`name{labels}`), without comments.
    static func samples(_ text: String) -> [String: Double] {
        Dictionary(
            text.split(separator: "\n").filter { !$0.hasPrefix("#") }.compactMap { line -> (String, Double)? in
                guard let space = line.lastIndex(of: " "), let v = Double(line[line.index(after: space)...]) else { return nil }
                return (String(line[..<space]), v)
            }, uniquingKeysWith: { a, _ in a })
    }

    /// The port a daemon's `metrics-listen` is bound to, from its "Listening" line.
    static func metricsPort(_ d: DaemonProcess) throws -> Int {
        let text = d.logText
        let start = try #require(text.range(of: "metrics.port=")).upperBound
        return try #require(Int(text[start...].prefix { $0.isNumber }))
    }

    @Test func requestsCommitsAndSyncAreCountedAndServedOnLoopbackOnly() throws {
        let a = try DaemonProcess(arguments: ["--sync-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        let b = try syncDaemon()
        let port = try Self.metricsPort(a)
        let ca = try a.connect(), cb = try b.connect()
        _ = try ca.call("db.create", ["db": "team"])
        _ = try cb.call("db.join", ["token": .string(try ca.invite("team")), "db": "team"])
        _ = try cb.call("peer.add", ["db": "team", "address": .string(try a.syncAddress())])
        for i in 0..<20 { _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": .string("d\(i)"), "doc": ["i": .int(Int64(i))]]) }
        _ = try ca.call("tx.commit", ["db": "team", "ops": [["op": "insert", "collection": "c", "doc": ["_id": "t1"]], ["op": "insert", "collection": "c", "doc": ["_id": "t2"]]]])
        expectRPCError(ca, "doc.get", ["db": "team", "collection": "c", "id": "missing"], code: RPCErrorCode.notFound, kind: "document_not_found")
        expectRPCError(ca, "no.such.method\"x", [:], code: RPCErrorCode.methodNotFound, kind: "method_not_found")
        #expect(try eventually { try replicaState(cb, "team").docs == 22 })
        _ = try ca.call("db.compact", ["db": "team"])

        // Scrapes carry the token the daemon keeps in its data directory, private to its user.
        let tokenPath = a.dataDir + "/metrics.token"
        let token = try String(contentsOfFile: tokenPath, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(token.count >= 43)
        #expect((try FileManager.default.attributesOfItem(atPath: tokenPath)[.posixPermissions] as? Int) == 0o600)
        let auth = "Authorization: Bearer \(token)\r\n"
        let scrape = try httpExchange(port: port, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n\(auth)\r\n")
        #expect(scrape.status == 200)
        let v = Self.samples(scrape.body)
        #expect(v[#"blazed_requests_total{method="doc.put",outcome="ok"}"#] == 20, "\(scrape.body)")
        #expect(v[#"blazed_requests_total{method="doc.get",outcome="document_not_found"}"#] == 1)
        #expect(v[#"blazed_requests_total{method="unknown",outcome="method_not_found"}"#] == 1, "an unknown name is not a label")
        #expect(!scrape.body.contains("no.such.method"))
        #expect(v[#"blazed_request_seconds_count{method="doc.put"}"#] == 20)
        #expect(v[#"blazed_request_seconds_count{method="tx.commit"}"#] == 1)
        // Group commits: every single-op write was in one; tx.commit and the others add local commits.
        #expect((v["blazed_write_group_size_count"] ?? 0) >= 1 && (v["blazed_write_group_size_sum"] ?? 0) >= 20)
        #expect((v["blazed_commit_seconds_count"] ?? 0) >= 21)
        #expect(v[#"blazed_group_commit_writes_total{db="team"}"#] == 20)
        #expect((v[#"blazed_database_file_bytes{db="team"}"#] ?? 0) > 4096)
        #expect((v["blazed_compactions_total"] ?? 0) >= 1)
        #expect(v["blazed_databases"] == 2, "default and team")
        // Sync: A served B's inbound link; what it sent is what B received.
        let inbound = #"db="team",peer="inbound",direction="inbound""#
        let syncLines = scrape.body.split(separator: "\n").filter { $0.hasPrefix("blazed_sync") }.joined(separator: "\n")
        #expect((v["blazed_sync_entries_sent_total{\(inbound)}"] ?? 0) >= 21, "\(syncLines)")
        #expect((v["blazed_sync_bytes_sent_total{\(inbound)}"] ?? 0) > 21 * 50)
        #expect(v["blazed_sync_connections{\(inbound)}"] == 1)
        #expect(v["blazed_sync_strangers_refused_total"] == 0)

        // The same text through the socket.
        let rpc = try ca.call("daemon.metrics")
        #expect(rpc["contentType"] == "text/plain; version=0.0.4")
        let viaRPC = Self.samples(try #require(rpc["text"]?.stringValue))
        #expect(viaRPC[#"blazed_requests_total{method="doc.put",outcome="ok"}"#] == 20)
        // A render is reused for a second: this request is counted in a later one.
        #expect(try eventually {
            Self.samples(try ca.call("daemon.metrics")["text"]?.stringValue ?? "")[#"blazed_requests_total{method="daemon.metrics",outcome="ok"}"#] ?? 0 >= 1
        })

        // Without the token (another user of the machine has no access to the file), nothing.
        let refused = try httpExchange(port: port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        #expect(refused.status == 401 && !refused.body.contains("blazed_"))
        #expect(try httpExchange(port: port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer \(token)x\r\n\r\n").status == 401)
        #expect(try httpExchange(port: port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAuthorization: \(token)\r\n\r\n").status == 401)

        // A page elsewhere reaching 127.0.0.1 through its own DNS name is refused; so is anything but GET /metrics.
        #expect(try httpExchange(port: port, "GET /metrics HTTP/1.1\r\nHost: evil.example:\(port)\r\n\(auth)\r\n").status == 403)
        #expect(try httpExchange(port: port, "GET /metrics HTTP/1.1\r\n\(auth)\r\n").status == 403)
        for host in ["localhost", "[::1]:\(port)", "127.0.0.1:\(port)", "LOCALHOST:\(port)"] {
            #expect(try httpExchange(port: port, "GET /metrics HTTP/1.1\r\nHost: \(host)\r\n\(auth)\r\n").status == 200, "\(host)")
        }
        for host in ["127.+0.0.1", "[::1]junk", "localhost:", "localhost:abc", "127.0.0.1.evil.example", "127.1"] {
            #expect(try httpExchange(port: port, "GET /metrics HTTP/1.1\r\nHost: \(host)\r\n\(auth)\r\n").status == 403, "\(host)")
        }
        #expect(try httpExchange(port: port, "GET / HTTP/1.1\r\nHost: localhost\r\n\(auth)\r\n").status == 404)
        #expect(try httpExchange(port: port, "POST /metrics HTTP/1.1\r\nHost: localhost\r\n\(auth)Content-Length: 0\r\n\r\n").status == 405)
        #expect(try httpExchange(port: port, "HEAD /metrics HTTP/1.1\r\nHost: localhost\r\n\(auth)\r\n").status == 405)
        #expect(try httpExchange(port: port, "NOT HTTP AT ALL\r\n\r\n").status != 200)

        // A link closed is counted as closed; a database dropped is no longer a series.
        _ = try cb.call("peer.remove", ["db": "team", "address": .string(try a.syncAddress())])
        let gone = try eventually {
            let text = try httpExchange(port: port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\(auth)\r\n").body
            return Self.samples(text)["blazed_sync_connections{\(inbound)}"] == 0
        }
        #expect(gone)
        let scrapeNow = { Self.samples(try httpExchange(port: port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\(auth)\r\n").body) }
        _ = try ca.call("db.create", ["db": "scratch"])
        #expect(try eventually { try scrapeNow()[#"blazed_database_file_bytes{db="scratch"}"#] != nil })
        _ = try ca.call("db.drop", ["db": "scratch"])
        #expect(try eventually { try scrapeNow()[#"blazed_database_file_bytes{db="scratch"}"#] == nil })
        a.stop()
        b.stop()
    }

    @Test func aMetricsAddressThatIsNotLoopbackIsRefusedAtStart() throws {
        let dir = TempDir()
        let out = try run(
            buildDirectory + "/blazed",
            ["--socket", dir.path + "/s.sock", "--data-dir", dir.path + "/data", "--metrics-listen", "0.0.0.0:9464"],
            environment: isolatedEnvironment(config: dir.path + "/config"))
        #expect(out.status != 0)
        #expect(out.err.contains("metrics-listen") && out.err.contains("loopback"), "\(out.err)")
    }
}
