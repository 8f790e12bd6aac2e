import ArgumentParser
import BlazeClient
import BlazeProtocol
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The systemd user units (ARCHITECTURE.md, "Operations"). `Packaging/systemd/` holds them as rendered for
/// `/usr/local/bin/blazed`; a test keeps the two equal.
enum ServiceUnits {
    static let socketName = "blazed.socket"
    static let serviceName = "blazed.service"

    /// `blazed.socket`: the daemon's socket at its default path, created by systemd (0600 in a 0700 directory).
    static let socket = """
        # BlazeDB: the blazed socket, a systemd user unit (blazectl service install writes it).
        # systemd listens here and starts blazed.service on the first connection.
        [Unit]
        Description=BlazeDB daemon socket

        [Socket]
        ListenStream=%t/blazedb/blazed.sock
        SocketMode=0600
        DirectoryMode=0700
        RemoveOnStop=yes

        [Install]
        WantedBy=sockets.target

        """

    /// `blazed.service` running `blazed` at `executable` with the inherited socket and `Type=notify` readiness.
    static func service(executable: String) -> String {
        """
        # BlazeDB: the blazed daemon, a systemd user unit (blazectl service install writes it).
        # Settings: ~/.config/blazedb/blazed.yaml or BLAZEDB_* variables (Environment= lines here); see the README.
        [Unit]
        Description=BlazeDB daemon (offline-first document database)
        Requires=blazed.socket
        After=blazed.socket

        [Service]
        Type=notify
        ExecStart=\(executable)
        Restart=on-failure
        RestartSec=2
        TimeoutStopSec=60
        UMask=0077
        # blazed raises its soft open-file limit to this hard limit itself (sync peers, clients and databases share it).
        LimitNOFILE=65536
        NoNewPrivileges=yes
        LockPersonality=yes
        RestrictRealtime=yes
        RestrictSUIDSGID=yes
        RestrictNamespaces=yes
        MemoryDenyWriteExecute=yes
        SystemCallArchitectures=native
        RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6

        [Install]
        WantedBy=default.target

        """
    }

