import BlazeSettings

extension BlazedSettings {
    /// The resolver of `blazed`'s settings: `BLAZEDB_<NAME>`, `$XDG_CONFIG_HOME/blazedb/blazed.yaml`, `BLAZEDB_CONFIG`.
    public static let resolver = ConfigResolver(keys: keys)
}

extension RelaySettings {
    /// The resolver of `blaze-relay`'s settings: `BLAZE_RELAY_<NAME>`, `$XDG_CONFIG_HOME/blazedb/relay.yaml`,
    /// `BLAZE_RELAY_CONFIG`.
    public static let resolver = ConfigResolver(keys: keys, fileName: "relay.yaml", fileVariable: "BLAZE_RELAY_CONFIG")
}
