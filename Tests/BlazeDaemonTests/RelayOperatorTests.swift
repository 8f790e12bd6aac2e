import BlazeClient
import BlazeCrypto
import BlazeProtocol
import BlazeSettings
import BlazeTestSupport
import Foundation
import GRDB
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// What a relay's operator sees: health, metrics, clear statuses for other requests, and clear errors for bad flags.
@Suite struct RelayOperatorTests {
    @Test func operatorsGetHealthAndMetricsAndEverythingElseAClearStatus() throws {
        let relay = try RelayProcess()
        let (a, ca, capability) = try sharedTeam(servedBy: relay)
        _ = try ca.call("peer.add", ["db": "team", "address": .string(relay.address)])
        for i in 0..<5 { _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": .string("d\(i)"), "doc": ["i": .int(Int64(i))]]) }
        let na = try nodeID(ca, "team")
        let seq = try ownSeq(ca, "team")
        #expect(try eventually { try relay.held()[na] == seq })
        // A device proving another space is refused: counted.
        #expect(throws: (any Error).self) {
            try HostileMember(key: SpaceKey.generate()).connect(port: relay.port, webSocket: "/v1/sync")
        }

        let health = try httpExchange(port: relay.port, "GET /healthz HTTP/1.1\r\nHost: relay\r\n\r\n")
        #expect(health.status == 200 && health.body.contains(#""status":"ok""#) && health.body.contains(#""spaces":1"#))
        func scrape() throws -> (status: Int, body: String, values: [String: Double]) {
            let metrics = try httpExchange(port: relay.port, "GET /metrics HTTP/1.1\r\nHost: relay\r\n\r\n")
            let values = Dictionary(
                metrics.body.split(separator: "\n").filter { !$0.hasPrefix("#") }.compactMap { line -> (String, Double)? in
                    let parts = line.split(separator: " ")
                    guard parts.count == 2, let v = Double(parts[1]) else { return nil }
                    return (String(parts[0]), v)
                }, uniquingKeysWith: { a, _ in a })
            return (metrics.status, metrics.body, values)
        }
        // Connections closed a moment ago may still count until the relay has seen them go.
        #expect(try eventually { try scrape().values["blaze_relay_connections"] == 2 }, "A's link and the scrape's own")
        let metrics = try scrape()
        let values = metrics.values
        #expect(metrics.status == 200)
        #expect(values["blaze_relay_entries_stored_total"] == Double(seq), "\(metrics.body)")
        #expect((values["blaze_relay_bytes_stored_total"] ?? 0) > Double(seq) * 50)
        #expect(values["blaze_relay_spaces"] == 1)
        #expect(values["blaze_relay_connections_established_total"].map { $0 >= 1 } == true)
        #expect(values["blaze_relay_handshakes_refused_total"] == 1)

        // Anything else gets a status, never a hang.
        #expect(try httpExchange(port: relay.port, "GET /nope HTTP/1.1\r\nHost: relay\r\n\r\n").status == 404)
        #expect(try httpExchange(port: relay.port, "POST /metrics HTTP/1.1\r\nHost: relay\r\nContent-Length: 0\r\n\r\n").status == 405)
        #expect(try httpExchange(port: relay.port, "GET /v1/sync HTTP/1.1\r\nHost: relay\r\n\r\n").status == 426)
        let key = Data((0..<16).map { UInt8($0) }).base64EncodedString()
        let elsewhere = try httpExchange(
            port: relay.port,
            "GET /other HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: \(key)\r\n"
                + "Sec-WebSocket-Version: 13\r\n\r\n")
        #expect(elsewhere.status == 404, "a WebSocket is opened on /v1/sync only")
        #expect(try httpExchange(port: relay.port, "NOT HTTP AT ALL\r\n\r\n").status == 400)

        // On an open WebSocket, a text frame or a frame over the size limit closes the connection.
        let cap = try RelayCapability(text: capability)
        let text = HostileMember(key: cap.key)
        try text.connect(port: relay.port, webSocket: "/v1/sync")
        try text.writeFrame(opcode: 1, Array("hello".utf8))
        #expect(text.awaitClose().closed)
        let big = HostileMember(key: cap.key)
        try big.connect(port: relay.port, webSocket: "/v1/sync")
        try? big.writeFrame(opcode: 2, [UInt8](repeating: 7, count: (1 << 20) + 1))
        #expect(big.awaitClose().closed)
        // The relay still serves.
        #expect(try httpExchange(port: relay.port, "GET /healthz HTTP/1.1\r\nHost: relay\r\n\r\n").status == 200)
        a.stop()
        relay.stop()
    }