    /// `$XDG_CONFIG_HOME/systemd/user` (default `~/.config/systemd/user`).
    static func defaultDirectory(environment: [String: String]) -> String {
        let base = environment["XDG_CONFIG_HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? (NSHomeDirectory() + "/.config")
        return base + "/systemd/user"
    }

    /// The `blazed` next to this `blazectl`, else the first on `PATH`.
    static func findBlazed(environment: [String: String]) -> String? {
        let here = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent().path
        let candidates = [here] + (environment["PATH"] ?? "").split(separator: ":").map(String.init)
        return candidates.map { $0 + "/blazed" }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }
}

struct Service: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Install, remove and inspect blazed's systemd user units (socket activation).",
        subcommands: [Install.self, Uninstall.self, StatusCmd.self])

    /// Where the units live.
    struct UnitDirectory: ParsableArguments {
        @Option(help: "Directory of the user units (default: $XDG_CONFIG_HOME/systemd/user).") var unitDir: String?

        var path: String {
            absolutePath(unitDir ?? ServiceUnits.defaultDirectory(environment: ProcessInfo.processInfo.environment))
        }
    }

    struct Install: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write blazed.socket and blazed.service and print the systemctl commands that enable them.",
            discussion: "Needs no running systemd: it only writes files (as in a container or before the first login).")
        @OptionGroup var global: Global
        @OptionGroup var units: UnitDirectory
        @Option(help: "The blazed executable to run (default: the one next to blazectl, else on PATH).") var blazed: String?

        func run() throws {
            let environment = ProcessInfo.processInfo.environment
            guard let executable = blazed.map(absolutePath) ?? ServiceUnits.findBlazed(environment: environment) else {
                fail("cannot find blazed next to blazectl or on PATH; pass --blazed PATH")
            }
            guard FileManager.default.isExecutableFile(atPath: executable) else { fail("\(executable) is not an executable file") }
            guard !executable.contains(where: { $0 == " " || $0 == "%" || $0 == "\n" }) else {
                fail("the blazed path must not contain spaces, % or newlines: \(executable)")
            }
            let dir = units.path
            let files = [
                (dir + "/" + ServiceUnits.socketName, ServiceUnits.socket),
                (dir + "/" + ServiceUnits.serviceName, ServiceUnits.service(executable: executable)),
            ]
            do {
                try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
                for (path, content) in files { try content.write(toFile: path, atomically: true, encoding: .utf8) }
            } catch {
                fail("cannot write the units to \(dir): \(error.localizedDescription)")
            }
            let commands = ["systemctl --user daemon-reload", "systemctl --user enable --now blazed.socket"]
            global.output(["unitDir": .string(dir), "files": .array(files.map { .string($0.0) }), "execStart": .string(executable),
                "commands": .array(commands.map { .string($0) })]) { _ in
                for (path, _) in files { print("wrote \(path)") }
                print("blazed: \(executable)")
                print("To start blazed on the first connection, and at every login, run:")
                for command in commands { print("  \(command)") }
                print("A blazed already started by hand holds the socket: stop it first.")
            }
        }
    }

    struct Uninstall: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove blazed's user units (data and configuration stay) and print the systemctl commands to run first.")
        @OptionGroup var global: Global
        @OptionGroup var units: UnitDirectory

        func run() throws {
            let dir = units.path
            var removed: [JSONValue] = []
            for name in [ServiceUnits.socketName, ServiceUnits.serviceName] {
                let path = dir + "/" + name
                guard FileManager.default.fileExists(atPath: path) else { continue }
                do { try FileManager.default.removeItem(atPath: path) } catch { fail("cannot remove \(path): \(error.localizedDescription)") }
                removed.append(.string(path))
            }
            let commands = ["systemctl --user disable --now blazed.socket blazed.service", "systemctl --user daemon-reload"]
            global.output(["removed": .array(removed), "commands": .array(commands.map { .string($0) })]) { _ in
                if removed.isEmpty { print("no blazed units in \(dir)") }
                for path in removed { print("removed \(text(path))") }
                print("If they were enabled, stop and forget them with:")
                for command in commands { print("  \(command)") }
            }
        }
    }

    struct StatusCmd: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "status", abstract: "Show whether the units are installed, what they run, and whether blazed answers.")
        @OptionGroup var global: Global
        @OptionGroup var units: UnitDirectory

        func run() throws {
            let dir = units.path
            var unitInfo: [String: JSONValue] = [:]
            for name in [ServiceUnits.socketName, ServiceUnits.serviceName] {
                let path = dir + "/" + name
                unitInfo[name] = FileManager.default.fileExists(atPath: path) ? .string(path) : .null
            }
            let service = (try? String(contentsOfFile: dir + "/" + ServiceUnits.serviceName, encoding: .utf8)) ?? ""
            let execStart = service.split(separator: "\n").first { $0.hasPrefix("ExecStart=") }.map { String($0.dropFirst(10)) }
            var daemon: RPC.DaemonInfo.Result?
            if let c = try? BlazeConnection(socketPath: global.socketPath, timeoutSeconds: 5) {
                daemon = try? c.call(RPC.DaemonInfo())
                c.close()
            }
            let result: JSONValue = [
                "unitDir": .string(dir), "socketUnit": unitInfo[ServiceUnits.socketName] ?? .null,
                "serviceUnit": unitInfo[ServiceUnits.serviceName] ?? .null, "execStart": execStart.map { .string($0) } ?? .null,
                "socket": .string(global.socketPath), "running": .bool(daemon != nil),
                "pid": daemon.map { .int(Int64($0.pid)) } ?? .null,
            ]
            global.output(result) { r in
                let installed = r["socketUnit"] != .null && r["serviceUnit"] != .null
                print("units     \(installed ? Colour.green("installed") : Colour.yellow("not installed")) in \(dir)")
                if let execStart { print("runs      \(execStart)") }
                print("socket    \(global.socketPath)")
                print("daemon    " + (daemon.map { Colour.green("running") + ", pid \($0.pid)" } ?? Colour.yellow("not answering")))
                if !installed { print("Install the units with: blazectl service install") }
            }
        }
    }
}
