import ArgumentParser
import BlazeClient
import BlazeConfig
import BlazeProtocol
import Foundation

#if canImport(Glibc)
import Glibc
#endif

@main
struct BlazeCtl: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "blazectl",
        abstract: "Control blazed, the BlazeDB daemon, from the shell.",
        discussion: "Values in key=value arguments are read as JSON when they parse (limit=5 is a number), else as strings.",
        subcommands: [
            Call.self, Info.self, DB.self, Collection.self, Doc.self, Tx.self, Find.self, Count.self, Explain.self,
            Index.self, Conflict.self, Watch.self, Peer.self, Sync.self, Status.self, Config.self, Service.self,
        ])
}

/// Options every subcommand shares.
struct Global: ParsableArguments {
    @Option(help: "Daemon socket (default: $BLAZEDB_SOCKET, else $XDG_RUNTIME_DIR/blazedb/blazed.sock).")
    var socket: String?

    @Flag(help: "Print the exact JSON result instead of human output.")
    var json = false

    /// `--socket`, else the daemon's `socket` setting (`BLAZEDB_SOCKET`, the configuration file, the default).
    var socketPath: String {
        if let socket { return socket }
        do {
            let settings = try BlazedSettings.resolver.resolve(
                flags: [:], environment: ProcessInfo.processInfo.environment, configFile: nil)
            return settings.string("socket")!
        } catch {
            fail("\(error)")
        }
    }

    /// Calls a method, printing a one-line error and exiting non-zero on failure.
    func call(_ method: String, _ params: [String: JSONValue]) throws -> JSONValue {
        withConnection { try $0.call(method, params) }
    }

    /// Runs `body` on a new connection; any error is printed as one line and exits non-zero.
    func withConnection<T>(_ body: (BlazeConnection) throws -> T) -> T {
        do {
            let connection = try BlazeConnection(socketPath: socketPath)
            defer { connection.close() }
            return try body(connection)
        } catch let e as RPCError {
            fail(describe(e))
        } catch {
            fail("\(error)")
        }
    }

    /// Prints `result` as JSON with --json, else with `human`.
    func output(_ result: JSONValue, human: (JSONValue) -> Void) {
        if json { print(result.jsonText) } else { human(result) }
    }
}

/// Writes one line to standard output at once (no stdio buffering).
func emit(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    var offset = 0
    while offset < bytes.count {
        let n = bytes[offset...].withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
        if n <= 0 { exit(0) }  // stdout closed (e.g. piped into head): stop quietly
        offset += n
    }
}

/// "message [code kind]", how blazectl shows a daemon error.
func describe(_ e: RPCError) -> String { "\(e.message) [\(e.code) \(e.kind)]" }

/// Writes `text` to standard error.
func printError(_ text: String) {
    _ = Array(text.utf8).withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
}

func fail(_ message: String) -> Never {
    printError("blazectl: error: \(message)\n")
    exit(1)
}

/// Parses a JSON argument, failing with a one-line error naming the argument.
func parseJSON(_ text: String, _ what: String) -> JSONValue {
    do { return try JSONParser().parse(text) } catch { fail("\(what) is not valid JSON: \(error)") }
}

/// Prints rows as an aligned table with a header.
func printTable(_ header: [String], _ rows: [[String]]) {
    print(TextTable.render(header, rows))
}

/// Pads `s` with spaces to `width` characters.
func pad(_ s: String, _ width: Int) -> String {
    s.count >= width ? s : s + String(repeating: " ", count: width - s.count)
}

func text(_ v: JSONValue?) -> String {
    switch v {
    case nil: return ""
    case .string(let s)?: return s
    case let other?: return other.jsonText
    }
}

