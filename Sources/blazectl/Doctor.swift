import ArgumentParser
import BlazeClient
import BlazeProtocol
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// One thing `blazectl doctor` checked: how it stands, what it saw, and what to do when it is not fine.
struct Finding {
    /// How a check came out.
    enum Outcome: String {
        case ok, warning, problem
        /// The mark a terminal line starts with.
        var mark: String { self == .ok ? "✔" : self == .warning ? "!" : "✘" }
    }

    let check: String
    let outcome: Outcome
    let detail: String
    var fix: String?

    /// The finding as `--json` prints it.
    var json: JSONValue {
        ["check": .string(check), "status": .string(outcome.rawValue), "detail": .string(detail), "fix": fix.map { .string($0) } ?? .null]
    }
}

/// `blazectl doctor`: the questions a user asks first, each answered with a fix when the answer is bad (README,
/// "Doctor"). Exits 1 when a check found a problem; warnings alone exit 0.
struct Doctor: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check the daemon, its socket and unit, the data directory, every database, peers and clocks.",
        discussion: "Each line is ✔ (fine), ! (worth a look) or ✘ (a problem), and each problem comes with a fix. Exits 1 "
            + "when there is a problem.")
    @OptionGroup var global: Global
    @Option(help: "Least free space on the data directory's file system before it is a problem (MiB).") var minFreeMib = 1024
    @Option(help: "Largest difference from a peer's clock before it is a problem (seconds).") var maxClockSkew = 60
    @Option(help: "Directory of the user units (default: $XDG_CONFIG_HOME/systemd/user).") var unitDir: String?

    func run() throws {
        var findings = [unitFinding()]
        let socket = global.socketPath
        if let problem = socketProblem(socket) {
            findings.insert(problem, at: 0)
        } else {
            findings.insert(Finding(check: "socket", outcome: .ok, detail: "\(socket), yours"), at: 0)
            findings += daemonFindings(socket: socket)
        }
        if global.json {
            let ok = !findings.contains { $0.outcome == .problem }
            print(JSONValue.object(["ok": .bool(ok), "checks": .array(findings.map(\.json))]).jsonText)
        } else {
            for f in findings {
                print("\(f.outcome.mark) \(f.check): \(f.detail)")
                if let fix = f.fix, f.outcome != .ok { print("    fix: \(fix)") }
            }
        }
        if findings.contains(where: { $0.outcome == .problem }) { throw ExitCode(1) }
    }

    /// Whether the socket is there, a socket, and this user's.
    func socketProblem(_ path: String) -> Finding? {
        var st = stat()
        // A link to the socket is followed (its target is what a client reaches).
        guard lstat(path, &st) == 0, st.st_mode & S_IFMT != S_IFLNK || stat(path, &st) == 0 else {
            return Finding(
                check: "socket", outcome: .problem, detail: "nothing at \(path): blazed is not running",
                fix: "start it: `systemctl --user start blazed.socket` (once the unit is installed), or run `blazed`")
        }
        guard st.st_mode & S_IFMT == S_IFSOCK else {
            return Finding(
                check: "socket", outcome: .problem, detail: "\(path) is not a socket",
                fix: "move it away, then start blazed, which makes its socket there")
        }
        guard st.st_uid == getuid() else {
            let owner = getpwuid(st.st_uid).map { String(cString: $0.pointee.pw_name) } ?? "uid \(st.st_uid)"
            return Finding(
                check: "socket", outcome: .problem,
                detail: "\(path) belongs to \(owner), not to you (uid \(getuid())): that is another user's daemon",
                fix: "use your own: unset BLAZEDB_SOCKET (or --socket) and start yours with `systemctl --user start blazed.socket`")
        }
        return nil
    }

    /// Whether blazed's user units are installed and enabled (a warning only: running blazed by hand is fine).
    func unitFinding() -> Finding {
        let env = ProcessInfo.processInfo.environment
        let own = unitDir ?? ServiceUnits.defaultDirectory(environment: env)
        let dirs = [own, "/etc/systemd/user", "/usr/local/lib/systemd/user", "/usr/lib/systemd/user"]
        guard let found = dirs.first(where: { FileManager.default.fileExists(atPath: $0 + "/blazed.socket") }) else {
            return Finding(
                check: "unit", outcome: .warning, detail: "no blazed.socket user unit installed",
                fix: "`blazectl service install` (or install the package), then `systemctl --user enable --now blazed.socket`")
        }
        let enabled = [own, "/etc/systemd/user"].contains {
            FileManager.default.fileExists(atPath: $0 + "/sockets.target.wants/blazed.socket")
        }
        return enabled
            ? Finding(check: "unit", outcome: .ok, detail: "\(found)/blazed.socket, enabled")
            : Finding(
                check: "unit", outcome: .warning, detail: "\(found)/blazed.socket is installed but not enabled",
                fix: "`systemctl --user enable --now blazed.socket`")
    }

    /// Everything asked of the daemon itself.
    func daemonFindings(socket: String) -> [Finding] {
        let c: BlazeConnection
        let info: RPC.DaemonInfo.Result
        do {
            // db.check reads whole files: minutes for a large one on a slow disk.
            c = try BlazeConnection(socketPath: socket, timeoutSeconds: 900)
            info = try c.call(RPC.DaemonInfo())
        } catch {
            return [
                Finding(
                    check: "daemon", outcome: .problem, detail: "no answer on \(socket): \(error)",
                    fix: "restart it (`systemctl --user restart blazed`) and read its log (`journalctl --user -u blazed`)")
            ]
        }
        defer { c.close() }
        var findings: [Finding] = []
        let up = Int(info.uptimeSeconds)
        if info.version == blazeVersion {
            findings.append(Finding(check: "daemon", outcome: .ok, detail: "blazed \(info.version), pid \(info.pid), up \(up) s"))
        } else {
            findings.append(
                Finding(
                    check: "daemon", outcome: .warning, detail: "blazed \(info.version) answers this blazectl \(blazeVersion)",
                    fix: "restart blazed after an upgrade (`systemctl --user restart blazed`)"))
        }
        findings.append(dataDirectoryFinding(info.dataDir))
        findings += databaseFindings(c, format: info.formats?.database)
        findings += syncFindings(c)
        return findings
    }

    /// Whether the data directory is writable and its file system has room.
    func dataDirectoryFinding(_ dir: String) -> Finding {
        guard access(dir, W_OK | X_OK) == 0 else {
            return Finding(
                check: "data directory", outcome: .problem, detail: "\(dir) is not writable by you",
                fix: "give it back to the user blazed runs as (`chown -R $USER \(dir)`, `chmod u+rwx \(dir)`)")
        }
        var fs = statvfs()
        guard statvfs(dir, &fs) == 0 else {
            return Finding(check: "data directory", outcome: .warning, detail: "\(dir): its free space cannot be read")
        }
        // In floating point: some file systems (FUSE) report sizes whose product overflows 64 bits.
        let free = Int(min(Double(fs.f_bavail) * Double(fs.f_frsize) / 1_048_576, 1e15))
        let size = Int(min(Double(fs.f_blocks) * Double(fs.f_frsize) / 1_048_576, 1e15))
        guard free >= minFreeMib else {
            return Finding(
                check: "data directory", outcome: .problem,
                detail: "\(dir): \(free) MiB free of \(size) MiB, below \(minFreeMib) MiB (writes fail with disk_full when none is left)",
                fix: "free space on that file system, or move the data directory (`--data-dir`) to one with room")
        }
        return Finding(check: "data directory", outcome: .ok, detail: "\(dir), writable, \(free) MiB free")
    }

    /// Each database's format and SQLite's quick_check of its file.
    func databaseFindings(_ c: BlazeConnection, format: Int?) -> [Finding] {
        let names: [String]
        do { names = try c.call(RPC.DbList()).databases.map(\.name) } catch {
            return [Finding(check: "databases", outcome: .problem, detail: "db.list failed: \(error)", fix: "read blazed's log")]
        }
        return names.map { name in
            do {
                let r = try c.call(RPC.DbCheck(db: name))
                guard r.ok else {
                    let unopened = r.problems.first?.hasPrefix("the daemon cannot open it") ?? false
                    return Finding(
                        check: "database \(name)", outcome: .problem,
                        detail: "\(unopened && r.problems.count == 1 ? "unusable" : "damaged"): \(r.problems.prefix(3).joined(separator: "; "))",
                        fix: unopened && r.problems.count == 1
                            ? "see why in blazed's log (`journalctl --user -u blazed`): the file's owner and permissions, or its disk"
                            : "restore it from a backup (`blazectl db restore \(name) BACKUP`), or from the `\(name).db.format-N.bak` an "
                                + "upgrade kept; a shared database can also be dropped and joined again from its members")
                }
                if let format, r.format > format {
                    return Finding(
                        check: "database \(name)", outcome: .problem,
                        detail: "format \(r.format), newer than this blazed's \(format): a newer build wrote it",
                        fix: "upgrade blazed (or go back to the `.bak` an upgrade kept)")
                }
                return Finding(check: "database \(name)", outcome: .ok, detail: "format \(r.format), quick_check ok")
            } catch let e as RPCError {
                let fix =
                    e.kind == "database_too_new"
                    ? "upgrade blazed: a newer build wrote this file (or go back to the `.bak` an upgrade kept)"
                    : "read blazed's log (`journalctl --user -u blazed`)"
                return Finding(check: "database \(name)", outcome: .problem, detail: e.message, fix: fix)
            } catch {
                return Finding(check: "database \(name)", outcome: .problem, detail: "\(error)", fix: "read blazed's log")
            }
        }
    }

    /// Every outbound peer, relay and folder: reachable, and a clock near this one.
    func syncFindings(_ c: BlazeConnection) -> [Finding] {
        let status: RPC.SyncStatus.Result
        do { status = try c.call(RPC.SyncStatus()) } catch {
            return [Finding(check: "sync", outcome: .problem, detail: "sync.status failed: \(error)", fix: "read blazed's log")]
        }
        var findings: [Finding] = []
        for d in status.databases where !d.paused {
            for p in d.peers {
                let name = "\(d.db): \(p.direction == .folder ? "folder" : "peer") \(p.peer)"
                if let skew = p.clockSkewMs, Double(abs(skew)) > Double(maxClockSkew) * 1000 {
                    let minutes = Double(abs(skew)) / 60_000
                    findings.append(
                        Finding(
                            check: "clock", outcome: .problem,
                            detail: "\(name)'s clock (device \(p.lastDevice.map { String($0.prefix(12)) } ?? "?")) is "
                                + "\(String(format: "%.1f", minutes)) min \(skew > 0 ? "ahead of" : "behind") this machine's",
                            fix: "set both clocks right (`timedatectl set-ntp true`): changes stamped too far ahead are held back "
                                + "(clock_ahead), and every change's order follows the clocks"))
                }
                guard p.direction != .inbound else { continue }
                if p.connected || (p.direction == .folder && p.lastError == nil) {
                    let version = p.protocolVersion.map { ", protocol \($0)" } ?? ""
                    findings.append(Finding(check: "sync", outcome: .ok, detail: "\(name) \(p.direction == .folder ? "in use" : "connected")\(version)"))
                } else if let error = p.lastError {
                    findings.append(
                        Finding(
                            check: "sync", outcome: .problem, detail: "\(name) unreachable: \(error)",
                            fix: p.direction == .folder
                                ? "check that the folder is there and writable (mounted, synced by its tool)"
                                : "check the address, that the peer or relay runs and listens there and that nothing blocks the port; "
                                    + "`blazectl peer remove \(d.db) \(p.peer)` if it is gone for good"))
                } else {
                    findings.append(Finding(check: "sync", outcome: .warning, detail: "\(name) connecting", fix: "ask again in a few seconds"))
                }
            }
        }
        return findings
    }
}
