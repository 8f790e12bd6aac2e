import BlazeProtocol
import Foundation

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
    /// A list of texts (a repeatable setting); empty when none is given.
    case list([String])
    /// Not set (only for optional settings).
    case none

    /// The value as it would be written in the configuration file.
    public var description: String {
        switch self {
        case .int(let v): String(v)
        case .double(let v): v == v.rounded() && abs(v) < 1e15 ? String(Int(v)) : String(v)
        case .string(let v): v
        case .bool(let v): v ? "true" : "false"
        case .list(let v): v.isEmpty ? "(none)" : v.joined(separator: ",")
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
        case .list(let v): .array(v.map { .string($0) })
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

/// One setting of a program (`blazed`, `blaze-relay`): its name (the flag without `--`, the file key), type, default
/// and rule. Programs read it through a typed `Setting`, which also gives the libraries their defaults.
public struct ConfigKey: Sendable {
    /// The kinds of value a setting takes.
    public enum Kind: Sendable {
        /// An integer from `min` to `max`.
        case int(min: Int, max: Int = Int.max)
        /// A number in a closed range.
        case double(ClosedRange<Double>)
        /// One of these words.
        case choice([String])
        /// Text, checked by `check` (nil when it is fine, else what is wrong).
        case text(check: @Sendable (String) -> String?)
        /// `true` or `false`.
        case bool
        /// Texts, each checked by `check`: a repeatable flag, a comma-separated environment variable or file scalar, or a
        /// YAML sequence in the file.
        case list(check: @Sendable (String) -> String?)
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
    /// The value as reports show it (`--print-config`, `daemon.config`): a secret part, such as a password in a URL,
    /// masked.
    public let shown: @Sendable (ConfigValue) -> ConfigValue
    /// The environment variable that sets it: the program's prefix (`BLAZEDB_`) and the name in capitals with `_` for
    /// `-`.
    public let environmentVariable: String

    /// Creates a setting; `prefix` starts its environment variable.
    public init(
        _ name: String, _ kind: Kind, optional: Bool = false, _ summary: String, prefix: String = "BLAZEDB_",
        shown: @escaping @Sendable (ConfigValue) -> ConfigValue = { $0 },
        builtIn: @escaping @Sendable ([String: String]) -> ConfigValue
    ) {
        self.shown = shown
        self.name = name
        self.kind = kind
        self.optional = optional
        self.summary = summary
        self.builtIn = builtIn
        self.environmentVariable = prefix + name.uppercased().replacingOccurrences(of: "-", with: "_")
    }

    /// Parses `text` (from a flag, the environment or a file scalar) into this setting's value.
    public func parse(_ text: String) -> Result<ConfigValue, ConfigError> {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if optional && (trimmed.isEmpty || trimmed == "none") { return .success(.none) }
        switch kind {
        case .int(let min, let max):
            guard let v = Int(trimmed.replacingOccurrences(of: "_", with: "")) else {
                return .failure(ConfigError("must be a whole number, got \"\(text)\""))
            }
            guard v >= min else { return .failure(ConfigError("must be at least \(min), got \(v)")) }
            guard v <= max else { return .failure(ConfigError("must be at most \(max), got \(v)")) }
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
        case .list:
            return parse(items: trimmed.split(separator: ",").map(String.init))
        }
    }

    /// Parses the items of a list setting (each item of a repeated flag, a comma-separated text or a YAML sequence).
    public func parse(items: [String]) -> Result<ConfigValue, ConfigError> {
        guard case .list(let check) = kind else { return .failure(ConfigError("takes a single value")) }
        var out: [String] = []
        for item in items.map({ $0.trimmingCharacters(in: .whitespaces) }) where !item.isEmpty {
            if let problem = check(item) { return .failure(ConfigError(problem)) }
            out.append(item)
        }
        return .success(.list(out))
    }
}

