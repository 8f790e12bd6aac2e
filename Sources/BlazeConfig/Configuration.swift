import BlazeProtocol
import BlazeSettings
import Foundation
import Yams

/// Where a setting's effective value came from, in increasing precedence.
public enum ConfigSource: Sendable, Equatable, CustomStringConvertible {
    /// The built-in default.
    case builtIn
    /// The configuration file at this path.
    case file(String)
    /// This environment variable.
    case environment(String)
    /// This command-line flag.
    case flag(String)

    /// A short human description, e.g. `env BLAZEDB_LOG_LEVEL`.
    public var description: String {
        switch self {
        case .builtIn: "default"
        case .file(let path): "file \(path)"
        case .environment(let name): "env \(name)"
        case .flag(let name): "flag \(name)"
        }
    }
}

/// The effective value of every setting, with where each came from.
public struct ResolvedConfig: Sendable {
    /// One setting's effective value and its source.
    public struct Entry: Sendable {
        /// The setting.
        public let key: ConfigKey
        /// Its effective value.
        public let value: ConfigValue
        /// Where the value came from.
        public let source: ConfigSource
    }

    /// Every setting, in the order of `ConfigKeys.all`.
    public let entries: [Entry]
    /// The configuration file that was read, nil when none exists at the default path.
    public let file: String?

    /// The effective value of `setting` (which must be one of the resolved keys).
    public subscript<Value>(_ setting: Setting<Value>) -> Value { setting.value(self[setting.name]) }

    /// The value of setting `name` (which must exist).
    public subscript(name: String) -> ConfigValue {
        guard let entry = entries.first(where: { $0.key.name == name }) else { preconditionFailure("unknown setting \(name)") }
        return entry.value
    }

    /// `{"config": file, "settings": [{key, value, source, env}]}` for `daemon.config` and `--json` output.
    public var json: JSONValue { report.json }

    /// The settings as `daemon.config` reports them.
    public var report: RPC.DaemonConfig.Result {
        .init(
            file: file,
            settings: entries.map { e in
                .init(key: e.key.name, value: e.key.shown(e.value).json, source: e.source.description, env: e.key.environmentVariable)
            })
    }
}

/// Layers the settings of `keys`: flags over environment over the configuration file over built-in defaults.
public struct ConfigResolver: Sendable {
    /// The settings.
    public let keys: [ConfigKey]
    /// The configuration file's name under `$XDG_CONFIG_HOME/blazedb/` (`blazed.yaml`).
    public let fileName: String
    /// The environment variable naming another configuration file (`BLAZEDB_CONFIG`).
    public let fileVariable: String

    /// Creates a resolver over `keys`, reading `$XDG_CONFIG_HOME/blazedb/<fileName>` unless `fileVariable` names another.
    public init(keys: [ConfigKey], fileName: String = "blazed.yaml", fileVariable: String = "BLAZEDB_CONFIG") {
        precondition(Set(keys.map(\.name)).count == keys.count, "a setting is listed twice")
        self.keys = keys
        self.fileName = fileName
        self.fileVariable = fileVariable
    }

    /// `--config`, else `$BLAZEDB_CONFIG` (`fileVariable`), else `$XDG_CONFIG_HOME/blazedb/blazed.yaml` (`fileName`;
    /// `~/.config` when unset). The second value is true when the path was given explicitly (then it must exist).
    public func configFilePath(flag: String?, environment: [String: String]) -> (path: String, explicit: Bool) {
        if let flag, !flag.isEmpty { return (flag, true) }
        if let env = environment[fileVariable], !env.isEmpty { return (env, true) }
        let base =
            environment["XDG_CONFIG_HOME"].flatMap { $0.isEmpty ? nil : $0 }
            ?? ((environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? NSHomeDirectory()) + "/.config")
        return (base + "/blazedb/" + fileName, false)
    }

    /// The settings given on a command line as `--name value`, `--name=value`, `--name` (a switch: true) or
    /// `--no-name` (a switch: false), by setting name; anything else is an error naming the argument. A list setting may
    /// be given more than once: its items are kept as one text, comma-separated.
    public func flags(_ arguments: [String]) throws(ConfigError) -> [String: String] {
        var out: [String: String] = [:]
        var i = 0
        while i < arguments.count {
            let argument = arguments[i]
            i += 1
            guard argument.hasPrefix("--"), argument.count > 2 else {
                throw ConfigError("unexpected argument \"\(argument)\" (settings are --name value)")
            }
            var name = String(argument.dropFirst(2))
            var value: String?
            if let eq = name.firstIndex(of: "=") {
                value = String(name[name.index(after: eq)...])
                name = String(name[..<eq])
            }
            if keys.first(where: { $0.name == name }) == nil, name.hasPrefix("no-"),
                let key = keys.first(where: { $0.name == name.dropFirst(3) }), case .bool = key.kind, value == nil
            {
                name = key.name
                value = "false"
            }
            guard let key = keys.first(where: { $0.name == name }) else {
                throw ConfigError("unknown option --\(name) (settings: \(keys.map(\.name).joined(separator: ", ")))")
            }
            if value == nil {
                if case .bool = key.kind, i >= arguments.count || arguments[i].hasPrefix("--") {
                    value = "true"
                } else if i < arguments.count {
                    value = arguments[i]
                    i += 1
                } else {
                    throw ConfigError("--\(name) needs a value")
                }
            }
            if case .list = key.kind, let earlier = out[name], let value {
                out[name] = earlier + "," + value
                continue
            }
            guard out[name] == nil else { throw ConfigError("--\(name) is given twice") }
            out[name] = value
        }
        return out
    }

