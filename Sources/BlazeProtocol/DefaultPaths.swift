#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Where the daemon's socket and data live by default (ARCHITECTURE.md, "Local security"), shared by `blazed`,
/// `blazectl` and clients.
public enum DefaultPaths {
    /// Environment variable that overrides the socket path for clients and the daemon.
    public static let socketEnvironmentVariable = "BLAZEDB_SOCKET"

    /// `$BLAZEDB_SOCKET`, else `$XDG_RUNTIME_DIR/blazedb/blazed.sock`, else `/tmp/blazedb-$UID/blazed.sock`.
    public static func socketPath(environment: [String: String]) -> String {
        if let explicit = environment[socketEnvironmentVariable], !explicit.isEmpty { return explicit }
        if let runtime = environment["XDG_RUNTIME_DIR"], !runtime.isEmpty {
            return runtime + "/blazedb/blazed.sock"
        }
        return "/tmp/blazedb-\(getuid())/blazed.sock"
    }

    /// `$XDG_DATA_HOME/blazedb`, else `$HOME/.local/share/blazedb`.
    public static func dataDirectory(environment: [String: String]) -> String {
        if let data = environment["XDG_DATA_HOME"], !data.isEmpty { return data + "/blazedb" }
        let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? "/tmp/blazedb-home-\(getuid())"
        return home + "/.local/share/blazedb"
    }
}
