import ArgumentParser
import BlazeClient
import BlazeProtocol

// blazectl find, nearest, count, explain, index and conflict.

/// A database and, optionally, one of its collections (for listings).
struct Scope: ParsableArguments {
    @Argument var db: String
    @Argument(help: "Only this collection.") var collection: String?
}

/// Arguments shared by find, count and explain.
struct QueryArgs: ParsableArguments {
    @Argument var db: String
    @Argument var collection: String
    @Argument(help: #"Filter as JSON, e.g. '{"age":{"$gt":30}}'."#) var filter: String?

    func params() -> [String: JSONValue] {
        var p: [String: JSONValue] = ["db": .string(db), "collection": .string(collection)]
        if let filter { p["where"] = parseJSON(filter, "filter") }
        return p
    }
}

struct Find: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Find documents; prints one JSON document per line.")
    @OptionGroup var global: Global
    @OptionGroup var query: QueryArgs
    @Option(help: "Comma-separated sort keys; prefix '-' for descending.") var sort: String?
    @Option(help: "Page size.") var limit: Int?
    @Option(help: "Resume token from a previous page.") var cursor: String?
    @Option(help: "Comma-separated fields to return.") var fields: String?

    func run() throws {
        var p = query.params()
        if let sort { p["sort"] = .array(sort.split(separator: ",").map { .string(String($0)) }) }
        if let limit { p["limit"] = .int(Int64(limit)) }
        if let cursor { p["cursor"] = .string(cursor) }
        if let fields { p["fields"] = .array(fields.split(separator: ",").map { .string(String($0)) }) }
        global.run(RPC.QueryFind.self, p) { r in
            for d in r.docs { print(d.jsonText) }
            if let next = r.cursor { print("-- more: --cursor \(next)") }
        }
    }
}

struct Nearest: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Find the documents whose vectors are nearest to a vector; prints DISTANCE and the document per line.")
    @OptionGroup var global: Global
    @Argument var db: String
    @Argument var collection: String
    @Argument(help: "Path of the field holding the vectors.") var field: String
    @Argument(help: "The query vector: a JSON array of numbers, or base64 of little-endian float32.") var vector: String
    @Option(help: "How many documents.") var k: Int = 10
    @Option(name: .customLong("where"), help: #"Only documents matching this filter, e.g. '{"kind":"photo"}'."#) var filter: String?
    @Option(help: "cosine, l2 or ip (default: the field's vector index's).") var metric: String?
    @Option(help: "Comma-separated fields to return.") var fields: String?

    func run() throws {
        var p: [String: JSONValue] = [
            "db": .string(db), "collection": .string(collection), "field": .string(field), "k": .int(Int64(k)),
            "vector": vector.hasPrefix("[") ? parseJSON(vector, "vector") : .string(vector),
        ]
        if let filter { p["where"] = parseJSON(filter, "filter") }
        if let metric { p["metric"] = .string(metric) }
        if let fields { p["fields"] = .array(fields.split(separator: ",").map { .string(String($0)) }) }
        global.run(RPC.QueryNearest.self, p) { r in
            for hit in r.results { print("\(hit.distance)\t\(hit.doc.jsonText)") }
        }
    }
}

struct Count: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Count matching documents.")
    @OptionGroup var global: Global
    @OptionGroup var query: QueryArgs
    func run() throws {
        global.run(RPC.QueryCount.self, query.params()) { print($0.count) }
    }
}

struct Explain: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show how a query runs and which indexes it uses.")
    @OptionGroup var global: Global
    @OptionGroup var query: QueryArgs
    @Option(help: "Comma-separated sort keys; prefix '-' for descending.") var sort: String?
    func run() throws {
        var p = query.params()
        if let sort { p["sort"] = .array(sort.split(separator: ",").map { .string(String($0)) }) }
        global.run(RPC.QueryExplain.self, p) { r in
            print("indexes: \(r.indexes.isEmpty ? "none (full scan)" : r.indexes.joined(separator: ", "))")
            for line in r.plan { print("plan:    \(line)") }
        }
    }
}

