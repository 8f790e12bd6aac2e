import ArgumentParser
import BlazeClient
import BlazeProtocol

// blazectl call, info, db and collection.

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