struct Call: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Call any method: blazectl call doc.get db=default collection=todos id=1")
    @OptionGroup var global: Global
    @Argument(help: "Method name, e.g. query.find.") var method: String
    @Argument(help: "Parameters as key=value; values are JSON when they parse, else strings.") var params: [String] = []

    func run() throws {
        var p: [String: JSONValue] = [:]
        for item in params {
            guard let eq = item.firstIndex(of: "=") else { fail("parameter \"\(item)\" must be key=value") }
            let key = String(item[..<eq])
            let raw = String(item[item.index(after: eq)...])
            p[key] = (try? JSONParser().parse(raw)) ?? .string(raw)
        }
        let result = try global.call(method, p)
        global.output(result) { print($0.prettyText()) }
    }
}

struct Info: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show daemon version, paths and limits.")
    @OptionGroup var global: Global

    func run() throws {
        global.output(try global.call("daemon.info", [:])) { r in
            for key in ["version", "nodeId", "pid", "socket", "dataDir", "databases", "uptimeSeconds"] {
                print("\(pad(key, 14))\(text(r[key]))")
            }
        }
    }
}

struct DB: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "db", abstract: "Create, list, inspect and drop databases.",
        subcommands: [Create.self, List.self, InfoCmd.self, Drop.self, Share.self, Join.self, Backup.self, Restore.self])

    struct Share: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Share a database: print the secret token another device joins with.",
            discussion: "Anyone holding the token can read and write the database. Send it only over a channel you trust.")
        @OptionGroup var global: Global
        @Argument var name: String
        func run() throws {
            global.output(try global.call("db.share", ["db": .string(name)])) { r in
                print(text(r["token"]))
                printError("blazectl: this token is a secret: whoever holds it can read and write \(name)\n")
            }
        }
    }

    struct Join: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create a local replica of a shared database from its token, then add a peer to sync it.")
        @OptionGroup var global: Global
        @Argument(help: "The token printed by 'blazectl db share' on the other device.") var token: String
        @Argument(help: "Name of the new local database (default: shared-<space id prefix>).") var name: String?
        func run() throws {
            var params: [String: JSONValue] = ["token": .string(token)]
            if let name { params["db"] = .string(name) }
            global.output(try global.call("db.join", params)) { r in
                print("joined space \(text(r["space"])) as database \(text(r["db"]))")
            }
        }
    }

    struct Create: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create a database.")
        @OptionGroup var global: Global
        @Argument var name: String
        func run() throws {
            global.output(try global.call("db.create", ["db": .string(name)])) { _ in print("created database \(name)") }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List databases.")
        @OptionGroup var global: Global
        func run() throws {
            global.output(try global.call("db.list", [:])) { r in
                printTable(["NAME"], (r["databases"]?.arrayValue ?? []).map { [text($0["name"])] })
            }
        }
    }

    struct InfoCmd: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "info", abstract: "Show a database's counts and size.")
        @OptionGroup var global: Global
        @Argument var name: String
        func run() throws {
            global.output(try global.call("db.info", ["db": .string(name)])) { r in
                for key in ["name", "collections", "documents", "sizeBytes", "path", "nodeId", "stateHash"] {
                    print("\(pad(key, 13))\(text(r[key]))")
                }
            }
        }
    }

    struct Drop: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete a database and all its data.")
        @OptionGroup var global: Global
        @Argument var name: String
        func run() throws {
            global.output(try global.call("db.drop", ["db": .string(name)])) { _ in print("dropped database \(name)") }
        }
    }
}

struct Peer: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "peer", abstract: "Add, remove and list the peers a shared database syncs with.",
        subcommands: [Add.self, Remove.self, List.self])

    struct Add: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Sync a shared database with the daemon at host:port.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument(help: "host:port of the peer's --sync-listen.") var address: String
        func run() throws {
            global.output(try global.call("peer.add", ["db": .string(db), "address": .string(address)])) { r in
                print(r["added"] == true ? "added peer \(text(r["address"])) to \(db)" : "\(text(r["address"])) was already a peer of \(db)")
            }
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Stop syncing a database with a peer.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var address: String
        func run() throws {
            global.output(try global.call("peer.remove", ["db": .string(db), "address": .string(address)])) { r in
                print(r["removed"] == true ? "removed peer \(text(r["address"]))" : "\(text(r["address"])) was not a peer of \(db)")
            }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List a database's peers.")
        @OptionGroup var global: Global
        @Argument var db: String
        func run() throws {
            global.output(try global.call("peer.list", ["db": .string(db)])) { r in
                printTable(
                    ["ADDRESS", "CONNECTED"],
                    (r["peers"]?.arrayValue ?? []).map { [text($0["address"]), $0["connected"] == true ? "yes" : "no"] })
            }
        }
    }
}