/// Arguments of the writes by filter: a required filter and a limit.
struct BulkArgs: ParsableArguments {
    @Argument var db: String
    @Argument var collection: String
    @Argument(help: #"Filter as JSON; '{}' matches every document."#) var filter: String
    @Option(help: "Write at most this many matching documents (in _id order).") var limit: Int?
    @Flag(help: "Print the ids written.") var ids = false

    func params() -> [String: JSONValue] {
        var p: [String: JSONValue] = ["db": .string(db), "collection": .string(collection), "where": parseJSON(filter, "filter")]
        if let limit { p["limit"] = .int(Int64(limit)) }
        if ids { p["returnIds"] = true }
        return p
    }
}

struct Update: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Patch every matching document atomically (one replicated change).",
        discussion: #"Example: blazectl update default todos '{"done":false}' --set '{"done":true}'"#)
    @OptionGroup var global: Global
    @OptionGroup var bulk: BulkArgs
    @OptionGroup var edits: PatchEdits
    func run() throws {
        global.run(RPC.QueryUpdate.self, edits.params(bulk.params())) { r in
            print("updated \(r.count)")
            for id in r.ids ?? [] { print(id) }
        }
    }
}

struct DeleteWhere: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "delete-where", abstract: "Delete every matching document atomically (one replicated change).")
    @OptionGroup var global: Global
    @OptionGroup var bulk: BulkArgs
    func run() throws {
        global.run(RPC.QueryDelete.self, bulk.params()) { r in
            print("deleted \(r.count)")
            for id in r.ids ?? [] { print(id) }
        }
    }
}

struct Index: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "index", abstract: "Create, drop and list indexes.", subcommands: [Create.self, Drop.self, List.self])

    struct Create: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create an index on one or more fields.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var collection: String
        @Argument(help: "Field paths, in index order.") var fields: [String]
        @Option(help: "Index name (default: collection.field...).") var name: String?
        @Option(help: "Make it a vector index of vectors of this many components (one field).") var dimensions: Int?
        @Option(help: "A vector index's metric: cosine (default), l2 or ip.") var metric: String = "cosine"
        func run() throws {
            var vector: RPCSchema.VectorIndexSpec?
            if let dimensions {
                guard let m = RPCSchema.VectorIndexSpec.Metric(rawValue: metric) else {
                    throw ValidationError("--metric is cosine, l2 or ip")
                }
                vector = .init(dimensions: dimensions, metric: m)
            }
            global.run(RPC.IndexCreate(db: db, collection: collection, fields: fields, name: name, vector: vector)) {
                print("created index \($0.name)")
            }
        }
    }

    struct Drop: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Drop an index.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var name: String
        func run() throws {
            global.run(RPC.IndexDrop(db: db, name: name)) { _ in print("dropped index \(name)") }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List indexes.")
        @OptionGroup var global: Global
        @OptionGroup var scope: Scope
        func run() throws {
            global.run(RPC.IndexList(db: scope.db, collection: scope.collection)) { r in
                printTable(
                    ["NAME", "COLLECTION", "FIELDS", "VECTOR"],
                    r.indexes.map { i in
                        [i.name, i.collection, i.fields.joined(separator: ","), i.vector.map { "\($0.dimensions)-d \($0.metric.rawValue)" } ?? ""]
                    })
            }
        }
    }
}

struct Conflict: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "conflict", abstract: "List and resolve fields where a concurrent write lost.",
        subcommands: [List.self, Resolve.self])

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List conflicted fields with both sides.")
        @OptionGroup var global: Global
        @OptionGroup var scope: Scope
        func run() throws {
            global.run(RPC.ConflictList(db: scope.db, collection: scope.collection)) { r in
                printTable(
                    ["COLLECTION", "ID", "FIELD", "VALUE", "LOST"],
                    r.conflicts.map { c in
                        let lost = c.losers.map { l in (l.unset ? "(unset)" : text(l.value)) + " from " + String(l.origin.prefix(8)) }
                        return [c.collection, c.id, c.field, c.present ? text(c.value) : "(absent)", lost.joined(separator: "; ")]
                    })
            }
        }
    }

    struct Resolve: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Resolve a field's conflict, keeping --value or the current value.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var collection: String
        @Argument var id: String
        @Argument var field: String
        @Option(help: "The value to keep, as JSON (default: the current value).") var value: String?
        func run() throws {
            var p: [String: JSONValue] = [
                "db": .string(db), "collection": .string(collection), "id": .string(id), "field": .string(field),
            ]
            if let value { p["value"] = parseJSON(value, "--value") }
            global.run(RPC.ConflictResolve.self, p) { _ in print("resolved \(collection)/\(id).\(field)") }
        }
    }
}
