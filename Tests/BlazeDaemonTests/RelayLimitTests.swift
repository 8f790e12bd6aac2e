import BlazeCrypto
import BlazeTestSupport
import Crypto
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Relay limits (Protocol/RELAY.md, "Limits", "What it does"): behind a reverse proxy, a trusted proxy's connections
/// count for the clients it names, and nobody else can name whom they count for; snapshot pieces are taken only after
/// a current writer's manifest.
@Suite struct RelayLimitTests {
    /// Opens a device connection through the WebSocket whose request says it forwards for `forwardedFor`; false when
    /// the relay closes it (over a limit).
    /// With `handshake` false it stalls once the relay's hello came (true: the relay admitted it).
    static func opens(
        _ key: SpaceKey, _ relay: RelayProcess, forwardedFor: String?, into held: inout [HostileMember], handshake: Bool = true
    ) -> Bool {
        let h = HostileMember(key: key)
        do {
            try h.connect(
                port: relay.port, webSocket: "/v1/sync", headers: forwardedFor.map { ["X-Forwarded-For: \($0)"] } ?? [],
                handshake: handshake)
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

    /// Places kept for members (RELAY.md, "Limits"): capability holders with fresh keys take every connection place
    /// not reserved, and strangers' stalled handshakes every handshake place not reserved; a device the log lists
    /// still gets in and syncs, and an address a listed device came from still gets a handshake place.
    @Test func placesAreKeptForTheSpacesMembers() throws {
        let relay = try RelayProcess(arguments: [
            "--trusted-proxy", "127.0.0.0/8", "--max-connections-per-address", "100", "--max-connections", "10",
            "--reserved-connections", "5", "--max-handshakes", "4", "--reserved-handshakes", "2", "--handshake-timeout", "60",
        ])
        let (a, ca, capability) = try sharedTeam(servedBy: relay)
        let key = try RelayCapability(text: capability).key
        _ = try ca.call("peer.add", ["db": "team", "address": .string(relay.address)])
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "d", "doc": ["v": 1]])
        let na = try nodeID(ca, "team")
        #expect(try eventually { try relay.held()[na] == ownSeq(ca, "team") }, "the member synced: its address is known")
        _ = try ca.call("peer.remove", ["db": "team", "address": .string(relay.address)])

        // Five capability holders the log does not list take the five places not reserved; a sixth is refused.
        var held: [HostileMember] = []
        #expect(eventually { relay.connections() == 0 }, "the member's link closed")
        for i in 1...5 { #expect(Self.opens(key, relay, forwardedFor: "203.0.113.\(i)", into: &held)) }
        #expect(!Self.opens(key, relay, forwardedFor: "203.0.113.6", into: &held), "no place left for unlisted devices")
        // The member still gets in, and syncs.
        _ = try ca.call("peer.add", ["db": "team", "address": .string(relay.address)])
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "e", "doc": ["v": 2]])
        #expect(try eventually { try relay.held()[na] == ownSeq(ca, "team") }, "the member synced through a reserved place")

