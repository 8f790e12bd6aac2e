import NIOCore
import NIOSSL
import Synchronization

/// The TLS side of `wss://` links: one client context per engine (the system's trust roots, plus the PEM file the
/// daemon is configured with, if any), a handler per connection that verifies the relay's certificate for its host.
final class TLSClient: Sendable {
    private let context: Mutex<NIOSSLContext?> = Mutex(nil)
    /// A PEM file of extra certificates to trust (a private CA, a self-signed relay), or nil.
    let extraTrustRoots: String?

    init(extraTrustRoots: String?) { self.extraTrustRoots = extraTrustRoots }

    /// The context, built on first use (reading the trust store once, not per connection).
    private func sslContext() throws -> NIOSSLContext {
        try context.withLock { c in
            if let c { return c }
            var config = TLSConfiguration.makeClientConfiguration()
            config.minimumTLSVersion = .tlsv12
            if let extraTrustRoots { config.additionalTrustRoots = [.file(extraTrustRoots)] }
            let made = try NIOSSLContext(configuration: config)
            c = made
            return made
        }
    }

    /// Puts a TLS client handler for `host` at the bottom of `channel`'s pipeline.
    func configure(_ channel: any Channel, host: String) throws {
        // An IP literal is checked against the certificate's IP addresses, a name against its DNS names.
        let isIP = host.contains(":") || host.allSatisfy { $0.isNumber || $0 == "." }
        let handler = try NIOSSLClientHandler(context: sslContext(), serverHostname: isIP ? nil : host)
        try channel.pipeline.syncOperations.addHandler(handler)
    }
}
