import BlazeCRDT
import BlazeProtocol
import BlazeVector
import GRDB

/// Index definitions (a replicated register per index name) and changes parked until the ones before them arrive.
extension SQLStorage {
    func index(_ name: String) throws -> IndexState? {
        guard let text = try String.fetchOne(db, sql: "SELECT state FROM index_states WHERE name = ?", arguments: [name]),
            case .object(let o) = try JSONParser().parse(text), let stampJSON = o["s"], let stamp = Stamp(json: stampJSON),
            case .string(let collection)? = o["c"]
        else { return nil }
        let fields = o["f"]?.arrayValue?.compactMap(\.stringValue)
        return IndexState(stamp: stamp, collection: collection, fields: fields, vector: o["v"].map(IndexVector.init(json:)))
    }

    /// Stores the winning definition and makes the SQLite index match it; a built index dropped or changed away makes
    /// room for the definitions kept past the limits.
    func saveIndex(_ name: String, _ state: IndexState) throws {
        if try storeDefinition(name, state), try Int.fetchOne(db, sql: "SELECT count(*) FROM indexes WHERE name = ?", arguments: [name]) == 0 {
            try buildKeptIndexes()
        }
    }

    /// `saveIndex` without building kept definitions in the room it makes; true when the index was built before.
    private func storeDefinition(_ name: String, _ state: IndexState) throws -> Bool {
        var json: JSONValue = [
            "s": state.stamp.jsonValue, "c": .string(state.collection),
            "f": state.fields.map { .array($0.map(JSONValue.string)) } ?? .null,
        ]
        if let vector = state.vector, case .object(var o) = json {
            o["v"] = vector.jsonValue
            json = .object(o)
        }
        try db.execute(
            sql: "INSERT INTO index_states(name, state) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET state = excluded.state",
            arguments: [name, json.jsonText])
        // The same definition again (a newer stamp, or a replica sending it twice) keeps what is built: no rebuild.
        let fieldsText = state.fields.map { JSONValue.array($0.map(JSONValue.string)).jsonText }
        if let fieldsText, let built = try Row.fetchOne(db, sql: "SELECT collection, fields, vector FROM indexes WHERE name = ?", arguments: [name]),
            built[0] as String == state.collection, built[1] as String == fieldsText, built[2] as String? == state.vector?.jsonValue.jsonText
        {
            return false
        }
        let sqlName = WriteTransaction.sqlIndexName(name)
        try db.execute(sql: "DROP INDEX IF EXISTS \(sqlName)")
        if (try? Names.validateIndex(name)) != nil { try VectorIndexSQL.drop(name, in: db) }
        try db.execute(sql: "DELETE FROM indexes WHERE name = ?", arguments: [name])
        let wasBuilt = db.changesCount > 0
        if let fields = state.fields {
            // Definitions from other replicas are validated like local ones; an invalid one is stored but not built.
            guard (try? Names.validateCollection(state.collection)) != nil, (try? Names.validateIndex(name)) != nil,
                let paths = try? fields.map({ (f: String) throws(StoreError) -> FieldPath in try FieldPath(f) }),
                !paths.isEmpty, paths.count <= limits.maxIndexFields, Set(paths).count == paths.count
            else { return wasBuilt }
            if let vector = state.vector {
                guard paths.count == 1, VectorMetric(rawValue: vector.metric) != nil, vector.dimensions >= 1,
                    vector.dimensions <= VectorValue.maxDimensions
                else { return wasBuilt }
            }
            // Past the limits, a definition from another device is kept (the register above) and not built: a member
            // creating indexes by the thousand would otherwise slow every write on every device.
            if try Self.indexCapacityReached(vector: state.vector != nil, limits, db) != nil { return wasBuilt }
            try ensureCollection(state.collection)
            try db.execute(
                sql: "INSERT INTO indexes(name, collection, fields, created_at, vector) VALUES (?, ?, ?, ?, ?)",
                arguments: [
                    name, state.collection, JSONValue.array(fields.map(JSONValue.string)).jsonText,
                    Int64(state.stamp.hlc.milliseconds), state.vector?.jsonValue.jsonText,
                ])
            if let vector = state.vector {
                try VectorIndexSQL.build(name, collection: state.collection, path: paths[0], dimensions: vector.dimensions, in: db)
            } else {
                try db.execute(sql: Self.createIndexSQL(name: name, collection: state.collection, paths: paths))
            }
        }
        try BlazeDatabase.analyze(db)
        return wasBuilt
    }

    /// Why no more indexes (of the vector kind when `vector`) may be built in the database, or nil while they may.
    static func indexCapacityReached(vector: Bool, _ limits: StoreLimits, _ db: Database) throws -> String? {
        let row = try Row.fetchOne(db, sql: "SELECT count(*), count(vector) FROM indexes")
        let (all, vectors): (Int, Int) = (row?[0] ?? 0, row?[1] ?? 0)
        if all >= limits.maxIndexes { return "the database has \(all) indexes, the most it builds (\(limits.maxIndexes))" }
        if vector && vectors >= limits.maxVectorIndexes {
            return "the database has \(vectors) vector indexes, the most it builds (\(limits.maxVectorIndexes))"
        }
        return nil
    }

