import BlazeClient
import BlazeConfig
@testable import BlazeDaemon
import BlazeProtocol
import BlazeSettings
import BlazeStore
import BlazeSync
import BlazeTestSupport
import Foundation
import GRDB
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct Configuration {
    @Test func builtInDefaultsAreTheLibraryDefaults() throws {
        let dir = TempDir()
        try "# nothing set\n".write(toFile: dir.path + "/empty.yaml", atomically: true, encoding: .utf8)
        let settings = try BlazedSettings.resolver.resolve(flags: [:], environment: ["HOME": "/h"], configFile: dir.path + "/empty.yaml")
        #expect(settings.entries.allSatisfy { $0.source == .builtIn })
        // The built-in defaults give exactly the library's default configuration (every setting landing once:
        // SettingsTests).
        let env = ["HOME": "/h"]
        let fromSettings = DaemonConfig(settings: settings, environment: env), library = DaemonConfig(environment: env)
        #expect(fromSettings.limits == library.limits && fromSettings.storeLimits == library.storeLimits)
        #expect(fromSettings.syncListenerLimits == library.syncListenerLimits && fromSettings.syncTimeoutMs == library.syncTimeoutMs)
        #expect(fromSettings.syncRetryMaxMs == library.syncRetryMaxMs && library.syncRetryMaxMs == 5_000)
        #expect(fromSettings.socketPath == library.socketPath && fromSettings.dataDirectory == library.dataDirectory)
        #expect(fromSettings.defaultDatabase == library.defaultDatabase && fromSettings.syncListen == nil)
        #expect(settings[BlazedSettings.dataDir] == "/h/.local/share/blazedb")
    }

    /// Setting flags are read from the setting list itself: every key is a flag, switches also as --no-NAME.
    @Test func settingFlagsAreParsedFromTheKeys() throws {
        let r = BlazedSettings.resolver
        #expect(
            try r.flags(["--max-batch", "7", "--log-level=debug", "--no-default-database", "--sync-listen", "127.0.0.1:0"])
                == ["max-batch": "7", "log-level": "debug", "default-database": "false", "sync-listen": "127.0.0.1:0"])
        #expect(try r.flags(["--default-database"]) == ["default-database": "true"])
        #expect(throws: ConfigError.self) { try r.flags(["--max-bach", "7"]) }
        #expect(throws: ConfigError.self) { try r.flags(["--max-batch"]) }
        #expect(throws: ConfigError.self) { try r.flags(["--max-batch", "1", "--max-batch", "2"]) }
        #expect(throws: ConfigError.self) { try r.flags(["stray"]) }
        #expect(BlazedSettings.keys.allSatisfy { r.helpText.contains("--\($0.name)") && r.helpText.contains($0.environmentVariable) })
    }

    @Test func flagsBeatEnvironmentBeatFileBeatDefaults() throws {
        let dir = TempDir()
        let file = dir.path + "/config/blazedb/blazed.yaml"
        try FileManager.default.createDirectory(atPath: dir.path + "/config/blazedb", withIntermediateDirectories: true)
        try "# test settings\nlog-level: debug\nmax-batch: 100\nidle-timeout: 5\nmax-depth: 12\n"
            .write(toFile: file, atomically: true, encoding: .utf8)
        let d = try DaemonProcess(arguments: ["--max-batch", "7"], dir: dir, environment: ["BLAZEDB_IDLE_TIMEOUT": "9"])
        let c = try d.connect()
        let limits = try c.call("daemon.info")["limits"]
        #expect(limits?["maxBatch"] == 7 && limits?["idleTimeoutSeconds"] == 9 && limits?["maxDepth"] == 12)
        #expect(limits?["maxConnections"] == 256)
        let config = try c.call("daemon.config")
        #expect(config["file"] == .string(file))
        var sources: [String: String] = [:]
        for s in config["settings"]?.arrayValue ?? [] { sources[s["key"]?.stringValue ?? ""] = s["source"]?.stringValue }
        #expect(sources["max-batch"] == "flag --max-batch" && sources["idle-timeout"] == "env BLAZEDB_IDLE_TIMEOUT")
        #expect(sources["max-depth"] == "file \(file)" && sources["log-level"] == "file \(file)")
        #expect(sources["max-connections"] == "default")
        #expect(d.logText.contains("level=debug"), "log-level from the file applies")

        // blazectl asks the running daemon, which knows its flags.
        var env = isolatedEnvironment(config: dir.path + "/config")
        env["BLAZEDB_SOCKET"] = d.socket
        let shown = try run(buildDirectory + "/blazectl", ["config", "show"], environment: env)
        let rows = shown.out.split(separator: "\n").map { $0.split(separator: " ", omittingEmptySubsequences: true).joined(separator: " ") }
        #expect(rows.first == "SETTING VALUE SOURCE")
        #expect(rows.contains("max-batch 7 flag --max-batch") && rows.contains("idle-timeout 9 env BLAZEDB_IDLE_TIMEOUT"))
        #expect(rows.contains("max-depth 12 file \(file)") && rows.last == "configuration file: \(file)")
        d.stop()

        // With no daemon answering, it resolves the environment and the file itself, and says so.
        env["BLAZEDB_SOCKET"] = dir.path + "/none.sock"
        let offline = try run(buildDirectory + "/blazectl", ["config", "show", "--json"], environment: env)
        #expect(offline.status == 0 && offline.err.contains("no daemon answers at \(dir.path)/none.sock"))
        let settings = try JSONParser().parse(offline.out)["settings"]?.arrayValue ?? []
        #expect(settings.contains { $0["key"] == "max-depth" && $0["value"] == 12 && $0["source"] == .string("file \(file)") })
        #expect(settings.contains { $0["key"] == "socket" && $0["source"] == "env BLAZEDB_SOCKET" })
    }

    @Test func invalidConfigurationStopsTheDaemonNamingTheSetting() throws {
        let dir = TempDir()
        let file = dir.path + "/blazed.yaml"
        let base = ["--socket", dir.path + "/s.sock", "--data-dir", dir.path + "/data", "--config", file]
        let env = isolatedEnvironment(config: dir.path + "/config")
        for (yaml, message) in [
            ("log-level: info\nmax-batch: 0\n", "invalid configuration: max-batch (from file \(file) line 2) must be at least 1, got 0"),
            ("log-levle: debug\n", "invalid configuration: \(file) line 1: unknown setting \"log-levle\""),
            ("sync-timeout: [1, 2]\n", "invalid configuration: sync-timeout (from file \(file) line 1) must be a single value"),
            ("log-level: loud\n", "log-level (from file \(file) line 1) must be one of trace, debug, info, notice, warning, error, critical, got \"loud\""),
            ("max-batch: 1\nmax-batch: 2\n", "duplicated key(s): 'max-batch'"),
            ("- a\n- b\n", "must be a mapping of setting names to values"),
            ("a: [\n", "is not valid YAML"),
        ] {
            try yaml.write(toFile: file, atomically: true, encoding: .utf8)
            let r = try run(buildDirectory + "/blazed", base, environment: env)
            #expect(r.status == 1 && r.err.hasPrefix("blazed: ") && r.err.contains(message), "\(yaml): \(r.err)")
            #expect(r.err.split(separator: "\n").count == 1, "one line: \(r.err)")
        }
        var badEnv = env
        badEnv["BLAZEDB_MAX_CONNECTIONS"] = "many"
        try "".write(toFile: file, atomically: true, encoding: .utf8)
        let r = try run(buildDirectory + "/blazed", base, environment: badEnv)
        #expect(r.err == "blazed: invalid configuration: max-connections (from env BLAZEDB_MAX_CONNECTIONS) must be a whole number, got \"many\"\n")
        let missing = try run(buildDirectory + "/blazed", ["--config", dir.path + "/nope.yaml"], environment: env)
        #expect(missing.status == 1 && missing.err == "blazed: configuration file \(dir.path)/nope.yaml does not exist\n")
        #expect(!FileManager.default.fileExists(atPath: dir.path + "/data"), "nothing created before the settings are checked")
    }
}
