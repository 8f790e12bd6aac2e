import GRDB

/// The daemon's own tables in each database file. Migrations are append-only: never edit a shipped one.
enum Schema {
    static var migrator: DatabaseMigrator {
        var m = DatabaseMigrator()
        m.registerMigration("v1") { db in
            try db.execute(
                sql: """
                    CREATE TABLE meta(key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL) WITHOUT ROWID;
                    CREATE TABLE collections(
                        name TEXT PRIMARY KEY NOT NULL,
                        created_at INTEGER NOT NULL
                    ) WITHOUT ROWID;
                    CREATE TABLE docs(
                        rowid INTEGER PRIMARY KEY,
                        collection TEXT NOT NULL,
                        id TEXT NOT NULL,
                        body TEXT NOT NULL,
                        UNIQUE(collection, id)
                    );
                    CREATE TABLE indexes(
                        name TEXT PRIMARY KEY NOT NULL,
                        collection TEXT NOT NULL,
                        fields TEXT NOT NULL,
                        created_at INTEGER NOT NULL
                    ) WITHOUT ROWID;
                    """)
        }
        return m
    }
}
