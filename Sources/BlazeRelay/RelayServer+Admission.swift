import BlazeCrypto
import BlazeProtocol
import BlazeWire
import NIOHTTP1
import Synchronization

/// Who a connection counts for in the listener limits (Protocol/RELAY.md, "Limits"): its source address (an IPv6
/// one by its /64), or, behind a trusted proxy, the client the proxy names.
extension RelayServer {
    /// Admits a new connection counted for `address` (nil: a trusted proxy's, counted in the totals only for now)
    /// within the handshake rate and the gate's limits; false, and counted, when over one.
    func admit(address: String?) -> Bool {
        if let address, !handshakeRate.allow(address) {
            metrics.connectionsRefusedRate.increment()
            logger.debug("Relay refused a connection over its rate", metadata: ["address": "\(address)"])
            return false
        }
        guard gate.admit(address: address, known: address.map(isKnown) ?? true) else {
            metrics.connectionsRefusedOverLimit.increment()
            logger.debug("Relay refused a connection over its limits", metadata: ["address": "\(address ?? "a trusted proxy")"])
            return false
        }
        return true
    }

    /// Counts a trusted proxy's connection for `client` from now on, within its handshake rate and its connections;
    /// false, and counted, when over either.
    func admit(forwarded client: String, place: GatePlace) -> Bool {
        guard handshakeRate.allow(client) else {
            metrics.connectionsRefusedRate.increment()
            logger.debug("Relay refused a forwarded connection over its rate", metadata: ["client": "\(client)"])
            return false
        }
        guard place.rebind(to: client, known: isKnown(client)) else {
            metrics.connectionsRefusedOverLimit.increment()
            logger.debug("Relay refused a forwarded connection over its limits", metadata: ["client": "\(client)"])
            return false
        }
        return true
    }

    /// Whether a device its space's log lists proved its key from `address` (a bucket) in the last
    /// `KnownAddresses.memory`: such an address may take the handshake places reserved for known ones.
    func isKnown(_ address: String) -> Bool { knownAddresses.contains(address) }

    /// Where a connection stands once its device proved its key: a device the space's log lists as a current
    /// member (with the keys it proved) may take the connection places reserved for listed devices, and its address
    /// is remembered as known; another one takes one of the others, or none is left (false: to be closed).
    func established(_ place: GatePlace, device: DevicePublicKeys, listed: Bool) -> Bool {
        // One device takes at most `DevicePlaces.limit` reserved places; more of its connections count as unlisted.
        let listed = listed && listedPlaces.take(device.nodeID)
        guard place.established(listed: listed) else {
            if listed { listedPlaces.give(device.nodeID) }
            metrics.connectionsRefusedOverLimit.increment()
            logger.debug("Relay refused a device its spaces' logs do not list: only reserved places are left")
            return false
        }
        if listed, let address = place.address { knownAddresses.remember(address, device: device.nodeID) }
        return true
    }

    /// A connection admitted as unlisted turned out to be of a device the log lists as a current member: it moves to
    /// the reserved places, and its address is remembered as known.
    func listed(_ place: GatePlace, device: DevicePublicKeys) {
        guard place.isUnlisted, listedPlaces.take(device.nodeID) else { return }
        place.listed()
        if let address = place.address { knownAddresses.remember(address, device: device.nodeID) }
    }

    /// A connection closed: its device's reserved place, if it held one, is given back.
    func released(_ place: GatePlace, device: DevicePublicKeys?) {
        guard let device, place.isListed else { return }
        listedPlaces.give(device.nodeID)
    }

