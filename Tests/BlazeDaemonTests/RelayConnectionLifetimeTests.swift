import BlazeCrypto
import BlazeTestSupport
import Foundation
import Testing

@testable import BlazeRelay

/// A relay frees each connection's handler once the connection ends, however it ended: refused, stalled in its
/// handshake, or established and then closed by the device. (A handler that kept its own context would keep itself.)
@Suite struct RelayConnectionLifetimeTests {
    @Test func everyConnectionHandlerIsFreedWhenItsConnectionEnds() async throws {
        let relay = try await TamperingRelay()
        let key = SpaceKey.generate()
        _ = try await relay.server.add(RelayCapability(key: key))
        let port = Int(relay.address.split(separator: ":").last!.split(separator: "/").first!)!
        for round in 0..<3 {
            let member = HostileMember(key: key), stranger = HostileMember(key: SpaceKey.generate())
            let staller = HostileMember(key: key)
            try member.connect(port: port, webSocket: "/v1/sync")
            #expect(throws: (any Error).self, "round \(round): a stranger is refused") {
                try stranger.connect(port: port, webSocket: "/v1/sync")
            }
            try staller.connect(port: port, webSocket: "/v1/sync", handshake: false)
            #expect(eventually { relay.server.connectionHandlers.load(ordering: .relaxed) >= 2 })
            member.close()
            stranger.close()
            staller.close()
        }
        #expect(eventually { relay.server.connectionHandlers.load(ordering: .relaxed) == 0 },
            "handlers alive: \(relay.server.connectionHandlers.load(ordering: .relaxed))")
        await relay.stop()
    }
}