    @Test func operatorErrorsAreClear() throws {
        let dir = TempDir()
        let bad = try run(buildDirectory + "/blaze-relay", ["add-space", "--data-dir", dir.path, "not-a-token"])
        #expect(bad.status != 0 && bad.err.contains("not a relay capability"))
        let limits = try run(buildDirectory + "/blaze-relay", ["serve", "--data-dir", dir.path, "--max-connections", "0"])
        #expect(limits.status != 0 && limits.err.contains("max-connections (from flag --max-connections) must be at least 1, got 0"))
        let help = try run(buildDirectory + "/blaze-relay", ["--help"])
        #expect(help.status == 0 && help.out.contains("add-space") && help.out.contains("serve"))
        let format = try run(buildDirectory + "/blaze-relay", ["serve", "--data-dir", dir.path, "--log-format", "xml"])
        #expect(format.status != 0 && format.err.contains("log-format (from flag --log-format) must be one of text, json"))
        let tls = try run(buildDirectory + "/blaze-relay", ["serve", "--data-dir", dir.path, "--tls-cert", "/nonexistent.pem"])
        #expect(tls.status != 0 && tls.err.contains("tls-cert and tls-key go together"))
        let pg = try run(buildDirectory + "/blaze-relay", ["serve", "--data-dir", dir.path, "--postgres", "mysql://x"])
        #expect(pg.status != 0 && pg.err.contains("postgres (from flag --postgres) must be a postgres:// URL"))
        let proxy = try run(buildDirectory + "/blaze-relay", ["serve", "--data-dir", dir.path, "--trusted-proxy", "10.0.0.0/33"])
        #expect(proxy.status != 0 && proxy.err.contains("trusted-proxy (from flag --trusted-proxy) must be an IP address or CIDR block"))
        let everyone = try run(buildDirectory + "/blaze-relay", ["serve", "--data-dir", dir.path, "--trusted-proxy", "::/0"])
        #expect(everyone.status != 0 && everyone.err.contains("not /0"), "trusting every address is trusting clients")
        // Log lines are blazed's: one JSON object per line with --log-format json.
        let relay = try RelayProcess(arguments: ["--log-format", "json"])
        #expect(eventually { relay.logText.contains("Relay started") })
        relay.stop()
        let first = try #require(relay.logText.split(separator: "\n").first)
        let object = try JSONSerialization.jsonObject(with: Data(first.utf8)) as? [String: Any]
        #expect(object?["msg"] as? String == "Relay started" && object?["level"] as? String == "info")
    }

    /// The relay's settings work as blazed's: flags over environment over its configuration file over the defaults,
    /// each with its source in `blaze-relay config`, lists from a YAML sequence, a password never shown.
    @Test func aRelayReadsItsSettingsFromFlagsEnvironmentAndFile() throws {
        let dir = TempDir()
        try FileManager.default.createDirectory(atPath: dir.path + "/config/blazedb", withIntermediateDirectories: true)
        let file = dir.path + "/config/blazedb/relay.yaml"
        try """
            log-format: json
            handshake-rate: 3
            max-handshakes: 40
            trusted-proxy:
              - 10.0.0.0/8
              - fd00::/8
            postgres: postgres://relay:hunter2@localhost/relay
            """.write(toFile: file, atomically: true, encoding: .utf8)
        var env = isolatedEnvironment(config: dir.path + "/config")
        env["BLAZE_RELAY_HANDSHAKE_RATE"] = "5"
        env["BLAZE_RELAY_MAX_HANDSHAKES"] = "30"
        let shown = try run(buildDirectory + "/blaze-relay", ["config", "--json", "--max-handshakes", "20"], environment: env)
        #expect(shown.status == 0, "\(shown.err)")
        let report = try JSONParser().parse(shown.out)
        #expect(report["file"] == .string(file))
        var rows: [String: (JSONValue, String)] = [:]
        for s in report["settings"]?.arrayValue ?? [] { rows[s["key"]?.stringValue ?? ""] = (s["value"] ?? .null, s["source"]?.stringValue ?? "") }
        #expect(rows["max-handshakes"]?.0 == 20 && rows["max-handshakes"]?.1 == "flag --max-handshakes")
        #expect(rows["handshake-rate"]?.0 == 5 && rows["handshake-rate"]?.1 == "env BLAZE_RELAY_HANDSHAKE_RATE")
        #expect(rows["log-format"]?.0 == "json" && rows["log-format"]?.1 == "file \(file)")
        #expect(rows["trusted-proxy"]?.0 == ["10.0.0.0/8", "fd00::/8"])
        #expect(rows["max-connections"]?.0 == 10_000 && rows["max-connections"]?.1 == "default")
        #expect(rows["postgres"]?.0 == "postgres://relay:***@localhost/relay", "the password is masked")
        #expect(!shown.out.contains("hunter2"))
        #expect(rows.count == RelaySettings.keys.count)
        let help = try run(buildDirectory + "/blaze-relay", ["--help"], environment: env)
        #expect(RelaySettings.keys.allSatisfy { help.out.contains("--\($0.name)") && help.out.contains($0.environmentVariable) })

        // A relay started with that file (less the PostgreSQL URL) applies it: its log lines are JSON.
        try "log-format: json\nmax-handshakes: 40\n".write(toFile: file, atomically: true, encoding: .utf8)
        let relay = try RelayProcess(dir: dir)
        #expect(eventually { relay.logText.contains("Relay started") })
        #expect(relay.logText.split(separator: "\n").allSatisfy { $0.hasPrefix("{") }, "\(relay.logText)")
        relay.stop()
        // A bad value names the setting and where it came from, and nothing starts.
        env["BLAZE_RELAY_RETENTION_DAYS"] = "forever"
        let bad = try run(buildDirectory + "/blaze-relay", ["serve", "--data-dir", dir.path + "/bad"], environment: env)
        #expect(bad.status != 0 && bad.err.contains("retention-days (from env BLAZE_RELAY_RETENTION_DAYS) must be a whole number"))
        #expect(!FileManager.default.fileExists(atPath: dir.path + "/bad"))
    }
}