        // Strangers stalling in their handshake take the two handshake places not reserved; a third is refused, while
        // the member's address (the proxy's own, without a header) still gets one.
        #expect(Self.opens(key, relay, forwardedFor: "198.51.100.1", into: &held, handshake: false))
        #expect(Self.opens(key, relay, forwardedFor: "198.51.100.2", into: &held, handshake: false))
        #expect(!Self.opens(key, relay, forwardedFor: "198.51.100.3", into: &held, handshake: false), "unknown: refused")
        #expect(Self.opens(key, relay, forwardedFor: nil, into: &held, handshake: false), "a known address is admitted")
        for h in held { h.close() }
        a.stop()
        relay.stop()
    }

    /// A capability holder the log does not list streams snapshot pieces with no manifest before them, on several
    /// connections: the relay refuses each connection at its first piece (`bad_snapshot`) instead of holding any of
    /// it; a manifest it signs is refused before any piece is taken; the space's members go on syncing through it.
    @Test func relayRefusesPiecesWithoutAManifest() throws {
        let relay = try RelayProcess()
        let (a, ca, capability) = try sharedTeam(servedBy: relay)
        _ = try ca.call("peer.add", ["db": "team", "address": .string(relay.address)])
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "d", "doc": ["v": 1]])
        let na = try nodeID(ca, "team")
        #expect(try eventually { try relay.held()[na] != nil }, "the relay holds the space's log once the member brought it")
        let key = try RelayCapability(text: capability).key
        for _ in 0..<4 {
            let h = HostileMember(key: key)
            try h.connect(port: relay.port, webSocket: "/v1/sync")
            // index · prev · epoch · nonce · 64 KiB standing for sealed records · tag: well formed, never opened.
            var part: [UInt8] = []
            part.appendBE(UInt32(0))
            part += [UInt8](repeating: 0, count: 32) + [0, 0, 0, 0] + SpaceKey.randomBytes(12) + SpaceKey.randomBytes((64 << 10) + 16)
            try h.send([8] + part)
            // Whatever follows is not read: the connection ends at the first piece.
            for _ in 0..<4 { try? h.send([8] + part) }
            let end = h.awaitClose(seconds: 20)
            #expect(end.closed && end.error == "bad_snapshot", "refused at the first piece")
            h.close()
        }
        // A manifest of its own, before any piece: not a writing member, refused.
        let h = HostileMember(key: key)
        try h.connect(port: relay.port, webSocket: "/v1/sync")
        let manifest = SnapshotManifest(
            space: key.id, createdMs: 1, parts: 1, size: 1_000, lastPart: SpaceKey.randomBytes(32), heads: [:], identity: h.identity)
        try h.send([9] + manifest.bytes)
        let end = h.awaitClose(seconds: 20)
        #expect(end.closed && end.error == "bad_snapshot", "a stranger's manifest is refused")
        h.close()
        #expect(Self.metric(relay, "blaze_relay_snapshots_dropped_total") ?? 0 == 0, "nothing was held to drop")
        // The member still syncs through it.
        _ = try ca.call("doc.put", ["db": "team", "collection": "c", "id": "e", "doc": ["v": 2]])
        #expect(try eventually { try relay.held()[na] == ownSeq(ca, "team") })
        a.stop()
        relay.stop()
    }

    /// The value of an unlabelled counter on the relay's `/metrics`.
    static func metric(_ relay: RelayProcess, _ name: String) -> Int? {
        guard let page = try? httpExchange(port: relay.port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").body else { return nil }
        return page.split(separator: "\n").first { $0.hasPrefix(name + " ") }.flatMap { Int($0.split(separator: " ").last ?? "") }
    }

    /// The index of the one of `fds` the other end closes without sending a byte, within 10 s; nil when none is.
    static func closedAtOnce(_ fds: [Int32]) -> Int? {
        var polled = fds.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        guard poll(&polled, nfds_t(polled.count), 10_000) > 0 else { return nil }
        var byte: UInt8 = 0
        return polled.indices.first { polled[$0].revents != 0 && recv(fds[$0], &byte, 1, Int32(MSG_DONTWAIT)) == 0 }
    }

    @Test func connectionsOverTheLimitsAreClosedBeforeAByteIsRead() throws {
        let relay = try RelayProcess(arguments: ["--max-connections", "2", "--handshake-timeout", "30"])
        let (a, _, capability) = try sharedTeam(servedBy: relay)
        // Two connections that never finish their handshake hold both places; a third is closed at once. Which of
        // three opened together is the third is the relay's to say: its event loops admit them in any order.
        var held = try (0..<3).map { _ in try HostileMember.openSocket(port: relay.port) }
        let third = try #require(Self.closedAtOnce(held), "none of three connections was closed")
        Glibc.close(held.remove(at: third))
        // A place freed is a place taken: the member gets through.
        Glibc.close(held[0])
        let member = HostileMember(key: try RelayCapability(text: capability).key)
        #expect(eventually { (try? member.connect(port: relay.port, webSocket: "/v1/sync")) != nil })
        member.close()
        Glibc.close(held[1])
        // A source address reconnecting in a loop: with --handshake-rate 1 (bursts of 2), a third connection within
        // the second is closed at once, before the gate or a handshake.
        let slow = try RelayProcess(arguments: ["--handshake-rate", "1"])
        let burst = try (0..<3).map { _ in try HostileMember.openSocket(port: slow.port) }
        #expect(Self.closedAtOnce(burst) != nil, "none of three connections was closed at once")
        for fd in burst { Glibc.close(fd) }
        a.stop()
        relay.stop()
        slow.stop()
    }
}
