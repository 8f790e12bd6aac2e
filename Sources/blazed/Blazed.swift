import ArgumentParser
import BlazeConfig
import BlazeDaemon
import BlazeLog
import BlazeProtocol
import BlazeSettings
import Foundation
import Logging
import ServiceLifecycle

#if canImport(Glibc)
import Glibc
#endif

@main
struct Blazed: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "blazed", abstract: "The BlazeDB daemon: serves local document databases over a Unix socket.",
        discussion: """
            Every setting can come from a flag, an environment variable (BLAZEDB_ and the setting's name in capitals, \
            '_' for '-': BLAZEDB_LOG_LEVEL) or the configuration file ($XDG_CONFIG_HOME/blazedb/blazed.yaml, a YAML \
            mapping of setting names to values), in that order of precedence, over the built-in defaults. \
            --print-config shows the effective value of each setting and where it came from.

            Under systemd, blazed serves the socket passed by socket activation (LISTEN_FDS) and reports readiness \
            and shutdown to $NOTIFY_SOCKET.

            SETTINGS:
            \(BlazedSettings.resolver.helpText)
            """)

    @Option(help: "Configuration file (default: $BLAZEDB_CONFIG, else $XDG_CONFIG_HOME/blazedb/blazed.yaml).")
    var config: String?

    @Flag(help: "Print the effective configuration and where each value came from, then exit.")
    var printConfig = false

    @Flag(help: "Print the configuration as JSON (with --print-config).") var json = false

    @Flag(help: "Print the version, the sync protocols spoken and the file formats written, then exit.") var version = false

    @Argument(
        parsing: .allUnrecognized,
        help: ArgumentHelp("Settings: --name value, --name=value, --switch or --no-switch (listed below).", valueName: "setting"))
    var settingArguments: [String] = []

    func run() async throws {
        if version {
            print("blazed \(blazedVersionText)")
            return
        }
        let environment = ProcessInfo.processInfo.environment
        let settings: ResolvedConfig
        do {
            let flags = try BlazedSettings.resolver.flags(settingArguments)
            settings = try BlazedSettings.resolver.resolve(flags: flags, environment: environment, configFile: config)
        } catch {
            Self.fail("blazed: \(error)")
        }
        if printConfig {
            print(json ? settings.json.jsonText : ConfigTable.render(settings))
            return
        }
        var daemonConfig = DaemonConfig(settings: settings, environment: environment)
        let level = Logger.Level(rawValue: daemonConfig.logLevel) ?? .info
        let format = LineLogHandler.Format(rawValue: daemonConfig.logFormat) ?? .text
        LoggingSystem.bootstrap { label in LineLogHandler(label: label, level: level, format: format) }
        let logger = Logger(label: "blazed")
        // Everything blazed creates (databases and their WAL, backups, keys, directories) is for this user alone,
        // whatever umask it was started with.
        umask(0o077)
        // Sockets and database files share one descriptor table: take all the kernel allows (systemd's default soft
        // limit is 1,024), so connection limits, not descriptors, decide what is refused.
        let files = ProcessLimits.raiseOpenFiles()
        logger.debug("Open file limit", metadata: ["limit.soft": "\(files.soft)", "limit.hard": "\(files.hard)"])
        do {
            if let inherited = try Systemd.inheritedSocket(environment: environment) {
                daemonConfig.inheritedSocket = inherited
                daemonConfig.socketPath = inherited.path
            }
            let daemon = try Daemon(config: daemonConfig, logger: logger)
            let group = ServiceGroup(
                configuration: .init(
                    services: [.init(service: daemon, successTerminationBehavior: .gracefullyShutdownGroup)],
                    gracefulShutdownSignals: [.sigterm, .sigint],
                    logger: logger))
            try await group.run()
        } catch {
            Self.fail("blazed: \(error)")
        }
    }

    /// Writes one line to stderr and exits 1.
    static func fail(_ message: String) -> Never {
        let line = Array("\(message)\n".utf8)
        _ = line.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
        Glibc.exit(1)
    }
}
