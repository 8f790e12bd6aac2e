/// A setting as code reads it: its `ConfigKey` (name, rule, help, built-in default) and how a resolved value becomes a
/// `Value`. The one definition of a setting: the program resolves it (flag, environment, file), lands it with a key
/// path (`DaemonConfig.landings`), and the library types take their defaults from `defaultValue`, so no default or name
/// is written twice.
public struct Setting<Value: Sendable>: Sendable {
    /// The untyped key the resolver works with.
    public let key: ConfigKey
    private let decode: @Sendable (ConfigValue) -> Value

    /// A setting of `key` whose values `decode` reads.
    public init(_ key: ConfigKey, decode: @escaping @Sendable (ConfigValue) -> Value) {
        self.key = key
        self.decode = decode
    }

    /// The setting's name: its flag without `--` and its file key.
    public var name: String { key.name }

    /// A resolved value of this setting (the resolver has checked it against the key's rule).
    public func value(_ resolved: ConfigValue) -> Value { decode(resolved) }

    /// The built-in default in an environment (only paths depend on it).
    public func defaultValue(environment: [String: String]) -> Value { decode(key.builtIn(environment)) }

    /// The built-in default, for settings whose default does not depend on the environment.
    public var defaultValue: Value { defaultValue(environment: [:]) }
}

extension Setting where Value == Int {
    /// A whole number from `min` to `max`.
    public static func int(
        _ name: String, min: Int, max: Int = .max, _ summary: String, default value: Int, prefix: String = "BLAZEDB_"
    ) -> Setting {
        precondition((min...max).contains(value), "the default of \(name) must keep its rule")
        return Setting(ConfigKey(name, .int(min: min, max: max), summary, prefix: prefix) { _ in .int(value) }) { $0.intValue }
    }

    /// A duration given in seconds (flag, environment, file) and read in milliseconds.
    public static func milliseconds(
        _ name: String, seconds range: ClosedRange<Double>, _ summary: String, default ms: Int, prefix: String = "BLAZEDB_"
    ) -> Setting {
        Setting(ConfigKey(name, .double(range), summary, prefix: prefix) { _ in .double(Double(ms) / 1000) }) { v in
            guard case .double(let seconds) = v else { preconditionFailure("\(v) is not a number of seconds") }
            return Int((seconds * 1000).rounded())
        }
    }
}

extension Setting where Value == Int? {
    /// A whole number from `min` on that may be left unset (nil: the program derives a value, as the summary says).
    public static func optionalInt(_ name: String, min: Int, max: Int = .max, _ summary: String, prefix: String = "BLAZEDB_")
        -> Setting
    {
        Setting(ConfigKey(name, .int(min: min, max: max), optional: true, summary, prefix: prefix) { _ in .none }) { v in
            if case .none = v { return nil }
            return v.intValue
        }
    }
}

extension Setting where Value == Bool {
    /// A switch (`--name`, `--no-name`).
    public static func flag(_ name: String, _ summary: String, default value: Bool, prefix: String = "BLAZEDB_") -> Setting {
        Setting(ConfigKey(name, .bool, summary, prefix: prefix) { _ in .bool(value) }) { v in
            guard case .bool(let b) = v else { preconditionFailure("\(v) is not a switch") }
            return b
        }
    }
}

extension Setting where Value == String {
    /// One of `words`.
    public static func choice(_ name: String, _ words: [String], _ summary: String, default value: String, prefix: String = "BLAZEDB_")
        -> Setting
    {
        precondition(words.contains(value), "the default of \(name) must be one of its words")
        return Setting(ConfigKey(name, .choice(words), summary, prefix: prefix) { _ in .string(value) }) { $0.textValue ?? value }
    }

    /// Text checked by `check`, whose default may depend on the environment (paths).
    public static func text(
        _ name: String, check: @escaping @Sendable (String) -> String?, _ summary: String, prefix: String = "BLAZEDB_",
        default value: @escaping @Sendable ([String: String]) -> String
    ) -> Setting {
        Setting(ConfigKey(name, .text(check: check), summary, prefix: prefix) { .string(value($0)) }) { $0.textValue ?? "" }
    }
}

extension Setting where Value == String? {
    /// Text checked by `check` that is unset by default.
    public static func optionalText(
        _ name: String, check: @escaping @Sendable (String) -> String?, _ summary: String, prefix: String = "BLAZEDB_"
    ) -> Setting {
        Setting(ConfigKey(name, .text(check: check), optional: true, summary, prefix: prefix) { _ in .none }) { $0.textValue }
    }
}

extension Setting where Value == [String] {
    /// A repeatable setting of texts, each checked by `check`; empty by default.
    public static func list(_ name: String, check: @escaping @Sendable (String) -> String?, _ summary: String, prefix: String = "BLAZEDB_")
        -> Setting
    {
        Setting(ConfigKey(name, .list(check: check), summary, prefix: prefix) { _ in .list([]) }) { v in
            if case .list(let items) = v { return items }
            return []
        }
    }
}

extension ConfigValue {
    /// The text of a text or choice setting, nil when unset.
    public var textValue: String? {
        if case .string(let s) = self { return s }
        return nil
    }

    /// The value of an integer setting (the resolver has checked the type).
    var intValue: Int {
        if case .int(let v) = self { return v }
        preconditionFailure("\(self) is not an integer setting")
    }
}
