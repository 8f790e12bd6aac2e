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
        m.registerMigration("v2-replication") { db in
            try db.execute(
                sql: """
                    CREATE TABLE crdt_docs(
                        collection TEXT NOT NULL,
                        id TEXT NOT NULL,
                        state TEXT NOT NULL,
                        conflicted INTEGER NOT NULL DEFAULT 0,
                        PRIMARY KEY(collection, id)
                    ) WITHOUT ROWID;
                    CREATE INDEX crdt_docs_conflicted ON crdt_docs(collection, id) WHERE conflicted = 1;
                    CREATE TABLE changes(
                        origin TEXT NOT NULL,
                        seq INTEGER NOT NULL,
                        hlc INTEGER NOT NULL,
                        body TEXT NOT NULL,
                        PRIMARY KEY(origin, seq)
                    ) WITHOUT ROWID;
                    CREATE TABLE versions(origin TEXT PRIMARY KEY NOT NULL, seq INTEGER NOT NULL) WITHOUT ROWID;
                    CREATE TABLE parked(
                        origin TEXT NOT NULL,
                        seq INTEGER NOT NULL,
                        body TEXT NOT NULL,
                        PRIMARY KEY(origin, seq)
                    ) WITHOUT ROWID;
                    CREATE TABLE index_states(name TEXT PRIMARY KEY NOT NULL, state TEXT NOT NULL) WITHOUT ROWID;
                    """)
        }
        m.registerMigration("v3-feed") { db in
            // The local change feed: one row per applied change, `seq` the local sequence subscribers resume from.
            try db.execute(
                sql: """
                    CREATE TABLE feed(
                        seq INTEGER PRIMARY KEY,
                        origin TEXT NOT NULL,
                        events TEXT NOT NULL
                    );
                    """)
        }
        m.registerMigration("v4-sync") { db in
            // Sealed entries (ciphertext, as they travel) per origin, the heads their origins signed, and the peers
            // this database syncs with. The space id lives in `meta` ('space_id'); its key is in the keystore.
            try db.execute(
                sql: """
                    CREATE TABLE sync_entries(
                        origin BLOB NOT NULL,
                        seq INTEGER NOT NULL,
                        hash BLOB NOT NULL,
                        bytes BLOB NOT NULL,
                        PRIMARY KEY(origin, seq)
                    ) WITHOUT ROWID;
                    CREATE TABLE sync_heads(
                        origin BLOB NOT NULL,
                        seq INTEGER NOT NULL,
                        head BLOB NOT NULL,
                        PRIMARY KEY(origin, seq)
                    ) WITHOUT ROWID;
                    CREATE TABLE sync_peers(
                        address TEXT PRIMARY KEY NOT NULL,
                        added_at INTEGER NOT NULL
                    ) WITHOUT ROWID;
                    """)
        }
        m.registerMigration("v5-state-in-docs") { db in
            // Each live document's CRDT state moves into its `docs` row, so a write touches one row and a new document
            // is one insert. Deleted documents keep their state in `tombstones`: they never enter `docs`, its user
            // indexes or its counts. `state` is NULL only for data from before replication, until it is adopted.
            try db.execute(
                sql: """
                    ALTER TABLE docs ADD COLUMN state TEXT;
                    ALTER TABLE docs ADD COLUMN conflicted INTEGER NOT NULL DEFAULT 0;
                    UPDATE docs SET
                        state = (SELECT c.state FROM crdt_docs c WHERE c.collection = docs.collection AND c.id = docs.id),
                        conflicted = coalesce(
                            (SELECT c.conflicted FROM crdt_docs c WHERE c.collection = docs.collection AND c.id = docs.id), 0);
                    CREATE TABLE tombstones(
                        collection TEXT NOT NULL,
                        id TEXT NOT NULL,
                        state TEXT NOT NULL,
                        PRIMARY KEY(collection, id)
                    ) WITHOUT ROWID;
                    INSERT INTO tombstones(collection, id, state)
                        SELECT c.collection, c.id, c.state FROM crdt_docs c
                        WHERE NOT EXISTS (SELECT 1 FROM docs d WHERE d.collection = c.collection AND d.id = c.id);
                    DROP TABLE crdt_docs;
                    CREATE INDEX docs_conflicted ON docs(collection, id) WHERE conflicted = 1;
                    """)
        }
        m.registerMigration("v6-logs-keep-rowids") { db in
            // The logs hold large rows (one change, or one sealed change, per row: a transaction of a thousand
            // documents is hundreds of kilobytes). In a WITHOUT ROWID table the row is the key, and SQLite reads a
            // key that overflows its page whole to compare it, so each insert read the bodies it passed while
            // searching. As rowid tables, the rows stay where they are and only (origin, seq) lives in the index.
            try db.execute(
                sql: """
                    ALTER TABLE changes RENAME TO changes_v5;
                    CREATE TABLE changes(
                        origin TEXT NOT NULL,
                        seq INTEGER NOT NULL,
                        hlc INTEGER NOT NULL,
                        body TEXT NOT NULL,
                        PRIMARY KEY(origin, seq)
                    );
                    INSERT INTO changes(origin, seq, hlc, body)
                        SELECT origin, seq, hlc, body FROM changes_v5 ORDER BY origin, seq;
                    DROP TABLE changes_v5;
                    ALTER TABLE parked RENAME TO parked_v5;
                    CREATE TABLE parked(
                        origin TEXT NOT NULL,
                        seq INTEGER NOT NULL,
                        body TEXT NOT NULL,
                        PRIMARY KEY(origin, seq)
                    );
                    INSERT INTO parked(origin, seq, body) SELECT origin, seq, body FROM parked_v5 ORDER BY origin, seq;
                    DROP TABLE parked_v5;
                    ALTER TABLE sync_entries RENAME TO sync_entries_v5;
                    CREATE TABLE sync_entries(
                        origin BLOB NOT NULL,
                        seq INTEGER NOT NULL,
                        hash BLOB NOT NULL,
                        bytes BLOB NOT NULL,
                        PRIMARY KEY(origin, seq)
                    );
                    INSERT INTO sync_entries(origin, seq, hash, bytes)
                        SELECT origin, seq, hash, bytes FROM sync_entries_v5 ORDER BY origin, seq;
                    DROP TABLE sync_entries_v5;
                    """)
        }
        m.registerMigration("v7-fork-evidence") { db in
            // One row per forked origin: the entry held here and the other one its device also signed (the head
            // over it). A forked origin is quarantined: nothing more of it is accepted until the user acts.
            try db.execute(
                sql: """
                    CREATE TABLE sync_forks(
                        origin BLOB PRIMARY KEY NOT NULL,
                        seq INTEGER NOT NULL,
                        held_hash BLOB NOT NULL,
                        other_hash BLOB NOT NULL,
                        other_head BLOB NOT NULL,
                        detected_at INTEGER NOT NULL
                    ) WITHOUT ROWID;
                    """)
        }
        m.registerMigration("v8-membership") { db in
            // The space's membership log as opaque signed operations (BlazeCrypto decodes and resolves them), and the
            // invites this device issued: only a hash of each invite's secret is kept, and a used one stays, marked.
            try db.execute(
                sql: """
                    CREATE TABLE sync_membership(
                        hash BLOB PRIMARY KEY NOT NULL,
                        bytes BLOB NOT NULL,
                        received_at INTEGER NOT NULL
                    ) WITHOUT ROWID;
                    CREATE TABLE sync_invites(
                        id BLOB PRIMARY KEY NOT NULL,
                        secret_hash BLOB NOT NULL,
                        role TEXT NOT NULL,
                        created_at INTEGER NOT NULL,
                        expires_at INTEGER NOT NULL,
                        used_at INTEGER,
                        used_by BLOB
                    ) WITHOUT ROWID;
                    """)
        }
        m.registerMigration("v9-sync-folders") { db in
            // The shared folders a database syncs through (SYNC.md §10): the generation of this device's head file in
            // each, and the highest generation seen of every other writer's head file there, so that a folder tool
            // handing back an older copy is detected across restarts.
            try db.execute(
                sql: """
                    CREATE TABLE sync_folders(
                        path TEXT PRIMARY KEY NOT NULL,
                        added_at INTEGER NOT NULL,
                        generation INTEGER NOT NULL DEFAULT 0
                    ) WITHOUT ROWID;
                    CREATE TABLE sync_folder_heads(
                        path TEXT NOT NULL,
                        writer BLOB NOT NULL,
                        generation INTEGER NOT NULL,
                        PRIMARY KEY(path, writer)
                    ) WITHOUT ROWID;
                    """)
        }
        m.registerMigration("v10-compaction") { db in
            // Compaction (SYNC.md §11). A tombstone names the change that deleted its document, so that it can be
            // dropped once that change is stable (NULL for tombstones from before: they are kept). `sync_pruned`
            // keeps, per origin, the last entry this device no longer holds and its hash: the chain head later
            // entries link to (32 zero bytes when the chain starts after it: changes pruned before the database was
            // shared).
            try db.execute(
                sql: """
                    ALTER TABLE tombstones ADD COLUMN del_origin TEXT;
                    ALTER TABLE tombstones ADD COLUMN del_seq INTEGER;
                    CREATE INDEX tombstones_deleted_by ON tombstones(del_origin, del_seq) WHERE del_origin IS NOT NULL;
                    CREATE TABLE sync_pruned(
                        origin BLOB PRIMARY KEY NOT NULL,
                        seq INTEGER NOT NULL,
                        hash BLOB NOT NULL
                    ) WITHOUT ROWID;
                    CREATE TABLE sync_acks(
                        node BLOB PRIMARY KEY NOT NULL,
                        issued_at INTEGER NOT NULL,
                        bytes BLOB NOT NULL
                    ) WITHOUT ROWID;
                    """)
        }
        m.registerMigration("v11-feed-events") { db in
            // The feed's retention counts document events, not changes (one bulk transaction is many events): `total`
            // is the number of events up to and including the row. Rows from before have none and go first.
            try db.execute(sql: "ALTER TABLE feed ADD COLUMN total INTEGER; CREATE INDEX feed_total ON feed(total);")
        }
        m.registerMigration("v12-feed-without-total-index") { db in
            // `total` grows with `seq`: pruning finds its point by binary search over the rowid, and the index cost
            // each feed row about an eighth of its size.
            try db.execute(sql: "DROP INDEX feed_total")
        }
        m.registerMigration("v13-feed-history") { db in
            // What `doc.history` tells about each change: its sequence from its origin, its clock, and when this
            // replica applied it (Unix milliseconds; `doc.get` with `atTime`). Rows from before have none.
            try db.execute(
                sql: "ALTER TABLE feed ADD COLUMN change_seq INTEGER; ALTER TABLE feed ADD COLUMN hlc INTEGER; "
                    + "ALTER TABLE feed ADD COLUMN applied_at INTEGER;")
        }
        m.registerMigration("v14-invite-verifier") { db in
            // An invite keeps what checks a join proof and cannot make one: the public half of a key derived from its
            // secret (proof version 2). Invites issued before keep SHA-256 of the secret, their proof's HMAC key
            // (version 1), until they are used or expire.
            try db.execute(
                sql: "ALTER TABLE sync_invites RENAME COLUMN secret_hash TO verifier; "
                    + "ALTER TABLE sync_invites ADD COLUMN proof_version INTEGER NOT NULL DEFAULT 1;")
        }
        m.registerMigration("v15-blob-pins") { db in
            // The blobs this device was asked to keep (`blob.pin`): fetched and kept whatever refers to them.
            try db.execute(sql: "CREATE TABLE blob_pins(id TEXT PRIMARY KEY NOT NULL, pinned_at INTEGER NOT NULL) WITHOUT ROWID")
        }
        m.registerMigration("v16-vectors") { db in
            // Vector indexes: their shape beside the definition (`{"d": dimensions, "m": metric}`, NULL for an index
            // of values), and their rows, derived from the documents by triggers (`VectorIndexSQL`).
            try db.execute(
                sql: """
                    ALTER TABLE indexes ADD COLUMN vector TEXT;
                    CREATE TABLE vector_rows(
                        seq INTEGER PRIMARY KEY AUTOINCREMENT,
                        idx TEXT NOT NULL,
                        doc INTEGER NOT NULL,
                        v BLOB
                    );
                    CREATE INDEX vector_rows_doc ON vector_rows(idx, doc);
                    """)
        }
        m.registerMigration("v17-entry-formats") { db in
            // Members' signed statements of the entry formats they open (SYNC.md §6, "Entry formats"): the latest of
            // each, opaque here like `sync_acks`.
            try db.execute(
                sql: "CREATE TABLE sync_formats(node BLOB PRIMARY KEY NOT NULL, issued_at INTEGER NOT NULL, bytes BLOB NOT NULL) WITHOUT ROWID")
        }
        return m
    }
}
