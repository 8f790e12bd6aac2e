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

    /// Stores the winning definition and makes the SQLite index match it.
    func saveIndex(_ name: String, _ state: IndexState) throws {
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
            return
        }
        let sqlName = WriteTransaction.sqlIndexName(name)
        try db.execute(sql: "DROP INDEX IF EXISTS \(sqlName)")
        if (try? Names.validateIndex(name)) != nil { try VectorIndexSQL.drop(name, in: db) }
        try db.execute(sql: "DELETE FROM indexes WHERE name = ?", arguments: [name])
        if let fields = state.fields {
            // Definitions from other replicas are validated like local ones; an invalid one is stored but not built.
            guard (try? Names.validateCollection(state.collection)) != nil, (try? Names.validateIndex(name)) != nil,
                let paths = try? fields.map({ (f: String) throws(StoreError) -> FieldPath in try FieldPath(f) })
            else { return }
            if let vector = state.vector {
                guard paths.count == 1, VectorMetric(rawValue: vector.metric) != nil, vector.dimensions >= 1,
                    vector.dimensions <= VectorValue.maxDimensions
                else { return }
            }
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
