import ArgumentParser
import BlazeClient
import BlazeConfig
import BlazeProtocol
import BlazeSettings
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

// MARK: terminal

/// Colour for human output: only when standard output is a terminal, `NO_COLOR` is unset and `TERM` is not dumb.
enum Colour {
    static let enabled: Bool = {
        let env = ProcessInfo.processInfo.environment
        return isatty(1) == 1 && env["NO_COLOR"] == nil && env["TERM"] != "dumb"
    }()

    static func green(_ s: String) -> String { paint(s, "32") }
    static func yellow(_ s: String) -> String { paint(s, "33") }
    static func red(_ s: String) -> String { paint(s, "31") }

    static func paint(_ s: String, _ code: String) -> String { enabled ? "\u{1B}[\(code)m\(s)\u{1B}[0m" : s }
}

/// "12.3 MiB".
/// How long ago Unix time `ms` was, for humans ("3m ago").
func agoText(ms: Int64) -> String {
    let seconds = max(0, Int64(Date().timeIntervalSince1970) - ms / 1000)
    if seconds < 60 { return "\(seconds)s ago" }
    if seconds < 3600 { return "\(seconds / 60)m ago" }
    if seconds < 86_400 { return "\(seconds / 3600)h ago" }
    return "\(seconds / 86_400)d ago"
}

func byteCount(_ n: Int64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"]
    var value = Double(n)
    var unit = 0
    while value >= 1024 && unit < units.count - 1 {
        value /= 1024
        unit += 1
    }
    return unit == 0 ? "\(n) B" : String(format: "%.1f %@", value, units[unit])
}

/// Runs `body` (a long call) while a progress line on standard error (a terminal only) shows the growth of the file
/// at `watching` against `total` bytes, and the elapsed time.
func withProgress<T>(_ label: String, watching: String, total: Int64, _ body: () throws -> T) rethrows -> T {
    try withProgress(label, total: total, measure: {
        ((try? FileManager.default.attributesOfItem(atPath: watching))?[.size] as? NSNumber)?.int64Value ?? 0
    }, body)
}

/// Runs `body` (a long call) while a progress line on standard error (a terminal only) shows what `measure` (called
/// on a thread of its own, about ten times a second) says is done of `total` bytes, and the elapsed time.
func withProgress<T>(_ label: String, total: Int64, measure: @escaping @Sendable () -> Int64, _ body: () throws -> T) rethrows -> T {
    guard isatty(2) == 1 else { return try body() }
    let done = Atomic<Bool>(false)
    let finished = DispatchSemaphore(value: 0)
    let started = Date()
    let thread = Thread {
        defer { finished.signal() }
        while !done.load(ordering: .acquiring) {
            let size = measure()
            let percent = total > 0 ? " (\(min(100, size * 100 / total))%)" : ""
            let elapsed = String(format: "%.1fs", Date().timeIntervalSince(started))
            printError("\r\u{1B}[K\(label): \(byteCount(size)) of \(byteCount(total))\(percent), \(elapsed)")
            usleep(100_000)  // redraw rate of the progress line, not synchronisation
        }
        printError("\r\u{1B}[K")
    }
    thread.start()
    defer {
        done.store(true, ordering: .releasing)
        finished.wait()
    }
    return try body()
}

/// "1 document", "3 documents".
func documents(_ n: Int) -> String {
    n == 1 ? "1 document" : "\(n) documents"
}

/// `path` made absolute against the current directory (the daemon has its own).
func absolutePath(_ path: String) -> String {
    path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
}

// MARK: db backup / restore

extension DB {
    struct Backup: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write a consistent snapshot of a database to a new file while the daemon keeps serving writes.",
            discussion: "The file appears only when complete and is never overwritten. Restore it with 'blazectl db restore'.")
        @OptionGroup var global: Global
        @Argument var name: String
        @Argument(help: "The backup file to create (relative to the current directory).") var path: String
        func run() throws {
            let target = absolutePath(path)
            let result = global.withConnection { c in
                // The file, then the blob chunks held (those referred to are copied: at most all of them).
                let info = try c.call(RPC.DbInfo(db: name))
                return try withProgress("backing up \(name)", watching: target + ".partial", total: Int64(info.sizeBytes + info.blobs.bytes)) {
                    try c.call(RPC.DbBackup(db: name, path: target))
                }
            }
            global.output(result.json) { _ in
                print("backed up \(name) to \(path): \(documents(result.documents)), state \(result.stateHash.prefix(16))"
                    + (result.chunks > 0 ? ", \(result.chunks) blob chunks (\(result.chunkBytes) bytes)" : ""))
                if result.blobsNotHeld > 0 {
                    print("note: \(result.blobsNotHeld) blob(s) the documents refer to are not held whole on this device and are not "
                        + "in the backup (blob.pin or blob get them first)")
                }
            }
        }
    }

    struct Restore: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create a new database from a backup file.",
            discussion: """
                The file is checked and copied, never changed. The new database holds every document, change and index \
                of the backup, but is not shared: share it anew, or join the original space to sync again.
                """)
        @OptionGroup var global: Global
        @Argument(help: "A file written by 'blazectl db backup'.") var path: String
        @Argument(help: "Name of the new database.") var name: String
        func run() throws {
            let source = absolutePath(path)
            let size = ((try? FileManager.default.attributesOfItem(atPath: source))?[.size] as? NSNumber)?.int64Value ?? 0
            let result = global.withConnection { c in
                let dataDir = try c.call(RPC.DaemonInfo()).dataDir
                return try withProgress("restoring \(name)", watching: dataDir + "/databases/\(name).db.partial", total: size) {
                    try c.call(RPC.DbRestore(path: source, db: name))
                }
            }
            global.output(result.json) { _ in
                print("restored \(result.db) from \(path): \(documents(result.documents)), state \(result.stateHash.prefix(16))"
                    + (result.chunks > 0 ? ", \(result.chunks) blob chunks (\(result.chunkBytes) bytes)" : ""))
            }
        }
    }
}

