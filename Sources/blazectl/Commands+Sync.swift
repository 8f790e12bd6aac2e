import ArgumentParser
import BlazeClient
import BlazeProtocol
import Foundation

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

struct Folder: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "folder", abstract: "Add, remove and list the shared folders a database syncs through.",
        subcommands: [Add.self, Remove.self, List.self])

    /// `path` made absolute against the current directory (the daemon wants absolute paths).
    static func absolute(_ path: String) -> String {
        path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
    }

    struct Add: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Sync a shared database through a folder (Dropbox, Syncthing, a network share, a USB stick).")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument(help: "An existing directory; it receives only ciphertext.") var path: String
        func run() throws {
            global.run(RPC.FolderAdd(db: db, path: Folder.absolute(path))) { r in
                print(r.added ? "syncing \(db) through \(r.path)" : "\(db) already syncs through \(r.path)")
            }
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Stop syncing a database through a folder (what this device wrote there stays).")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument var path: String
        func run() throws {
            global.run(RPC.FolderRemove(db: db, path: Folder.absolute(path))) { r in
                print(r.removed ? "stopped syncing \(db) through \(r.path)" : "\(db) did not sync through \(r.path)")
            }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List a database's folders.")
        @OptionGroup var global: Global
        @Argument var db: String
        func run() throws {
            global.run(RPC.FolderList(db: db)) { r in
                printTable(
                    ["PATH", "DEVICES", "LAST ERROR"],
                    r.folders.map {
                        [$0.path, $0.devices.isEmpty ? "-" : $0.devices.map { String($0.prefix(12)) }.joined(separator: ","), $0.lastError ?? "-"]
                    })
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
                        let state =
                            d.paused ? "paused" : p.direction == .folder ? (p.lastError == nil ? "ok" : "failing")
                            : p.connected ? "connected" : "disconnected"
                        rows.append([
                            d.db, p.peer, state,
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
