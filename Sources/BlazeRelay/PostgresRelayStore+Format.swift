import PostgresNIO

/// The PostgreSQL schema's format version, kept in `relay_format`: a relay refuses a schema a newer build made, and
/// records its own once its tables are in place (the statements that make them are additive and idempotent, so an
/// older schema is brought up to date in place; take a `pg_dump` before upgrading a relay, as for any schema change).
extension PostgresRelayStore {
    /// The schema's format version this build writes (2 added `relay_formats`).
    public static let formatVersion = 2

    /// Refuses a schema of a newer format; call at the start of the migration's transaction, after its lock.
    func checkFormat(_ conn: PostgresConnection) async throws {
        try await conn.query("CREATE TABLE IF NOT EXISTS relay_format(version BIGINT NOT NULL)", logger: logger)
        let found = try await conn.query("SELECT max(version) FROM relay_format", logger: logger).decode(Int64?.self).all().first ?? nil
        if let found, found > Int64(Self.formatVersion) {
            throw RelayFormatError(
                "the PostgreSQL schema is format \(found), made by a newer blaze-relay; this build reads formats up to \(Self.formatVersion): upgrade blaze-relay to use it")
        }
    }

    /// Records this build's format once its tables are in place.
    func recordFormat(_ conn: PostgresConnection) async throws {
        try await conn.query("DELETE FROM relay_format", logger: logger)
        try await conn.query("INSERT INTO relay_format(version) VALUES (\(Int64(Self.formatVersion)))", logger: logger)
    }
}
