import ArgumentParser
import BlazeConfig
import BlazeCrypto
import BlazeLog
import BlazeProtocol
import BlazeRelay
import BlazeSettings
import BlazeWire
import Foundation
import Logging
import NIOPosix
import NIOSSL
import PostgresNIO
import ServiceLifecycle

@main
struct BlazeRelayCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "blaze-relay",
        abstract: "Stores and forwards BlazeDB sync entries for devices that are never online together; reads none of them.",
        discussion: """
            A relay serves the spaces an operator adds with 'blaze-relay add-space' (a relay capability from \
            'blazectl db relay-capability': it lets the relay prove itself to devices and store their sealed \
            entries, never open one). Devices add the relay as a peer ('blazectl peer add DB ws://HOST:PORT', or \
            wss:// behind TLS) and sync through it with the peer protocol carried by a WebSocket, so the relay runs \
            behind ordinary HTTPS reverse proxies. The same port answers GET /healthz and GET /metrics \
            (Prometheus). See Protocol/RELAY.md.

            Every setting can come from a flag, an environment variable (BLAZE_RELAY_ and the setting's name in \
            capitals, '_' for '-': BLAZE_RELAY_LISTEN) or the configuration file ($XDG_CONFIG_HOME/blazedb/relay.yaml, \
            a YAML mapping of setting names to values), in that order of precedence, over the built-in defaults. \
            'blaze-relay config' shows the effective value of each and where it came from.

            SETTINGS:
            \(RelaySettings.resolver.helpText)
            """,
        version: "blaze-relay \(blazeVersion) (sync protocol \(Handshake.protocols.lowerBound)–\(Handshake.protocols.upperBound), "
            + "relay format \(RelayStore.formatVersion), PostgreSQL schema \(PostgresRelayStore.formatVersion))",
        subcommands: [Serve.self, AddSpace.self, Config.self], defaultSubcommand: Serve.self)
}

/// The configuration file and the settings given on the command line, as every subcommand takes them.
struct SettingArguments: ParsableArguments {
    @Option(help: "Configuration file (default: $BLAZE_RELAY_CONFIG, else $XDG_CONFIG_HOME/blazedb/relay.yaml).")
    var config: String?

    @Argument(
        parsing: .allUnrecognized,
        help: ArgumentHelp("Settings: --name value or --name=value (listed in blaze-relay --help).", valueName: "setting"))
    var settingArguments: [String] = []

    /// The settings resolved: flags over environment over the file over the defaults; any error names the setting.
    func resolve() throws -> ResolvedConfig { try resolveSettings(settingArguments, config: config) }
}

/// The settings of `arguments` (`--name value`) and `flags` (by name) over the environment, the configuration file
/// `config` (nil: the default path) and the defaults; any error names the setting and where its value came from.
func resolveSettings(_ arguments: [String], flags: [String: String] = [:], config: String?) throws -> ResolvedConfig {
    do {
        let given = try RelaySettings.resolver.flags(arguments).merging(flags) { $1 }
        return try RelaySettings.resolver.resolve(flags: given, environment: ProcessInfo.processInfo.environment, configFile: config)
    } catch {
        throw ValidationError(error.description)
    }
}