struct Sync: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sync", abstract: "Show and control sync of shared databases.",
        subcommands: [Status.self, Now.self, Pause.self, Resume.self])

    struct Status: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Per database and peer: connection, progress, errors.")
        @OptionGroup var global: Global
        @Argument var db: String?
        func run() throws {
            global.output(try global.call("sync.status", db.map { ["db": .string($0)] } ?? [:])) { r in
                print("listening on \(r["listen"]?.stringValue ?? "(not listening)")")
                var rows: [[String]] = []
                for d in r["databases"]?.arrayValue ?? [] {
                    let peers = d["peers"]?.arrayValue ?? []
                    if peers.isEmpty { rows.append([text(d["db"]), "-", d["paused"] == true ? "paused" : "-", "", "", "", ""]) }
                    for p in peers {
                        let rejected = (p["rejected"]?.objectValue ?? [:]).sorted { $0.key < $1.key }.map { "\($0.key)=\(text($0.value))" }
                        rows.append([
                            text(d["db"]), text(p["peer"]),
                            d["paused"] == true ? "paused" : p["connected"] == true ? "connected" : "disconnected",
                            text(p["sentEntries"]), text(p["receivedEntries"]), text(p["errors"]), rejected.joined(separator: " "),
                        ])
                    }
                }
                printTable(["DB", "PEER", "STATE", "SENT", "RECEIVED", "ERRORS", "REJECTED"], rows)
                let refused = [("strangers refused", r["strangersRefused"]), ("over connection limits", r["refusedOverLimit"])]
                    .filter { ($0.1?.intValue ?? 0) > 0 }.map { "\($0.0): \(text($0.1))" }
                if !refused.isEmpty { print("inbound: " + refused.joined(separator: ", ")) }
                for d in r["databases"]?.arrayValue ?? [] {
                    for f in d["forks"]?.arrayValue ?? [] {
                        print(
                            "FORK in \(text(d["db"])): origin \(text(f["origin"])) signed two entries for seq \(text(f["seq"])) "
                                + "(held \(text(f["heldHash"]).prefix(16))…, other \(text(f["otherHash"]).prefix(16))…); "
                                + "the origin is quarantined")
                    }
                }
            }
        }
    }

    struct Now: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Connect to every peer of a database now.")
        @OptionGroup var global: Global
        @Argument var db: String
        func run() throws {
            global.output(try global.call("sync.now", ["db": .string(db)])) { _ in print("syncing \(db)") }
        }
    }

    struct Pause: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Pause sync of a database until resumed.")
        @OptionGroup var global: Global
        @Argument var db: String
        func run() throws {
            global.output(try global.call("sync.pause", ["db": .string(db)])) { _ in print("paused sync of \(db)") }
        }
    }

    struct Resume: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Resume sync of a paused database.")
        @OptionGroup var global: Global
        @Argument var db: String
        func run() throws {
            global.output(try global.call("sync.resume", ["db": .string(db)])) { _ in print("resumed sync of \(db)") }
        }
    }
}

struct Collection: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "collection", abstract: "List collections.", subcommands: [List.self])

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the collections of a database.")
        @OptionGroup var global: Global
        @Argument var db: String
        func run() throws {
            global.output(try global.call("collection.list", ["db": .string(db)])) { r in
                printTable(["NAME", "DOCUMENTS"], (r["collections"]?.arrayValue ?? []).map { [text($0["name"]), text($0["count"])] })
            }
        }
    }
}

