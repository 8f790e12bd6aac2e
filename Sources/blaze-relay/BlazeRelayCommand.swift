import ArgumentParser
import BlazeCrypto
import BlazeDaemon
import BlazeProtocol
import BlazeRelay
import BlazeSync
import Foundation
import Logging
import NIOPosix
import NIOSSL
import PostgresNIO

#if canImport(Glibc)
import Glibc
#endif

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
            """,
        subcommands: [Serve.self, AddSpace.self], defaultSubcommand: Serve.self)
}

/// Options every subcommand shares.
struct RelayOptions: ParsableArguments {
    @Option(help: "Directory of the relay's identity, and of its database unless --postgres (created when missing).")
    var dataDir: String

    @Option(
        help: ArgumentHelp(
            "Keep the relay's data in PostgreSQL instead of SQLite, shared by every relay process given the same URL.",
            discussion: "postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=require], or ?host=/socket/dir for a Unix socket.",
            valueName: "url"))
    var postgres: String?

    /// Opens the relay's store (creating the directory).
    func openStore(logger: Logger) async throws -> any RelayBackend {
        try FileManager.default.createDirectory(atPath: dataDir, withIntermediateDirectories: true)
        guard let postgres else { return try RelayStore(path: dataDir + "/relay.db") }
        let configuration: PostgresClient.Configuration
        do {
            configuration = try PostgresRelayStore.configuration(url: postgres)
        } catch {
            throw ValidationError("\(error)")
        }
        return try await PostgresRelayStore(configuration: configuration, logger: logger)
    }
}

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Serve devices (the default).")

    @OptionGroup var options: RelayOptions

    @Option(help: "Address to accept devices on (host:port; port 0 picks one; the URL devices use is printed at start).")
    var listen = "127.0.0.1:7400"

    @Option(help: "PEM certificate chain: serve TLS (wss://) with it. Needs --tls-key.")
    var tlsCert: String?

    @Option(help: "PEM private key of --tls-cert.")
    var tlsKey: String?

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel = "info"

    @Option(help: "Log lines on stderr: text (key=value) or json, as blazed writes them.")
    var logFormat = "text"

    @Option(help: "Most device connections at once (further ones are closed before a byte is read).")
    var maxConnections = RelayServer.defaultLimits.maxConnections

    @Option(help: "Most connections still in their handshake at once.")
    var maxHandshakes = RelayServer.defaultLimits.maxHandshakes

    @Option(help: "Most connections from one source address.")
    var maxConnectionsPerAddress = RelayServer.defaultLimits.maxConnectionsPerAddress

    @Option(
        help: """
            Of --max-handshakes, places kept for addresses a listed device proved its key from in the last 7 days \
            (default: a quarter).
            """)
    var reservedHandshakes: Int?

    @Option(help: "Of --max-connections, places kept for devices a space's log lists (default: a fifth).")
    var reservedConnections: Int?

    /// The reserved places of `limits` as given, or the default share of their maximum.
    func reserving(_ limits: inout SyncListenerLimits) {
        limits.reservedHandshakes = reservedHandshakes ?? limits.maxHandshakes / 4
        limits.reservedConnections = reservedConnections ?? limits.maxConnections / 5
    }

    @Option(help: "Seconds a device may take from connecting to finishing its handshake (WebSocket upgrade included).")
    var handshakeTimeout = RelayServer.defaultLimits.handshakeTimeoutMs / 1000

    @Option(help: "New connections per second from one source address, bursts of twice that (0: no limit); more are closed at once.")
    var handshakeRate = RelayServer.defaultHandshakeRate

    @Option(help: "Days a space's data is kept after its last write (0: for good). Devices hand it back when they reconnect.")
    var retentionDays = 0

    @Option(
        help: """
            A reverse proxy or load balancer (an address or CIDR block; repeatable) whose connections are counted for \
            the client its X-Forwarded-For header names, not for the proxy.
            """)
    var trustedProxy: [String] = []

    func validate() throws {
        for (name, value) in [
            ("--max-connections", maxConnections), ("--max-handshakes", maxHandshakes),
            ("--max-connections-per-address", maxConnectionsPerAddress), ("--handshake-timeout", handshakeTimeout),
        ] where !(1...1_000_000).contains(value) {
            throw ValidationError("\(name) must be from 1 to 1000000, got \(value)")
        }
        if let reservedHandshakes, !(0..<maxHandshakes).contains(reservedHandshakes) {
            throw ValidationError("--reserved-handshakes must be from 0 to below --max-handshakes (\(maxHandshakes)), got \(reservedHandshakes)")
        }
        if let reservedConnections, !(0..<maxConnections).contains(reservedConnections) {
            throw ValidationError("--reserved-connections must be from 0 to below --max-connections (\(maxConnections)), got \(reservedConnections)")
        }
        if (tlsCert == nil) != (tlsKey == nil) { throw ValidationError("--tls-cert and --tls-key go together") }
        guard LineLogHandler.Format(rawValue: logFormat) != nil else {
            throw ValidationError("--log-format must be text or json, got \(logFormat)")
        }
        guard Logger.Level(rawValue: logLevel) != nil else {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical")
        }
        if !(0...36_500).contains(retentionDays) {
            throw ValidationError("--retention-days must be from 0 to 36500, got \(retentionDays)")
        }
        if !(0...1_000_000).contains(handshakeRate) {
            throw ValidationError("--handshake-rate must be from 0 to 1000000, got \(handshakeRate)")
        }
        for proxy in trustedProxy where AddressRange(proxy) == nil || proxy.hasSuffix("/0") {
            throw ValidationError(
                "--trusted-proxy must be an IP address or CIDR block naming proxies only (10.0.0.0/8, fd00::/8; not /0), got \(proxy)")
        }
    }

    /// The server TLS context of --tls-cert and --tls-key, nil when not given.
    func tlsContext() throws -> NIOSSLContext? {
        guard let tlsCert, let tlsKey else { return nil }
        do {
            let chain = try NIOSSLCertificate.fromPEMFile(tlsCert).map { NIOSSLCertificateSource.certificate($0) }
            var config = TLSConfiguration.makeServerConfiguration(certificateChain: chain, privateKey: .privateKey(try NIOSSLPrivateKey(file: tlsKey, format: .pem)))
            config.minimumTLSVersion = .tlsv12
            return try NIOSSLContext(configuration: config)
        } catch {
            throw ValidationError("cannot use --tls-cert \(tlsCert) / --tls-key \(tlsKey): \(error)")
        }
    }

    func run() async throws {
        guard let address = PeerAddress(listen) ?? (listen.hasSuffix(":0") ? PeerAddress(String(listen.dropLast(2)) + ":1") : nil)
        else { throw ValidationError("--listen must be host:port") }
        let port = listen.hasSuffix(":0") ? 0 : address.port
        // Structured lines on stderr; stdout carries only the URL line.
        let level = Logger.Level(rawValue: logLevel) ?? .info
        let format = LineLogHandler.Format(rawValue: logFormat) ?? .text
        LoggingSystem.bootstrap { label in LineLogHandler(label: label, level: level, format: format) }
        let logger = Logger(label: "blaze-relay")
        let store = try await options.openStore(logger: logger)
        let identity = try DeviceIdentity.loadOrCreate(directory: options.dataDir + "/keys")
        var limits = RelayServer.defaultLimits
        limits.maxConnections = maxConnections
        limits.maxHandshakes = maxHandshakes
        limits.maxConnectionsPerAddress = maxConnectionsPerAddress
        limits.handshakeTimeoutMs = handshakeTimeout * 1000
        reserving(&limits)
        let relay = RelayServer(
            store: store, identity: identity, group: MultiThreadedEventLoopGroup.singleton, logger: logger,
            limits: limits, handshakesPerSecondPerAddress: handshakeRate, trustedProxies: trustedProxy.compactMap(AddressRange.init))
        let termination = Self.catchTermination()
        let tls = try tlsContext()
        let bound = try await relay.listen(host: address.host, port: port, tls: tls)
        if retentionDays > 0 { relay.keep(for: .seconds(retentionDays * 86_400)) }
        let host = address.host.contains(":") ? "[\(address.host)]" : address.host
        let url = "\(tls == nil ? "ws" : "wss")://\(host):\(bound)\(WebSocketBytes.defaultPath)"
        // The URL on stdout, alone on its line, so scripts and tests can read the port picked.
        FileHandle.standardOutput.write(Data("listening \(url)\n".utf8))
        logger.info(
            "Relay started",
            metadata: ["url": "\(url)", "spaces": "\(relay.servedCount)", "store": "\(options.postgres == nil ? "sqlite" : "postgresql")"])
        for await _ in termination { break }
        logger.info("Relay stopping")
        await relay.shutdown()
        (store as? PostgresRelayStore)?.close()
    }

    /// Starts catching SIGTERM and SIGINT (before the URL is printed, so a signal right after it still stops the relay
    /// cleanly); the returned stream yields once when one arrives.
    static func catchTermination() -> AsyncStream<Void> {
        signal(SIGTERM, SIG_IGN)
        signal(SIGINT, SIG_IGN)
        let (stream, continuation) = AsyncStream<Void>.makeStream()
        for sig in [SIGTERM, SIGINT] {
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler { continuation.yield() }
            source.resume()
            Retained.sources.append(source)
        }
        return stream
    }
}

/// Keeps the signal sources alive for the life of the process.
enum Retained {
    nonisolated(unsafe) static var sources: [any DispatchSourceSignal] = []
}

struct AddSpace: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Serve a space, given its relay capability ('-' reads them from stdin, one per line); a running relay picks it up.")

    @OptionGroup var options: RelayOptions

    @Argument(help: "The relay capability (blazedb-relay-1.…), or - to read capabilities from stdin, one per line.")
    var capability: String

    func run() async throws {
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
        let store = try await options.openStore(logger: logger)
        defer { (store as? PostgresRelayStore)?.close() }
        for cap in caps {
            let added = try await store.add(cap)
            print(added ? "serving space \(hexString(cap.space))" : "space \(hexString(cap.space)) was served already")
        }
    }
}
