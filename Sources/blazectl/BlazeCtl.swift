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

    /// Calls `P`'s method; prints the exact JSON result with --json, else hands the typed result to `human`.
    func run<P: RPCParameters>(_ params: P, human: (P.Result) -> Void) {
        let result = withConnection { try $0.call(P.method.rawValue, params.jsonObject) }
        if json {
            print(result.jsonText)
            return
        }
        do {
            human(try P.decode(result))
        } catch {
            fail("the result of \(P.method.rawValue) does not match the protocol document: \(error)")
        }
    }

    /// Like `run`, for params that carry JSON the user typed: checked here first, with the daemon's own messages.
    func run<P: RPCParameters>(_ type: P.Type, _ raw: [String: JSONValue], human: (P.Result) -> Void) {
        do {
            run(try P(validating: raw), human: human)
        } catch {
            fail(describe(error))
        }
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
        global.run(RPC.DaemonInfo()) { r in
            let rows: [(String, String)] = [
                ("version", r.version), ("nodeId", r.nodeId), ("pid", "\(r.pid)"), ("socket", r.socket), ("dataDir", r.dataDir),
                ("databases", "\(r.databases)"), ("uptimeSeconds", JSONValue.double(r.uptimeSeconds).jsonText),
            ]
            for (key, value) in rows { print("\(pad(key, 14))\(value)") }
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
            global.run(RPC.DbShare(db: name)) { r in
                print(r.token)
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
            global.run(RPC.DbJoin(token: token, db: name)) { r in print("joined space \(r.space) as database \(r.db)") }
        }
    }

    struct Create: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create a database.")
        @OptionGroup var global: Global
        @Argument var name: String
        func run() throws {
            global.run(RPC.DbCreate(db: name)) { _ in print("created database \(name)") }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List databases.")
        @OptionGroup var global: Global
        func run() throws {
            global.run(RPC.DbList()) { r in printTable(["NAME"], r.databases.map { [$0.name] }) }
        }
    }

    struct InfoCmd: ParsableCommand {
        static let configuration = CommandConfiguration(commandName: "info", abstract: "Show a database's counts and size.")
        @OptionGroup var global: Global
        @Argument var name: String
        func run() throws {
            global.run(RPC.DbInfo(db: name)) { r in
                let rows: [(String, String)] = [
                    ("name", r.name), ("collections", "\(r.collections)"), ("documents", "\(r.documents)"),
                    ("sizeBytes", "\(r.sizeBytes)"), ("path", r.path), ("nodeId", r.nodeId), ("stateHash", r.stateHash),
                ]
                for (key, value) in rows { print("\(pad(key, 13))\(value)") }
            }
        }
    }

    struct Drop: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Delete a database and all its data.")
        @OptionGroup var global: Global
        @Argument var name: String
        func run() throws {
            global.run(RPC.DbDrop(db: name)) { _ in print("dropped database \(name)") }
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
            global.run(RPC.PeerAdd(db: db, address: address)) { r in
                print(r.added ? "added peer \(r.address) to \(db)" : "\(r.address) was already a peer of \(db)")
            }
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Stop syncing a database with a peer.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var address: String
        func run() throws {
            global.run(RPC.PeerRemove(db: db, address: address)) { r in
                print(r.removed ? "removed peer \(r.address)" : "\(r.address) was not a peer of \(db)")
            }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List a database's peers.")
        @OptionGroup var global: Global
        @Argument var db: String
        func run() throws {
            global.run(RPC.PeerList(db: db)) { r in
                printTable(["ADDRESS", "CONNECTED"], r.peers.map { [$0.address, $0.connected ? "yes" : "no"] })
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
            global.run(RPC.SyncStatus(db: db)) { r in
                print("listening on \(r.listen ?? "(not listening)")")
                var rows: [[String]] = []
                for d in r.databases {
                    if d.peers.isEmpty { rows.append([d.db, "-", d.paused ? "paused" : "-", "", "", "", ""]) }
                    for p in d.peers {
                        let rejected = p.rejected.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
                        rows.append([
                            d.db, p.peer, d.paused ? "paused" : p.connected ? "connected" : "disconnected",
                            "\(p.sentEntries)", "\(p.receivedEntries)", "\(p.errors)", rejected.joined(separator: " "),
                        ])
                    }
                }
                printTable(["DB", "PEER", "STATE", "SENT", "RECEIVED", "ERRORS", "REJECTED"], rows)
                let refused = [("strangers refused", r.strangersRefused), ("over connection limits", r.refusedOverLimit)]
                    .filter { $0.1 > 0 }.map { "\($0.0): \($0.1)" }
                if !refused.isEmpty { print("inbound: " + refused.joined(separator: ", ")) }
                for d in r.databases {
                    for f in d.forks {
                        print(
                            "FORK in \(d.db): origin \(f.origin) signed two entries for seq \(f.seq) "
                                + "(held \(f.heldHash.prefix(16))…, other \(f.otherHash.prefix(16))…); the origin is quarantined")
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
            global.run(RPC.SyncNow(db: db)) { _ in print("syncing \(db)") }
        }
    }

    struct Pause: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Pause sync of a database until resumed.")
        @OptionGroup var global: Global
        @Argument var db: String
        func run() throws {
            global.run(RPC.SyncPause(db: db)) { _ in print("paused sync of \(db)") }
        }
    }

    struct Resume: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Resume sync of a paused database.")
        @OptionGroup var global: Global
        @Argument var db: String
        func run() throws {
            global.run(RPC.SyncResume(db: db)) { _ in print("resumed sync of \(db)") }
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
            global.run(RPC.CollectionList(db: db)) { r in
                printTable(["NAME", "DOCUMENTS"], r.collections.map { [$0.name, "\($0.count)"] })
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
        func run() throws {
            let list = fields.map { $0.split(separator: ",").map(String.init) }
            global.run(RPC.DocGet(db: db, collection: collection, id: id, fields: list)) { print($0.doc.prettyText()) }
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
            global.run(RPC.IndexCreate(db: db, collection: collection, fields: fields, name: name)) {
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
                    ["NAME", "COLLECTION", "FIELDS"], r.indexes.map { [$0.name, $0.collection, $0.fields.joined(separator: ",")] })
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
