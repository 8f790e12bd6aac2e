import Foundation
import PostgresNIO

/// How a relay reaches PostgreSQL: its `postgres` setting as a client configuration.
extension PostgresRelayStore {
    /// A client configuration from a `postgres://user[:password]@host[:port]/database` URL; `?host=/directory` (as
    /// libpq has it) reaches the server on its Unix socket in that directory, `?sslmode=require` asks for TLS.
    public static func configuration(url text: String) throws -> PostgresClient.Configuration {
        guard let url = URLComponents(string: text), ["postgres", "postgresql"].contains(url.scheme ?? "") else {
            throw RelayError("postgres must be a postgres:// URL (not repeated here: it may hold a password)")
        }
        let query = Dictionary((url.queryItems ?? []).map { ($0.name, $0.value ?? "") }, uniquingKeysWith: { $1 })
        let user = url.percentEncodedUser.flatMap { $0.removingPercentEncoding } ?? "postgres"
        let password = url.percentEncodedPassword.flatMap { $0.removingPercentEncoding }
        let path = url.path.hasPrefix("/") ? String(url.path.dropFirst()) : url.path
        let database = path.isEmpty ? user : path
        let port = url.port ?? Int(query["port"] ?? "") ?? 5432
        guard (1...65535).contains(port) else { throw RelayError("postgres: port \(port) is out of range") }
        if let socketDirectory = query["host"], socketDirectory.hasPrefix("/") {
            return .init(
                unixSocketPath: "\(socketDirectory)/.s.PGSQL.\(port)", username: user, password: password, database: database)
        }
        guard let host = url.host, !host.isEmpty else { throw RelayError("postgres: the URL names no host") }
        let tls: PostgresClient.Configuration.TLS
        switch query["sslmode"] ?? "disable" {
        case "disable": tls = .disable
        case "require", "verify-full": tls = .require(.makeClientConfiguration())
        case let mode: throw RelayError("postgres: sslmode \(mode) is not supported (disable, require, verify-full)")
        }
        return .init(host: host, port: port, username: user, password: password, database: database, tls: tls)
    }
}
