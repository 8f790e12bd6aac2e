import BlazeConfig
@testable import BlazeDaemon
import BlazeProtocol
import BlazeSettings
import BlazeStore
import Foundation
import Testing

/// Settings are defined once (`BlazedSettings`): each lands in one place of the daemon's configuration, and what it
/// limits is limited everywhere it applies.
@Suite struct SettingsTests {
    /// The configuration as text without its report of the settings (which names every value it was given).
    static func shape(_ config: DaemonConfig) -> String {
        var config = config
        config.settings = nil
        var out = ""
        dump(config, to: &out)
        return out
    }

    /// A valid value of `key` other than its built-in default, as a flag would give it.
    static func otherValue(_ key: ConfigKey) -> String {
        let builtIn = key.builtIn(["HOME": "/h"])
        switch (key.kind, builtIn) {
        case (.int(let min, let max), .int(let v)): return String(v < max ? v + 1 : min)
        case (.double(let range), .double(let v)): return String(v < range.upperBound ? min(v + 1, range.upperBound) : range.lowerBound)
        case (.bool, .bool(let v)): return v ? "false" : "true"
        case (.choice(let words), .string(let v)): return words.first { $0 != v }!
        default: return key.parse("/elsewhere/x").isSuccess ? "/elsewhere/x" : "127.0.0.1:1"
        }
    }

    /// Every setting has exactly one landing, and a value other than its default changes the configuration the
    /// daemon runs with: nothing can be set and then read from somewhere else.
    @Test func everySettingLandsOnceAndChangesTheConfiguration() throws {
        let names = DaemonConfig.landings.map(\.key.name)
        #expect(Set(names).count == names.count, "a setting lands twice: \(names)")
        #expect(names.sorted() == BlazedSettings.keys.map(\.name).sorted())
        let dir = TempDir()
        let file = dir.path + "/empty.yaml"
        try "".write(toFile: file, atomically: true, encoding: .utf8)
        let env = ["HOME": "/h"]
        let resolver = BlazedSettings.resolver
        let defaults = Self.shape(DaemonConfig(settings: try resolver.resolve(flags: [:], environment: env, configFile: file), environment: env))
        #expect(defaults == Self.shape(DaemonConfig(environment: env)), "the built-in defaults are the library's")
        for key in BlazedSettings.keys {
            let value = Self.otherValue(key)
            let settings = try resolver.resolve(flags: [key.name: value], environment: env, configFile: file)
            #expect(settings[key.name] != key.builtIn(env), "\(key.name) \(value) is not its default")
            #expect(Self.shape(DaemonConfig(settings: settings, environment: env)) != defaults, "\(key.name) \(value) lands nowhere")
        }
    }

    /// One depth limit for all outside JSON: `max-depth` sets the store's, which the RPC decoder, peers' changes,
    /// snapshots and restored backups all read.
    @Test func maxDepthReachesEveryParserOfOutsideJSON() throws {
        let dir = TempDir()
        let file = dir.path + "/d.yaml"
        try "max-depth: 12\n".write(toFile: file, atomically: true, encoding: .utf8)
        let config = DaemonConfig(
            settings: try BlazedSettings.resolver.resolve(flags: [:], environment: ["HOME": "/h"], configFile: file),
            environment: ["HOME": "/h"])
        #expect(config.storeLimits.maxDepth == 12)
        #expect(!Self.shape(config).contains("maxDepth: 64"), "no other depth limit is left at its default")
    }

    /// A nested document of depth `depth`: `{"a": {"a": … 1}}`.
    static func nested(_ depth: Int) -> JSONValue {
        (1..<depth).reduce(JSONValue.object(["a": 1])) { inner, _ in .object(["a": inner]) }
    }

    /// End to end: a daemon whose configuration file sets `max-depth` refuses deeper requests, and refuses to restore
    /// a backup holding a document deeper than it, saying so.
    @Test func maxDepthFromTheFileLimitsRequestsAndRestoredBackups() throws {
        let deep = try DaemonProcess()
        let c = try deep.connect()
        _ = try c.call("db.create", ["db": "deep"])
        _ = try c.call("doc.put", ["db": "deep", "collection": "c", "id": "d", "doc": Self.nested(20)])
        let backup = deep.dir.path + "/deep.backup"
        _ = try c.call("db.backup", ["db": "deep", "path": .string(backup)])
        deep.stop()

        let dir = TempDir()
        try FileManager.default.createDirectory(atPath: dir.path + "/config/blazedb", withIntermediateDirectories: true)
        try "max-depth: 12\n".write(toFile: dir.path + "/config/blazedb/blazed.yaml", atomically: true, encoding: .utf8)
        let shallow = try DaemonProcess(dir: dir)
        let s = try shallow.connect()
        #expect(try s.call("daemon.info")["limits"]?["maxDepth"] == 12)
        _ = try s.call("db.create", ["db": "ok"])
        _ = try s.call("doc.put", ["db": "ok", "collection": "c", "id": "d", "doc": Self.nested(8)])
        // A parse error has no id to answer with: read the reply to the line itself.
        let line = #"{"jsonrpc":"2.0","id":1,"method":"doc.put","params":{"db":"ok","collection":"c","id":"e","doc":"#
            + Self.nested(20).jsonText + "}}"
        try s.send(Array(line.utf8) + [0x0A])
        let reply = try s.readMessage()
        #expect(reply["error"]?["data"]?["kind"] == "nesting_too_deep", "\(reply.jsonText)")
        #expect(reply["error"]?["message"]?.stringValue?.contains("limit of 12") == true, "\(reply.jsonText)")
        do {
            _ = try s.call("db.restore", ["path": .string(backup), "db": "copy"])
            Issue.record("a backup holding a document deeper than max-depth was restored")
        } catch let e as RPCError {
            #expect(e.kind == "backup_invalid" && e.message.contains("nested deeper than this daemon's max-depth (12)"), "\(e)")
        }
        #expect(try s.call("db.list")["databases"]?.arrayValue?.contains { $0["name"] == "copy" } != true)
        shallow.stop()
    }
}

extension Result {
    /// True for a success.
    var isSuccess: Bool {
        if case .success = self { return true }
        return false
    }
}