    /// The client a trusted `proxy` forwards a request for: the last address of its `X-Forwarded-For` that is not
    /// itself a trusted proxy (the entries before it are the client's own word), counted by `SourceAddress.bucket`.
    /// Without the header, or when that entry is not an address, the proxy itself (so all such requests share the
    /// proxy's limits, as without `--trusted-proxy`).
    func forwardedClient(_ headers: HTTPHeaders, proxy: String) -> String {
        let hops = headers["X-Forwarded-For"].flatMap { $0.split(separator: ",") }
            .map { $0.trimmingCharacters(in: .whitespaces) }
        for hop in hops.reversed() {
            guard SourceAddress.bytes(hop) != nil else { break }
            if trustedProxies.contains(where: { $0.contains(hop) }) { continue }
            return SourceAddress.bucket(hop)
        }
        return SourceAddress.bucket(proxy)
    }
}

/// How many reserved places each listed device holds (`RelayServer.established`): at most `limit`, so one member
/// cannot take all of them.
final class DevicePlaces: Sendable {
    /// The most reserved places one device holds (one connection per space it is a member of).
    let limit: Int
    private let held = Mutex<[[UInt8]: Int]>([:])

    /// Counts for no device yet, each allowed `limit` places.
    init(limit: Int = 256) { self.limit = limit }

    /// Takes a place for `device`; false when it holds `limit` already.
    func take(_ device: [UInt8]) -> Bool {
        held.withLock { held in
            guard held[device, default: 0] < limit else { return false }
            held[device, default: 0] += 1
            return true
        }
    }

    /// Gives one of `device`'s places back.
    func give(_ device: [UInt8]) {
        held.withLock { held in
            let left = held[device, default: 1] - 1
            held[device] = left > 0 ? left : nil
        }
    }

    /// The places `device` holds.
    func count(_ device: [UInt8]) -> Int { held.withLock { $0[device] ?? 0 } }
}

/// The source addresses (buckets) listed devices proved their keys from recently: at most `capacity`, each for
/// `memory` after its last such proof, and at most `perDevice` per device (a device's newest ones), so one member
/// handshaking from many addresses cannot push every other device's out. When full, the address remembered
/// longest ago is forgotten first (in constant time: a queue in the order addresses were first remembered).
final class KnownAddresses: Sendable {
    /// How long an address stays known after a listed device's last handshake from it.
    static let memory: Duration = .seconds(7 * 86_400)
    /// The most addresses remembered.
    let capacity: Int
    /// The most addresses remembered for one device.
    let perDevice: Int

    private struct State {
        var seen: [String: ContinuousClock.Instant] = [:]
        /// Addresses in the order they were first remembered (some forgotten since: skipped when reached).
        var queue: [String] = []
        var head = 0
        /// Each device's addresses, oldest first.
        var byDevice: [[UInt8]: [String]] = [:]
    }
    private let state = Mutex(State())

    /// An empty set remembering at most `capacity` addresses, `perDevice` of one device.
    init(capacity: Int = 65_536, perDevice: Int = 8) {
        self.capacity = capacity
        self.perDevice = perDevice
    }

    /// Whether `address` is remembered, and not for longer than `memory`.
    func contains(_ address: String) -> Bool {
        state.withLock { $0.seen[address].map { ContinuousClock.now - $0 < Self.memory } ?? false }
    }

    /// Remembers `address` for `device` from now.
    func remember(_ address: String, device: [UInt8]) {
        state.withLock { s in
            var mine = s.byDevice[device, default: []]
            if let at = mine.firstIndex(of: address) { mine.remove(at: at) }
            mine.append(address)
            if mine.count > perDevice { s.seen[mine.removeFirst()] = nil }
            s.byDevice[device] = mine
            if s.seen[address] == nil {
                s.queue.append(address)
                // Forget the oldest still remembered until there is room.
                while s.seen.count >= capacity, s.head < s.queue.count {
                    let oldest = s.queue[s.head]
                    s.head += 1
                    if oldest != address { s.seen[oldest] = nil }
                }
                if s.head > 4_096, s.head * 2 > s.queue.count {
                    s.queue.removeFirst(s.head)
                    s.head = 0
                }
            }
            s.seen[address] = .now
        }
    }

    /// How many addresses are remembered.
    var count: Int { state.withLock { $0.seen.count } }
}