// MARK: status

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Overview: the daemon, every database with its documents and size, and sync state.")
    @OptionGroup var global: Global

    func run() throws {
        let overview = global.withConnection { c -> JSONValue in
            let info = try c.call(RPC.DaemonInfo())
            let sync = try c.call(RPC.SyncStatus())
            let shared = Dictionary(sync.databases.map { ($0.db, $0.json) }) { first, _ in first }
            var databases: [JSONValue] = []
            for entry in try c.call(RPC.DbList()).databases {
                let db = try c.call(RPC.DbInfo(db: entry.name))
                databases.append([
                    "name": .string(entry.name), "collections": .int(Int64(db.collections)), "documents": .int(Int64(db.documents)),
                    "sizeBytes": .int(Int64(db.sizeBytes)), "sync": shared[entry.name] ?? .null,
                    "lastCompaction": db.lastCompaction?.json ?? .null,
                ])
            }
            return ["daemon": info.json, "listen": sync.listen.map { .string($0) } ?? .null, "databases": .array(databases)]
        }
        global.output(overview) { r in
            let d = r["daemon"] ?? .null
            var uptime = 0
            if case .double(let seconds)? = d["uptimeSeconds"] { uptime = Int(seconds) }
            print("\(Colour.green("●")) blazed \(text(d["version"])) running, pid \(text(d["pid"])), up \(uptime / 3600)h \(uptime / 60 % 60)m \(uptime % 60)s")
            print("  socket    \(text(d["socket"]))")
            print("  data      \(text(d["dataDir"]))")
            print("  node      \(text(d["nodeId"]))")
            print("  clients   \(text(d["connections"])) connections, \(text(d["subscriptions"])) subscriptions")
            print("  sync      \(r["listen"]?.stringValue.map { "listening on \($0)" } ?? "not listening for peers")")
            print("")
            let rows = (r["databases"]?.arrayValue ?? []).map { db -> [String] in
                let sync = db["sync"] ?? .null
                let state: String
                if sync == .null {
                    state = "local"
                } else if sync["paused"] == true {
                    state = Colour.yellow("paused")
                } else {
                    let peers = sync["peers"]?.arrayValue ?? []
                    let connected = peers.filter { $0["connected"] == true }.count
                    let errors = peers.reduce(Int64(0)) { $0 + ($1["errors"]?.intValue ?? 0) }
                    let text = "shared, \(connected)/\(peers.count) peers connected" + (errors > 0 ? ", \(errors) errors" : "")
                    state = errors > 0 ? Colour.red(text) : connected == peers.count ? Colour.green(text) : Colour.yellow(text)
                }
                let compacted = db["lastCompaction"]?["finishedAtMs"]?.intValue.map { agoText(ms: $0) } ?? "never"
                return [
                    text(db["name"]), text(db["collections"]), text(db["documents"]), byteCount(db["sizeBytes"]?.intValue ?? 0),
                    compacted, state,
                ]
            }
            printTable(["DATABASE", "COLLECTIONS", "DOCUMENTS", "SIZE", "COMPACTED", "SYNC"], rows)
        }
    }
}

// MARK: config

struct Config: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "config", abstract: "Show blazed's configuration.", subcommands: [Show.self, Path.self])

    struct Show: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print every setting's effective value and where it came from.",
            discussion: """
                Asks the running daemon (which knows its flags too). When none answers, resolves what a daemon started \
                now would use from the environment and the configuration file, and says so on standard error.
                """)
        @OptionGroup var global: Global
        func run() throws {
            let result: JSONValue
            do {
                let connection = try BlazeConnection(socketPath: global.socketPath)
                defer { connection.close() }
                result = try connection.call(RPC.DaemonConfig()).json
            } catch let e as RPCError {
                fail(describe(e))
            } catch {
                printError("blazectl: no daemon answers at \(global.socketPath); showing the environment and file settings\n")
                do {
                    result = try BlazedSettings.resolver.resolve(
                        flags: [:], environment: ProcessInfo.processInfo.environment, configFile: nil
                    ).json
                } catch {
                    fail("\(error)")
                }
            }
            global.output(result) { r in
                printTable(
                    ["SETTING", "VALUE", "SOURCE"],
                    (r["settings"]?.arrayValue ?? []).map { s in
                        [text(s["key"]), s["value"] == .null ? "(none)" : text(s["value"]), text(s["source"])]
                    })
                print("configuration file: \(r["file"]?.stringValue ?? "(none)")")
            }
        }
    }

    struct Path: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print the path of the configuration file blazed reads.")
        @OptionGroup var global: Global
        func run() throws {
            let (path, _) = BlazedSettings.resolver.configFilePath(flag: nil, environment: ProcessInfo.processInfo.environment)
            let exists = FileManager.default.fileExists(atPath: path)
            global.output(["path": .string(path), "exists": .bool(exists)]) { _ in
                print(path + (exists ? "" : "  (does not exist; blazed uses its defaults)"))
            }
        }
    }
}