struct Doc: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "doc", abstract: "Insert, read, replace, patch and delete documents.",
        subcommands: [Insert.self, Get.self, GetMany.self, Put.self, Patch.self, Delete.self])

    struct Insert: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Insert a document; prints its id.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var collection: String
        @Argument(help: "The document as JSON.") var doc: String
        func run() throws {
            let r = try global.call(
                "doc.insert", ["db": .string(db), "collection": .string(collection), "doc": parseJSON(doc, "document")])
            global.output(r) { print(text($0["id"])) }
        }
    }

    struct Get: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print one document.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var collection: String
        @Argument var id: String
        @Option(help: "Comma-separated fields to return.") var fields: String?
        func run() throws {
            var p: [String: JSONValue] = ["db": .string(db), "collection": .string(collection), "id": .string(id)]
            if let fields { p["fields"] = .array(fields.split(separator: ",").map { .string(String($0)) }) }
            global.output(try global.call("doc.get", p)) { print(($0["doc"] ?? .null).prettyText()) }
        }
    }

    struct GetMany: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "get-many", abstract: "Print several documents.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var collection: String
        @Argument var ids: [String]
        func run() throws {
            let r = try global.call(
                "doc.getMany",
                ["db": .string(db), "collection": .string(collection), "ids": .array(ids.map(JSONValue.string))])
            global.output(r) { r in for d in r["docs"]?.arrayValue ?? [] { print(d.jsonText) } }
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
            let r = try global.call("doc.put", p)
            global.output(r) { r in print("\(text(r["id"])) \(r["created"] == true ? "created" : "replaced")") }
        }
    }

    struct Patch: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Edit top-level fields: set, unset, counter increments, set additions and removals.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var collection: String
        @Argument var id: String
        @Option(help: "Fields to set, as a JSON object.") var set: String?
        @Option(help: "A field to remove (repeatable).") var unset: [String] = []
        @Option(help: #"Counter increments, as a JSON object: '{"views":1}'."#) var incr: String?
        @Option(help: #"Set additions, as a JSON object of arrays: '{"tags":["a"]}'."#) var add: String?
        @Option(help: #"Set removals, as a JSON object of arrays: '{"tags":["a"]}'."#) var remove: String?
        func run() throws {
            var p: [String: JSONValue] = ["db": .string(db), "collection": .string(collection), "id": .string(id)]
            if let set { p["set"] = parseJSON(set, "--set") }
            if !unset.isEmpty { p["unset"] = .array(unset.map(JSONValue.string)) }
            if let incr { p["incr"] = parseJSON(incr, "--incr") }
            if let add { p["add"] = parseJSON(add, "--add") }
            if let remove { p["remove"] = parseJSON(remove, "--remove") }
            global.output(try global.call("doc.patch", p)) { print("patched \(text($0["id"]))") }
        }
    }

    struct Delete: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete a document.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var collection: String
        @Argument var id: String
        func run() throws {
            let r = try global.call("doc.delete", ["db": .string(db), "collection": .string(collection), "id": .string(id)])
            global.output(r) { print("deleted \(text($0["id"]))") }
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
        let r = try global.call("tx.commit", ["db": .string(db), "ops": parseJSON(ops, "ops")])
        global.output(r) { r in for item in r["results"]?.arrayValue ?? [] { print(text(item["id"])) } }
    }
}

/// A database and, optionally, one of its collections (for listings).
struct Scope: ParsableArguments {
    @Argument var db: String
    @Argument(help: "Only this collection.") var collection: String?

    var params: [String: JSONValue] {
        var p: [String: JSONValue] = ["db": .string(db)]
        if let collection { p["collection"] = .string(collection) }
        return p
    }
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
        global.output(try global.call("query.find", p)) { r in
            for d in r["docs"]?.arrayValue ?? [] { print(d.jsonText) }
            if case .string(let next)? = r["cursor"] { print("-- more: --cursor \(next)") }
        }
    }
}