    /// The live definitions not built (kept past the limits, or invalid), of `collection` when given, by name.
    static func keptDefinitions(collection: String? = nil, _ db: Database) throws -> [String] {
        try String.fetchAll(
            db,
            sql: """
                SELECT name FROM index_states WHERE json_extract(state, '$.f') IS NOT NULL
                AND (?1 IS NULL OR json_extract(state, '$.c') = ?1) AND name NOT IN (SELECT name FROM indexes) ORDER BY name
                """, arguments: [collection])
    }

    /// Builds the definitions kept without being built (past the limits when they came), in name order, while the
    /// limits allow: after a built index was dropped or changed.
    private func buildKeptIndexes() throws {
        for name in try Self.keptDefinitions(db) where (try? Names.validateIndex(name)) != nil {
            // One that cannot be read is skipped: a kept definition must never stop a drop (local or received).
            guard let state = try? index(name), state.fields != nil else { continue }
            guard try Self.indexCapacityReached(vector: state.vector != nil, limits, db) == nil else {
                if state.vector == nil { return }
                continue
            }
            _ = try storeDefinition(name, state)
        }
    }

    /// The SQL that builds user index `name` (names validated by the caller).
    static func createIndexSQL(name: String, collection: String, paths: [FieldPath]) -> String {
        "CREATE INDEX \(WriteTransaction.sqlIndexName(name)) ON docs(\(QueryCompiler.indexColumns(paths))) "
            + "WHERE collection = '\(collection)'"
    }

    func park(_ change: Change) throws {
        try db.cachedStatement(sql: "INSERT OR REPLACE INTO parked(origin, seq, body) VALUES (?, ?, ?)").execute(
            arguments: [change.origin.hex, Int64(change.seq), change.jsonValue.jsonText])
    }

    func parked() throws -> [Change] {
        try String.fetchAll(db, sql: "SELECT body FROM parked").map { try Change(json: try JSONParser(maxDepth: 10_000).parse($0)) }
    }

    func parkedNext(_ vv: VersionVector) throws -> [Change] {
        var out: [Change] = []
        let probe = try db.cachedStatement(sql: "SELECT body FROM parked WHERE origin = ? AND seq = ?")
        for originHex in try String.fetchAll(db, sql: "SELECT DISTINCT origin FROM parked") {
            guard let origin = NodeID(hex: originHex),
                let body = try String.fetchOne(probe, arguments: [originHex, Int64(vv[origin] + 1)])
            else { continue }
            out.append(try Change(json: try JSONParser(maxDepth: 10_000).parse(body)))
        }
        return out
    }

    func parkedCount() throws -> Int {
        try Int.fetchOne(db, sql: "SELECT count(*) FROM parked") ?? 0
    }

    func hasParked() throws -> Bool {
        try Bool.fetchOne(db.cachedStatement(sql: "SELECT EXISTS(SELECT 1 FROM parked)")) ?? false
    }

    func unpark(origin: NodeID, seq: UInt64) throws {
        try db.cachedStatement(sql: "DELETE FROM parked WHERE origin = ? AND seq = ?").execute(
            arguments: [origin.hex, Int64(seq)])
    }
}

/// Indexes of a restored backup, built again from their definitions.
extension RestoreCheck {
    /// Builds every user index from its definition in `indexes` (after unknown indexes were dropped), within the
    /// limits: definitions past them (in name order; vector ones past theirs) stay kept in `index_states`, not built,
    /// as definitions received past the limits are.
    static func rebuildUserIndexes(_ db: Database, limits: StoreLimits) throws {
        try db.execute(
            sql: """
                DELETE FROM indexes WHERE name NOT IN (SELECT name FROM indexes WHERE vector IS NOT NULL ORDER BY name LIMIT ?)
                AND vector IS NOT NULL
                """, arguments: [limits.maxVectorIndexes])
        try db.execute(
            sql: "DELETE FROM indexes WHERE name NOT IN (SELECT name FROM indexes ORDER BY name LIMIT ?)", arguments: [limits.maxIndexes])
        // The file's sequence of vector rows is not kept: the rows are built again below.
        try db.execute(sql: "DELETE FROM sqlite_sequence WHERE name = 'vector_rows'")
        try VectorIndexSQL.rebuildAll(in: db)
        for row in try Row.fetchAll(db, sql: "SELECT name, collection, fields FROM indexes WHERE vector IS NULL") {
            let name: String = row[0], collection: String = row[1], fields: String = row[2]
            guard case .array(let list) = try JSONParser(maxDepth: 4).parse(fields) else { continue }
            let paths = try list.compactMap(\.stringValue).map { try FieldPath($0) }
            try db.execute(sql: "DROP INDEX IF EXISTS \(WriteTransaction.sqlIndexName(name))")
            try db.execute(sql: SQLStorage.createIndexSQL(name: name, collection: collection, paths: paths))
        }
    }
}
