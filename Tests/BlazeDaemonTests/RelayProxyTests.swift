import BlazeCrypto
import BlazeTestSupport
import Testing

/// Relay limits behind a reverse proxy (Protocol/RELAY.md, "Limits"): a trusted proxy's connections count for the
/// clients it names, and nobody else can name whom they count for.
@Suite struct RelayProxyTests {
    /// Opens a device connection through the WebSocket whose request says it forwards for `forwardedFor`; false when
    /// the relay closes it (over a limit).
    static func opens(_ key: SpaceKey, _ relay: RelayProcess, forwardedFor: String, into held: inout [HostileMember]) -> Bool {
        let h = HostileMember(key: key)
        do {
            try h.connect(port: relay.port, webSocket: "/v1/sync", headers: ["X-Forwarded-For: \(forwardedFor)"])
            held.append(h)
            return true
        } catch {
            return false
        }
    }

    @Test func aTrustedProxysClientsAreCountedApartAndOthersCannotClaimToBeOne() throws {
        let proxied = try RelayProcess(arguments: ["--trusted-proxy", "127.0.0.0/8", "--max-connections-per-address", "2"])
        let (a, _, capability) = try sharedTeam(servedBy: proxied)
        let key = try RelayCapability(text: capability).key
        var held: [HostileMember] = []
        // Two connections per client, whichever proxy hop says so: the third of one client is closed, another
        // client still gets in.
        #expect(Self.opens(key, proxied, forwardedFor: "203.0.113.5", into: &held))
        #expect(Self.opens(key, proxied, forwardedFor: "198.51.100.1, 203.0.113.5", into: &held), "earlier hops are the client's word")
        #expect(!Self.opens(key, proxied, forwardedFor: "203.0.113.5", into: &held))
        #expect(Self.opens(key, proxied, forwardedFor: "203.0.113.6", into: &held))
        // A trusted hop is skipped: the client is the last address before it.
        #expect(Self.opens(key, proxied, forwardedFor: "198.51.100.7, 127.0.0.9", into: &held))
        // IPv6 clients count by their /64.
        #expect(Self.opens(key, proxied, forwardedFor: "2001:db8:1:2::1", into: &held))
        #expect(Self.opens(key, proxied, forwardedFor: "2001:db8:1:2:ffff::9", into: &held))
        #expect(!Self.opens(key, proxied, forwardedFor: "2001:db8:1:2::3", into: &held))
        #expect(Self.opens(key, proxied, forwardedFor: "2001:db8:1:3::1", into: &held))
        // Closing gives the place back.
        held.removeFirst().close()
        #expect(eventually { Self.opens(key, proxied, forwardedFor: "203.0.113.5", into: &held) })
        for h in held { h.close() }
        held = []

        // Without --trusted-proxy the header is ignored: every connection counts for its socket's address.
        let direct = try RelayProcess(arguments: ["--max-connections-per-address", "2"])
        let directKey = try RelayCapability(text: capability).key
        try direct.addSpace(capability)
        #expect(Self.opens(directKey, direct, forwardedFor: "203.0.113.1", into: &held))
        #expect(Self.opens(directKey, direct, forwardedFor: "203.0.113.2", into: &held))
        #expect(!Self.opens(directKey, direct, forwardedFor: "203.0.113.3", into: &held))
        for h in held { h.close() }
        a.stop()
        proxied.stop()
        direct.stop()
    }
}
