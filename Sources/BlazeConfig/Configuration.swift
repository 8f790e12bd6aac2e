import BlazeProtocol
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

/// A setting's typed value.
public enum ConfigValue: Sendable, Equatable, CustomStringConvertible {
    /// An integer.
    case int(Int)
    /// A number.
    case double(Double)
    /// Text.
    case string(String)
    /// A switch.
    case bool(Bool)
    /// Not set (only for optional settings).
    case none

    /// The value as it would be written in the configuration file.
    public var description: String {
        switch self {
        case .int(let v): String(v)
        case .double(let v): v == v.rounded() && abs(v) < 1e15 ? String(Int(v)) : String(v)
        case .string(let v): v
        case .bool(let v): v ? "true" : "false"
        case .none: "(none)"
        }
    }

    /// The value as JSON (null for `none`).
    public var json: JSONValue {
        switch self {
        case .int(let v): .int(Int64(v))
        case .double(let v): .double(v)
        case .string(let v): .string(v)
        case .bool(let v): .bool(v)
        case .none: .null
        }
    }
}

/// The configuration cannot be used; names the setting, where the bad value came from and what is wrong.
public struct ConfigError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The whole message.
    public var description: String

    /// Creates an error with its message.
    public init(_ description: String) { self.description = description }
}

/// One setting of `blazed`: its name (the flag without `--`, the file key), type, default and rule.
public struct ConfigKey: Sendable {
    /// The kinds of value a setting takes.
    public enum Kind: Sendable {
        /// An integer from `min` on.
        case int(min: Int)
        /// A number in a closed range.
        case double(ClosedRange<Double>)
        /// One of these words.
        case choice([String])
        /// Text, checked by `check` (nil when it is fine, else what is wrong).
        case text(check: @Sendable (String) -> String?)
        /// `true` or `false`.
        case bool
    }

    /// The name: file key and flag (`--name`).
    public let name: String
    /// The type and rule.
    public let kind: Kind
    /// Whether the setting may be absent (`none`).
    public let optional: Bool
    /// One line for `--help`, `config show` and the docs.
    public let summary: String
    /// The built-in default, given the environment (paths depend on it).
    public let builtIn: @Sendable ([String: String]) -> ConfigValue

    /// The environment variable that sets it: `BLAZEDB_` and the name in capitals with `_` for `-`.
    public var environmentVariable: String {
        "BLAZEDB_" + name.uppercased().replacingOccurrences(of: "-", with: "_")
    }

    /// Creates a setting.
    public init(
        _ name: String, _ kind: Kind, optional: Bool = false, _ summary: String,
        builtIn: @escaping @Sendable ([String: String]) -> ConfigValue
    ) {
        self.name = name
        self.kind = kind
        self.optional = optional
        self.summary = summary
        self.builtIn = builtIn
    }

    /// Parses `text` (from a flag, the environment or a file scalar) into this setting's value.
    public func parse(_ text: String) -> Result<ConfigValue, ConfigError> {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if optional && (trimmed.isEmpty || trimmed == "none") { return .success(.none) }
        switch kind {
        case .int(let min):
            guard let v = Int(trimmed.replacingOccurrences(of: "_", with: "")) else {
                return .failure(ConfigError("must be a whole number, got \"\(text)\""))
            }
            guard v >= min else { return .failure(ConfigError("must be at least \(min), got \(v)")) }
            return .success(.int(v))
        case .double(let range):
            guard let v = Double(trimmed), v.isFinite else { return .failure(ConfigError("must be a number, got \"\(text)\"")) }
            guard range.contains(v) else {
                return .failure(
                    ConfigError("must be from \(ConfigValue.double(range.lowerBound)) to \(ConfigValue.double(range.upperBound)), got \(trimmed)"))
            }
            return .success(.double(v))
        case .choice(let words):
            guard words.contains(trimmed) else {
                return .failure(ConfigError("must be one of \(words.joined(separator: ", ")), got \"\(text)\""))
            }
            return .success(.string(trimmed))
        case .text(let check):
            guard !trimmed.isEmpty else { return .failure(ConfigError("must not be empty")) }
            if let problem = check(trimmed) { return .failure(ConfigError(problem)) }
            return .success(.string(trimmed))
        case .bool:
            switch trimmed.lowercased() {
            case "true", "yes", "on", "1": return .success(.bool(true))
            case "false", "no", "off", "0": return .success(.bool(false))
            default: return .failure(ConfigError("must be true or false, got \"\(text)\""))
            }
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

    /// The value of setting `name` (which must exist).
    public subscript(name: String) -> ConfigValue {
        guard let entry = entries.first(where: { $0.key.name == name }) else { preconditionFailure("unknown setting \(name)") }
        return entry.value
    }

    /// The integer setting `name`.
    public func int(_ name: String) -> Int {
        if case .int(let v) = self[name] { return v }
        preconditionFailure("\(name) is not an integer setting")
    }

    /// The number setting `name`.
    public func double(_ name: String) -> Double {
        if case .double(let v) = self[name] { return v }
        preconditionFailure("\(name) is not a number setting")
    }

    /// The text setting `name`, nil when unset.
    public func string(_ name: String) -> String? {
        if case .string(let v) = self[name] { return v }
        return nil
    }

    /// The switch `name`.
    public func bool(_ name: String) -> Bool {
        if case .bool(let v) = self[name] { return v }
        preconditionFailure("\(name) is not a switch")
    }

    /// `{"config": file, "settings": [{key, value, source, env}]}` for `daemon.config` and `--json` output.
    public var json: JSONValue { report.json }

    /// The settings as `daemon.config` reports them.
    public var report: RPC.DaemonConfig.Result {
        .init(
            file: file,
            settings: entries.map { e in
                .init(key: e.key.name, value: e.value.json, source: e.source.description, env: e.key.environmentVariable)
            })
    }
}

/// Layers the settings of `keys`: flags over environment over the configuration file over built-in defaults.
public struct ConfigResolver: Sendable {
    /// The settings.
    public let keys: [ConfigKey]

    /// Creates a resolver over `keys`.
    public init(keys: [ConfigKey]) { self.keys = keys }

    /// `--config`, else `$BLAZEDB_CONFIG`, else `$XDG_CONFIG_HOME/blazedb/blazed.yaml` (`~/.config` when unset).
    /// The second value is true when the path was given explicitly (then it must exist).
    public static func configFilePath(flag: String?, environment: [String: String]) -> (path: String, explicit: Bool) {
        if let flag, !flag.isEmpty { return (flag, true) }
        if let env = environment["BLAZEDB_CONFIG"], !env.isEmpty { return (env, true) }
        let base =
            environment["XDG_CONFIG_HOME"].flatMap { $0.isEmpty ? nil : $0 }
            ?? ((environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? NSHomeDirectory()) + "/.config")
        return (base + "/blazedb/blazed.yaml", false)
    }

    /// The settings given on a command line as `--name value`, `--name=value`, `--name` (a switch: true) or
    /// `--no-name` (a switch: false), by setting name; anything else is an error naming the argument.
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
            }
            return "\(value)  [env \(key.environmentVariable)]\n    \(key.summary)"
        }.joined(separator: "\n")
    }

    /// Resolves every setting. `flags` maps setting names to the text given on the command line.
    public func resolve(flags: [String: String], environment: [String: String], configFile: String?) throws(ConfigError)
        -> ResolvedConfig
    {
        let (path, explicit) = Self.configFilePath(flag: configFile, environment: environment)
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
