import ArgumentParser
import Foundation
import BlazeClient
import BlazeProtocol

// blazectl doc and tx.

struct Doc: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "doc", abstract: "Insert, read, replace, patch and delete documents.",
        subcommands: [Insert.self, Get.self, GetMany.self, Put.self, Patch.self, Delete.self, History.self])

    struct Insert: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Insert a document; prints its id.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var collection: String
        @Argument(help: "The document as JSON.") var doc: String
        func run() throws {
            let p: [String: JSONValue] = ["db": .string(db), "collection": .string(collection), "doc": parseJSON(doc, "document")]
            global.run(RPC.DocInsert.self, p) { print($0.id) }
        }
    }

    struct Get: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print one document.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var collection: String
        @Argument var id: String
        @Option(help: "Comma-separated fields to return.") var fields: String?
        @Option(help: "The document as it was after this feed sequence (see 'doc history').") var at: Int?
        @Option(help: "The document as it was at this time (ISO 8601, e.g. 2026-11-24T10:00:00Z).") var atTime: String?
        func run() throws {
            let list = fields.map { $0.split(separator: ",").map(String.init) }
            var time: Int?
            if let atTime {
                guard let date = ISO8601DateFormatter().date(from: atTime) else {
                    fail("--at-time: not an ISO 8601 time: \(atTime)")
                }
                time = Int(date.timeIntervalSince1970 * 1000)
            }
            global.run(RPC.DocGet(db: db, collection: collection, id: id, fields: list, at: at, atTime: time)) {
                print($0.doc.prettyText())
            }
        }
    }

    struct History: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List the changes that touched a document, oldest first: feed seq, time applied, type, origin, paths changed.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var collection: String
        @Argument var id: String
        @Option(help: "Most entries.") var limit: Int?
        @Option(help: "Continue after this point (printed at the end of a page).") var cursor: String?
        func run() throws {
            global.run(RPC.DocHistory(db: db, collection: collection, id: id, limit: limit, cursor: cursor)) { r in
                for e in r.entries {
                    let time = e.appliedAt.map {
                        ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: Double($0) / 1000))
                    } ?? "-"
                    let changed = e.changed.isEmpty ? "" : " " + e.changed.joined(separator: ",")
                    print("\(e.seq) \(time) \(e.type.rawValue) \(e.origin.prefix(8))\(changed)")
                }
                if let next = r.cursor { print("-- more: --cursor \(next)") }
            }
        }
    }

    struct GetMany: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "get-many", abstract: "Print several documents.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var collection: String
        @Argument var ids: [String]
        func run() throws {
            global.run(RPC.DocGetMany(db: db, collection: collection, ids: ids)) { r in for d in r.docs { print(d.jsonText) } }
        }
    }

    struct Put: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create or replace a document (id from --id or _id).")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var collection: String
        @Argument(help: "The document as JSON.") var doc: String
        @Option(help: "Document id (else the document's _id).") var id: String?
        func run() throws {
            var p: [String: JSONValue] = [
                "db": .string(db), "collection": .string(collection), "doc": parseJSON(doc, "document"),
            ]
            if let id { p["id"] = .string(id) }
            global.run(RPC.DocPut.self, p) { r in print("\(r.id) \(r.created ? "created" : "replaced")") }
        }
    }

    struct Patch: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Edit fields by name or dotted path: set, unset, counter increments, set additions and removals.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var collection: String
        @Argument var id: String
        @OptionGroup var edits: PatchEdits
        func run() throws {
            let p = edits.params(["db": .string(db), "collection": .string(collection), "id": .string(id)])
            global.run(RPC.DocPatch.self, p) { print("patched \($0.id)") }
        }
    }

    struct Delete: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete a document.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var collection: String
        @Argument var id: String
        func run() throws {
            global.run(RPC.DocDelete(db: db, collection: collection, id: id)) { print("deleted \($0.id)") }
        }
    }
}

struct Tx: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Commit several operations atomically.",
        discussion: #"Example: blazectl tx default '[{"op":"insert","collection":"t","doc":{"a":1}}]'"#)
    @OptionGroup var global: Global
    @Argument var db: String
    @Argument(help: "A JSON array of operations.") var ops: String
    func run() throws {
        global.run(RPC.TxCommit.self, ["db": .string(db), "ops": parseJSON(ops, "ops")]) { r in
            for item in r.results { print(item.id) }
        }
    }
}

/// The edits of `doc patch` and `update`: fields by name or dotted path.
struct PatchEdits: ParsableArguments {
    @Option(help: #"Fields to set, as a JSON object: '{"address.city":"Oslo"}'."#) var set: String?
    @Option(help: "A field to remove (repeatable).") var unset: [String] = []
    @Option(help: #"Counter increments, as a JSON object: '{"views":1}'."#) var incr: String?
    @Option(help: #"Set additions, as a JSON object of arrays: '{"tags":["a"]}'."#) var add: String?
    @Option(help: #"Set removals, as a JSON object of arrays: '{"tags":["a"]}'."#) var remove: String?

    /// `base` with the edits given.
    func params(_ base: [String: JSONValue]) -> [String: JSONValue] {
        var p = base
        if let set { p["set"] = parseJSON(set, "--set") }
        if !unset.isEmpty { p["unset"] = .array(unset.map(JSONValue.string)) }
        if let incr { p["incr"] = parseJSON(incr, "--incr") }
        if let add { p["add"] = parseJSON(add, "--add") }
        if let remove { p["remove"] = parseJSON(remove, "--remove") }
        return p
    }
}