/// Opens the relay's store of `settings` (creating its directory): SQLite in `data-dir`, or PostgreSQL.
func openStore(_ settings: ResolvedConfig, logger: Logger) async throws -> any RelayBackend {
    let dataDir = settings[RelaySettings.dataDir]
    try FileManager.default.createDirectory(atPath: dataDir, withIntermediateDirectories: true)
    var limits = RelayLimits()
    limits.maxBytesPerSpace = settings[RelaySettings.spaceQuotaMiB] << 20
    limits.maxChunkBytesPerSpace = settings[RelaySettings.spaceChunkQuotaMiB] << 20
    guard let postgres = settings[RelaySettings.postgres] else { return try RelayStore(path: dataDir + "/relay.db", limits: limits) }
    let configuration: PostgresClient.Configuration
    do {
        configuration = try PostgresRelayStore.configuration(url: postgres)
    } catch {
        throw ValidationError("\(error)")
    }
    return try await PostgresRelayStore(configuration: configuration, limits: limits, logger: logger)
}

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Serve devices (the default).")

    @OptionGroup var settings: SettingArguments

    func run() async throws {
        let resolved = try settings.resolve()
        let relay = try RelayService(resolved)
        let level = Logger.Level(rawValue: resolved[RelaySettings.logLevel]) ?? .info
        let format = LineLogHandler.Format(rawValue: resolved[RelaySettings.logFormat]) ?? .text
        // Structured lines on stderr; stdout carries only the URL line.
        LoggingSystem.bootstrap { label in LineLogHandler(label: label, level: level, format: format) }
        let logger = Logger(label: "blaze-relay")
        let group = ServiceGroup(
            configuration: .init(
                services: [.init(service: relay, successTerminationBehavior: .gracefullyShutdownGroup)],
                gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await group.run()
    }
}

/// The relay as a service: listens, prints its URL, serves until a graceful shutdown (SIGTERM or SIGINT through the
/// `ServiceGroup`), then closes every connection and its store.
struct RelayService: Service {
    let settings: ResolvedConfig
    let limits: SyncListenerLimits
    let tls: NIOSSLContext?
    let address: PeerAddress
    let port: Int

    /// Checks what the settings' rules cannot check alone (limits against each other, the TLS files).
    init(_ settings: ResolvedConfig) throws {
        self.settings = settings
        var limits = RelayServer.defaultLimits
        limits.maxConnections = settings[RelaySettings.maxConnections]
        limits.maxHandshakes = settings[RelaySettings.maxHandshakes]
        limits.maxConnectionsPerAddress = settings[RelaySettings.maxConnectionsPerAddress]
        limits.handshakeTimeoutMs = settings[RelaySettings.handshakeTimeout]
        RelayServer.reserveDefaultShares(&limits)
        if let reserved = settings[RelaySettings.reservedHandshakes] {
            guard reserved < limits.maxHandshakes else {
                throw ValidationError("reserved-handshakes must be below max-handshakes (\(limits.maxHandshakes)), got \(reserved)")
            }
            limits.reservedHandshakes = reserved
        }
        if let reserved = settings[RelaySettings.reservedConnections] {
            guard reserved < limits.maxConnections else {
                throw ValidationError("reserved-connections must be below max-connections (\(limits.maxConnections)), got \(reserved)")
            }
            limits.reservedConnections = reserved
        }
        self.limits = limits
        let listen = settings[RelaySettings.listen]
        guard let address = PeerAddress(listen, listening: true) else { throw ValidationError("listen must be host:port") }
        self.address = address
        self.port = address.port
        self.tls = try Self.tlsContext(cert: settings[RelaySettings.tlsCert], key: settings[RelaySettings.tlsKey])
    }

    /// The server TLS context of `tls-cert` and `tls-key`, nil when neither is set.
    static func tlsContext(cert: String?, key: String?) throws -> NIOSSLContext? {
        guard cert != nil || key != nil else { return nil }
        guard let cert, let key else { throw ValidationError("tls-cert and tls-key go together") }
        do {
            let chain = try NIOSSLCertificate.fromPEMFile(cert).map { NIOSSLCertificateSource.certificate($0) }
            var config = TLSConfiguration.makeServerConfiguration(
                certificateChain: chain, privateKey: .privateKey(try NIOSSLPrivateKey(file: key, format: .pem)))
            config.minimumTLSVersion = .tlsv12
            return try NIOSSLContext(configuration: config)
        } catch {
            throw ValidationError("cannot use tls-cert \(cert) / tls-key \(key): \(error)")
        }
    }

    func run() async throws {
        let logger = Logger(label: "blaze-relay")
        let store = try await openStore(settings, logger: logger)
        let dataDir = settings[RelaySettings.dataDir]
        let identity = try DeviceIdentity.loadOrCreate(directory: dataDir + "/keys")
        let relay = RelayServer(
            store: store, identity: identity, group: MultiThreadedEventLoopGroup.singleton, logger: logger, limits: limits,
            handshakesPerSecondPerAddress: settings[RelaySettings.handshakeRate],
            trustedProxies: settings[RelaySettings.trustedProxy].compactMap(AddressRange.init))
        let bound = try await relay.listen(host: address.host, port: port, tls: tls)
        let retentionDays = settings[RelaySettings.retentionDays]
        if retentionDays > 0 { relay.keep(for: .seconds(Int64(retentionDays) * 86_400)) }
        let chunkLeaseDays = settings[RelaySettings.chunkLeaseDays]
        if chunkLeaseDays > 0 { relay.leaseChunks(for: .seconds(Int64(chunkLeaseDays) * 86_400)) }
        let host = address.host.contains(":") ? "[\(address.host)]" : address.host
        let url = "\(tls == nil ? "ws" : "wss")://\(host):\(bound)\(WebSocketBytes.defaultPath)"
        // The URL on stdout, alone on its line, so scripts and tests can read the port picked.
        FileHandle.standardOutput.write(Data("listening \(url)\n".utf8))
        let postgres = settings[RelaySettings.postgres] != nil
        logger.info(
            "Relay started", metadata: ["url": "\(url)", "spaces": "\(relay.servedCount)", "store": "\(postgres ? "postgresql" : "sqlite")"])
        // Until SIGTERM or SIGINT (or the group's cancellation).
        try? await gracefulShutdown()
        logger.info("Relay stopping")
        await relay.shutdown()
        (store as? PostgresRelayStore)?.close()
    }
}

struct AddSpace: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Serve a space, given its relay capability ('-' reads them from stdin, one per line); a running relay picks it up.")

    @Option(help: "The relay's data directory (the data-dir setting; default: as serve).")
    var dataDir: String?

    @Option(help: "The relay's PostgreSQL URL (the postgres setting; default: as serve).")
    var postgres: String?

    @Option(help: "Configuration file (default: $BLAZE_RELAY_CONFIG, else $XDG_CONFIG_HOME/blazedb/relay.yaml).")
    var config: String?

    @Argument(help: "The relay capability (blazedb-relay-1.…), or - to read capabilities from stdin, one per line.")
    var capability: String

    func run() async throws {
        var flags: [String: String] = [:]
        flags[RelaySettings.dataDir.name] = dataDir
        flags[RelaySettings.postgres.name] = postgres
        let settings = try resolveSettings([], flags: flags, config: config)
        var texts = [capability]
        if capability == "-" {
            texts = []
            while let line = readLine() {
                let text = line.trimmingCharacters(in: .whitespacesAndNewlines)
                if !text.isEmpty { texts.append(text) }
            }
        }
        // Every capability is checked before any is added.
        let caps = try texts.enumerated().map { i, text in
            do {
                return try RelayCapability(text: text)
            } catch {
                throw ValidationError("not a relay capability\(texts.count > 1 ? " (line \(i + 1))" : ""): \(error)")
            }
        }
        guard !caps.isEmpty else { throw ValidationError("no relay capability given") }
        var logger = Logger(label: "blaze-relay")
        logger.logLevel = .warning
        let store = try await openStore(settings, logger: logger)
        defer { (store as? PostgresRelayStore)?.close() }
        for cap in caps {
            let added = try await store.add(cap)
            print(added ? "serving space \(cap.space.hex)" : "space \(cap.space.hex) was served already")
        }
    }
}

struct Config: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the effective settings and where each value came from (flag, environment, file, default).")

    @OptionGroup var settings: SettingArguments

    @Flag(help: "Print the settings as JSON.") var json = false

    func run() throws {
        let resolved = try settings.resolve()
        print(json ? resolved.json.jsonText : ConfigTable.render(resolved))
    }
}
