import ArgumentParser
import BlazeClient
import BlazeProtocol

// blazectl peer and sync.

struct Peer: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "peer", abstract: "Add, remove and list the peers a shared database syncs with.",
        subcommands: [Add.self, Remove.self, List.self])

    struct Add: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Sync a shared database with the daemon at host:port.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument(help: "host:port of the peer's --sync-listen, or a relay's ws:// or wss:// URL.") var address: String
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
                printTable(
                    ["ADDRESS", "CONNECTED", "DEVICE"], r.peers.map { [$0.address, $0.connected ? "yes" : "no", $0.device ?? "-"] })
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
                    if d.peers.isEmpty { rows.append([d.db, "-", d.paused ? "paused" : "-", "", "", "", "", ""]) }
                    for p in d.peers {
                        let rejected = p.rejected.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }
                        rows.append([
                            d.db, p.peer, d.paused ? "paused" : p.connected ? "connected" : "disconnected",
                            p.devices.isEmpty ? "-" : p.devices.map { String($0.prefix(12)) }.joined(separator: ","),
                            "\(p.sentEntries)", "\(p.receivedEntries)", "\(p.errors)", rejected.joined(separator: " "),
                        ])
                    }
                }
                printTable(["DB", "PEER", "STATE", "DEVICES", "SENT", "RECEIVED", "ERRORS", "REJECTED"], rows)
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
