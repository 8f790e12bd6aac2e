import Foundation
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
        subcommands: [
            Create.self, List.self, InfoCmd.self, Drop.self, Share.self, Join.self, Invite.self, Members.self, Revoke.self,
            RelayCapabilityCmd.self, Backup.self, Restore.self, Compact.self,
        ])

    struct Share: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Share a database: create its space and make this device its first admin.",
            discussion: "Then invite each other device with 'blazectl db invite'. A database shared with a secret token "
                + "before membership prints that token again.")
        @OptionGroup var global: Global
        @Argument var name: String
        func run() throws {
            global.run(RPC.DbShare(db: name)) { r in
                if let token = r.token {
                    print(token)
                    printError("blazectl: this token is a secret: whoever holds it can read and write \(name)\n")
                } else {
                    print("shared \(r.db) as space \(r.space); this device is its admin: invite devices with 'blazectl db invite \(r.db) writer'")
                }
            }
        }
    }

    struct Join: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Join a shared database with an invite (or a legacy token).",
            discussion: "Pass - as the token to read it from standard input, so it stays out of shell history and "
                + "the process list.")
        @OptionGroup var global: Global
        @Argument(help: "The invite printed by 'blazectl db invite' on a member, or - to read it from stdin.") var token: String
        @Argument(help: "Name of the new local database (default: shared-<space id prefix>).") var name: String?
        func run() throws {
            var text = token
            if token == "-" {
                guard let line = readLine(strippingNewline: true) else {
                    printError("blazectl: no token on standard input\n")
                    throw ExitCode(2)
                }
                text = line.trimmingCharacters(in: .whitespaces)
            }
            global.run(RPC.DbJoin(token: text, db: name)) { r in print("joined space \(r.space) as database \(r.db)") }
        }
    }

    struct Invite: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print a one-time invite for another device to join a shared database.",
            discussion: "The invite is a secret: it works once, until it expires. Send it only over a channel you trust.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument(help: "admin, writer or reader.") var role: String
        @Option(help: "Seconds until the invite expires (default 86400).") var expiresIn: Int?
        @Option(help: "Where the joiner connects: host:port (default: where this daemon listens) or a relay's ws:// or wss:// URL.") var address: String?
        func run() throws {
            global.run(RPC.DbInvite(db: db, role: role, expiresIn: expiresIn, address: address)) { r in
                print(r.token)
                let expires = Date(timeIntervalSince1970: Double(r.expiresAtMs) / 1000)
                printError("blazectl: one-time \(r.role.rawValue) invite into \(r.db), valid until \(expires); it is a secret\n")
            }
        }
    }

    struct Members: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the devices of a shared database's space.")
        @OptionGroup var global: Global
        @Argument var db: String
        func run() throws {
            global.run(RPC.DbMembers(db: db)) { r in
                func time(_ ms: Int?) -> String {
                    ms.map { ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: Double($0) / 1000)) } ?? "-"
                }
                printTable(
                    ["DEVICE", "ROLE", "ADDED BY", "ADDED", "REMOVED BY", "REMOVED"],
                    r.members.map {
                        [
                            $0.device + ($0.thisDevice ? " (this device)" : ""), $0.role.rawValue, $0.addedBy ?? "-",
                            time($0.addedAtMs), $0.removedBy ?? "-", time($0.removedAtMs),
                        ]
                    })
                print("epoch \(r.epoch)")
            }
        }
    }

    struct Revoke: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove a device from a shared database's space and rotate the key.",
            discussion: "Members refuse what it writes from now on and nothing written afterwards is readable with the keys it holds.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument(help: "Node id of the device ('blazectl db members' lists them).") var device: String
        func run() throws {
            global.run(RPC.DbRevoke(db: db, device: device)) { r in
                printTable(["DB", "REVOKED", "EPOCH"], [[r.db, r.device, String(r.epoch)]])
            }
        }
    }

    struct RelayCapabilityCmd: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "relay-capability",
            abstract: "Print a shared database's relay capability: what a relay needs to serve its space.",
            discussion: "Give it to the relay's operator ('blaze-relay add-space -' reads it from stdin), then add the "
                + "relay as a peer on each device ('blazectl peer add DB HOST:PORT'). It opens no entry.")
        @OptionGroup var global: Global
        @Argument var db: String
        func run() throws {
            global.run(RPC.DbRelayCapability(db: db)) { r in print(r.capability) }
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
        static let configuration = CommandConfiguration(
            commandName: "info", abstract: "Show a database's counts, size by table and last compaction.")
        @OptionGroup var global: Global
        @Argument var name: String
        func run() throws {
            global.run(RPC.DbInfo(db: name)) { r in
                var rows: [(String, String)] = [
                    ("name", r.name), ("collections", "\(r.collections)"), ("documents", "\(r.documents)"),
                    ("sizeBytes", "\(r.sizeBytes)"), ("path", r.path), ("nodeId", r.nodeId), ("stateHash", r.stateHash),
                ]
                let tables = r.bytesByTable.filter { $0.value > 4096 }.sorted { $0.value > $1.value }.prefix(6)
                rows.append(("tables", tables.map { "\($0.key) \(byteCount(Int64($0.value)))" }.joined(separator: ", ")))
                if let c = r.lastCompaction {
                    rows.append((
                        "compacted",
                        "\(agoText(ms: Int64(c.finishedAtMs))): \(c.changes) changes, \(c.tombstones) tombstones, \(c.entries) entries, "
                            + "\(c.folded) documents folded, \(c.pagesFreed) pages freed"
                    ))
                } else {
                    rows.append(("compacted", "never"))
                }
                for (key, value) in rows { print("\(pad(key, 13))\(value)") }
            }
        }
    }

    struct Compact: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Drop history no replica needs any more, now (blazed also does it every compaction-interval).")
        @OptionGroup var global: Global
        @Argument var name: String
        func run() throws {
            global.run(RPC.DbCompact(db: name)) { r in
                print(
                    "compacted \(name): \(r.changes) changes, \(r.tombstones) tombstones, \(r.entries) entries, \(r.heads) heads, "
                        + "\(r.folded) documents folded; "
                        + "\(r.pagesFreed) pages freed in \(r.durationMs) ms; now \(byteCount(Int64(r.sizeBytes)))")
                if !r.silentMembers.isEmpty {
                    print("waiting for (or past the horizon): \(r.silentMembers.map { String($0.prefix(12)) }.joined(separator: ", "))")
                }
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
        commandName: "collection", abstract: "List and drop collections.", subcommands: [List.self, Drop.self])

    struct Drop: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Delete every document of a collection and drop its indexes (replicated to every device).")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var collection: String
        func run() throws {
            global.run(RPC.CollectionDrop(db: db, collection: collection)) { r in
                print("dropped \(r.collection): \(r.deleted) documents, \(r.indexes) indexes")
            }
        }
    }

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