    /// One line per setting for `--help`: the flag, what it sets, its environment variable.
    public var helpText: String {
        keys.map { key in
            let value: String
            switch key.kind {
            case .bool: value = "--\(key.name) | --no-\(key.name)"
            case .int: value = "--\(key.name) N"
            case .double: value = "--\(key.name) SECONDS"
            case .choice(let words): value = "--\(key.name) \(words.joined(separator: "|"))"
            case .text: value = "--\(key.name) TEXT"
            case .list: value = "--\(key.name) TEXT (repeatable)"
            }
            return "\(value)  [env \(key.environmentVariable)]\n    \(key.summary)"
        }.joined(separator: "\n")
    }

    /// Resolves every setting. `flags` maps setting names to the text given on the command line.
    public func resolve(flags: [String: String], environment: [String: String], configFile: String?) throws(ConfigError)
        -> ResolvedConfig
    {
        let (path, explicit) = configFilePath(flag: configFile, environment: environment)
        var fileValues: [String: ConfigValue] = [:]
        var fileUsed: String?
        if FileManager.default.fileExists(atPath: path) {
            fileValues = try readFile(path)
            fileUsed = path
        } else if explicit {
            throw ConfigError("configuration file \(path) does not exist")
        }
        var entries: [ResolvedConfig.Entry] = []
        for key in keys {
            if let text = flags[key.name] {
                entries.append(.init(key: key, value: try value(key, text, from: .flag("--" + key.name)), source: .flag("--" + key.name)))
            } else if let text = environment[key.environmentVariable] {
                let source = ConfigSource.environment(key.environmentVariable)
                entries.append(.init(key: key, value: try value(key, text, from: source), source: source))
            } else if let v = fileValues[key.name] {
                entries.append(.init(key: key, value: v, source: .file(path)))
            } else {
                entries.append(.init(key: key, value: key.builtIn(environment), source: .builtIn))
            }
        }
        return ResolvedConfig(entries: entries, file: fileUsed)
    }

    private func value(_ key: ConfigKey, _ text: String, from source: ConfigSource) throws(ConfigError) -> ConfigValue {
        switch key.parse(text) {
        case .success(let v): return v
        case .failure(let e): throw ConfigError("invalid configuration: \(key.name) (from \(source)) \(e.description)")
        }
    }

    /// Reads a YAML mapping of setting names to scalars; unknown keys, nesting and bad values are errors with lines.
    func readFile(_ path: String) throws(ConfigError) -> [String: ConfigValue] {
        let text: String
        do {
            text = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw ConfigError("cannot read configuration file \(path): \(error.localizedDescription)")
        }
        let root: Node?
        do {
            root = try Yams.compose(yaml: text)
        } catch {
            let reason = "\(error)".split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
            throw ConfigError("configuration file \(path) is not valid YAML: \(reason.joined(separator: " "))")
        }
        guard let root else { return [:] }  // empty file
        guard case .mapping(let mapping) = root else {
            throw ConfigError("configuration file \(path) must be a mapping of setting names to values")
        }
        var out: [String: ConfigValue] = [:]
        for (k, v) in mapping {
            let line = k.mark.map { " line \($0.line)" } ?? ""
            guard let name = k.scalar?.string else { throw ConfigError("\(path)\(line): setting names must be text") }
            guard let key = keys.first(where: { $0.name == name }) else {
                let names = keys.map(\.name).joined(separator: ", ")
                throw ConfigError("invalid configuration: \(path)\(line): unknown setting \"\(name)\" (known: \(names))")
            }
            guard out[name] == nil else { throw ConfigError("invalid configuration: \(path)\(line): \(name) is set twice") }
            if case .list = key.kind, let sequence = v.sequence {
                let items = sequence.compactMap { $0.scalar?.string }
                guard items.count == sequence.count else {
                    throw ConfigError("invalid configuration: \(name) (from file \(path)\(line)) must be a list of texts")
                }
                switch key.parse(items: items) {
                case .success(let value): out[name] = value
                case .failure(let e): throw ConfigError("invalid configuration: \(name) (from file \(path)\(line)) \(e.description)")
                }
                continue
            }
            guard let scalar = v.scalar else {
                throw ConfigError("invalid configuration: \(name) (from file \(path)\(line)) must be a single value")
            }
            let isNull = scalar.style == .plain && ["", "~", "null", "Null", "NULL"].contains(scalar.string)
            if isNull {
                guard key.optional else {
                    throw ConfigError("invalid configuration: \(name) (from file \(path)\(line)) must have a value")
                }
                out[name] = ConfigValue.none
                continue
            }
            switch key.parse(scalar.string) {
            case .success(let value): out[name] = value
            case .failure(let e): throw ConfigError("invalid configuration: \(name) (from file \(path)\(line)) \(e.description)")
            }
        }
        return out
    }
}