struct Count: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Count matching documents.")
    @OptionGroup var global: Global
    @OptionGroup var query: QueryArgs
    func run() throws {
        global.output(try global.call("query.count", query.params())) { print(text($0["count"])) }
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
        global.output(try global.call("query.explain", p)) { r in
            let used = (r["indexes"]?.arrayValue ?? []).map(text)
            print("indexes: \(used.isEmpty ? "none (full scan)" : used.joined(separator: ", "))")
            for line in r["plan"]?.arrayValue ?? [] { print("plan:    \(text(line))") }
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
        func run() throws {
            var p: [String: JSONValue] = [
                "db": .string(db), "collection": .string(collection), "fields": .array(fields.map(JSONValue.string)),
            ]
            if let name { p["name"] = .string(name) }
            global.output(try global.call("index.create", p)) { print("created index \(text($0["name"]))") }
        }
    }

    struct Drop: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Drop an index.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var name: String
        func run() throws {
            global.output(try global.call("index.drop", ["db": .string(db), "name": .string(name)])) { _ in
                print("dropped index \(name)")
            }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List indexes.")
        @OptionGroup var global: Global
        @OptionGroup var scope: Scope
        func run() throws {
            global.output(try global.call("index.list", scope.params)) { r in
                printTable(
                    ["NAME", "COLLECTION", "FIELDS"],
                    (r["indexes"]?.arrayValue ?? []).map {
                        [text($0["name"]), text($0["collection"]), ($0["fields"]?.arrayValue ?? []).map(text).joined(separator: ",")]
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
            global.output(try global.call("conflict.list", scope.params)) { r in
                printTable(
                    ["COLLECTION", "ID", "FIELD", "VALUE", "LOST"],
                    (r["conflicts"]?.arrayValue ?? []).map { c in
                        let lost = (c["losers"]?.arrayValue ?? []).map { l in
                            (l["unset"] == true ? "(unset)" : text(l["value"])) + " from " + String(text(l["origin"]).prefix(8))
                        }
                        return [text(c["collection"]), text(c["id"]), text(c["field"]),
                            c["present"] == true ? text(c["value"]) : "(absent)", lost.joined(separator: "; ")]
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
            global.output(try global.call("conflict.resolve", p)) { _ in print("resolved \(collection)/\(id).\(field)") }
        }
    }
}

struct Watch: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print changes as they happen: one line per event (seq, type, collection/id, document).",
        discussion: """
            With a filter, a live query: documents entering and leaving the result are reported as enter and leave.
            Runs until interrupted, until --count events were printed, or until the subscription ends (exit 1).
            """)
    @OptionGroup var global: Global
    @Argument var db: String
    @Argument(help: "Only this collection.") var collection: String?
    @Argument(help: #"Filter as JSON, e.g. '{"done":false}'."#) var filter: String?
    @Option(help: "Replay the changes after this feed sequence first.") var since: Int64?
    @Option(help: "Exit after printing this many events.") var count: Int?

    func run() throws {
        if let count, count < 1 { fail("--count must be at least 1") }
        var p: [String: JSONValue] = ["db": .string(db)]
        if let collection { p["collection"] = .string(collection) }
        if let filter { p["where"] = parseJSON(filter, "filter") }
        if let since { p["since"] = .int(since) }
        global.withConnection { connection in
            let started = try connection.call("subscribe", p)
            if !global.json {
                printError("watching \(db)\(collection.map { "/" + $0 } ?? "") after seq \(text(started["seq"]))\n")
            }
            var printed = 0
            while true {
                let n = try connection.nextNotification()
                guard n["method"] == "subscription" else { continue }
                if let err = n["params"]?["error"], let e = RPCError(json: err) {
                    fail("subscription ended: " + describe(e))
                }
                for event in n["params"]?["events"]?.arrayValue ?? [] {
                    // Unbuffered: a watcher piped into another program sees each event as it happens.
                    if global.json {
                        emit(event.jsonText)
                    } else {
                        let doc = event["doc"].map { " " + $0.jsonText } ?? ""
                        emit("\(text(event["seq"]))  \(pad(text(event["type"]), 6))  \(text(event["collection"]))/\(text(event["id"]))\(doc)")
                    }
                    printed += 1
                    if let count, printed >= count { return }
                }
            }
        }
    }
}
