import GRDB

/// What `db.check` found in a database's file.
public struct DatabaseCheck: Sendable, Equatable {
    /// Schema migrations the file has had (its format, README "Upgrades and file formats").
    public var format: Int
    /// What SQLite's `quick_check` named (at most `BlazeDatabase.checkProblemsShown`); empty when the file is sound.
    public var problems: [String]
}

extension Store {
    /// Checks database `name`'s file (`BlazeDatabase.check`), opening it as any request does. A file the store
    /// cannot open (damaged, unreadable) is checked on its own through a read-only connection, and why it cannot be
    /// opened is its first problem; one of a newer format is refused as every request is (`database_too_new`).
    public func check(_ name: String) throws -> DatabaseCheck {
        do {
            return try database(name).check()
        } catch let error as StoreError where error.code == .notFound || ["invalid_name", "database_too_new"].contains(error.kind) {
            throw error
        } catch {
            var found = BlazeDatabase.check(path: path(name))
            let why = (error as? StoreError)?.message ?? (error as? DatabaseError).map { "SQLite: \($0.message ?? "\($0.resultCode)")" } ?? "\(error)"
            found.problems.insert("the daemon cannot open it: \(why)", at: 0)
            return found
        }
    }
}

extension BlazeDatabase {
    /// The most problems one check lists.
    public static let checkProblemsShown = 20

    /// Checks the file: its format, and SQLite's `quick_check` of every page, cell and index shape (it reads the whole
    /// file). A file too damaged to be read is reported as a problem, with SQLite's words, not thrown.
    public func check() throws -> DatabaseCheck {
        do {
            return try read(Self.check)
        } catch let error as DatabaseError {
            return DatabaseCheck(format: 0, problems: ["SQLite: \(error.message ?? "\(error.resultCode)")"])
        } catch let error as StoreError {
            return DatabaseCheck(format: 0, problems: [error.message])
        }
    }

    /// The checks of `check()` on a connection.
    static func check(_ db: Database) throws -> DatabaseCheck {
        let format = try Int.fetchOne(db, sql: "SELECT count(*) FROM grdb_migrations") ?? 0
        let rows = try String.fetchAll(db, sql: "PRAGMA quick_check(\(checkProblemsShown))")
        return DatabaseCheck(format: format, problems: rows == ["ok"] ? [] : rows)
    }

    /// Checks the file at `path` through a read-only connection of its own (a file the store could not open).
    static func check(path: String) -> DatabaseCheck {
        var configuration = Configuration()
        configuration.readonly = true
        do {
            return try DatabaseQueue(path: path, configuration: configuration).read(check)
        } catch let error as DatabaseError {
            return DatabaseCheck(format: 0, problems: ["SQLite: \(error.message ?? "\(error.resultCode)")"])
        } catch {
            return DatabaseCheck(format: 0, problems: ["\(error)"])
        }
    }
}
