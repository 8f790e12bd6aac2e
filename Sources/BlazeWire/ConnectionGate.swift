import BlazeSettings
import Synchronization

/// Limits on inbound sync connections (SYNC.md §8, "Listener limits"): they hold before a byte is parsed, so a
/// stranger with no key cannot use up the daemon's file descriptors or starve its local clients.
public struct SyncListenerLimits: Sendable, Equatable {
    /// Inbound connections that have not finished their handshake.
    public var maxHandshakes = BlazedSettings.syncMaxHandshakes.defaultValue
    /// Inbound connections in all (handshaking or established).
    public var maxConnections = BlazedSettings.syncMaxPeers.defaultValue
    /// Inbound connections from one source address.
    public var maxConnectionsPerAddress = BlazedSettings.syncMaxPeersPerAddress.defaultValue
    /// Milliseconds an inbound or outbound handshake may take, much shorter than the silence limit.
    public var handshakeTimeoutMs = BlazedSettings.syncHandshakeTimeout.defaultValue
    /// Of `maxHandshakes`, places only connections from a known address may take (one a listed device proved its
    /// key from, `ConnectionGate.admit(address:known:)`): strangers filling the others leave those devices a way in.
    public var reservedHandshakes = 0
    /// Of `maxConnections`, places only devices a space's log lists may take once their handshake is done
    /// (`GatePlace.established(listed:)`): capability holders with fresh keys cannot take them all.
    public var reservedConnections = 0

    /// A daemon's default limits (`BlazedSettings`; a relay's are `RelayServer.defaultLimits`).
    public init() {}
}

/// One admitted connection's place in a `ConnectionGate`: it counts as handshaking until `established()`, and is
/// given back once by `release()`, however the connection ends (whichever of its handlers sees the end first).
/// Event-loop bound, like the handlers holding it.
public final class GatePlace {
    let gate: ConnectionGate
    /// The source address the gate counts the connection for; nil while it is counted for none (a trusted proxy's
    /// connection, until the request it forwards says for whom: `rebind`).
    public private(set) var address: String?
    private var handshaking = true
    /// Whether the connection counts among the established ones of devices no log lists.
    private var unlisted = false
    private var released = false
    /// When the gate admitted the connection: its handshake deadline runs from here, whatever comes before the
    /// handshake itself (TLS, a WebSocket upgrade).
    public let admitted = ContinuousClock.now

    /// The place `gate` gave a connection from `address` (`admit` returned true).
    public init(gate: ConnectionGate, address: String?) {
        self.gate = gate
        self.address = address
    }

    /// Whether the connection counts among the established ones of devices no log lists.
    public var isUnlisted: Bool { unlisted && !released }
    /// Whether the connection is established as one of a listed device (and not released).
    public var isListed: Bool { !handshaking && !unlisted && !released }

    /// What is left of `timeout` since the connection was admitted (zero once it passed).
    public func remaining(of timeout: Duration) -> Duration {
        max(.zero, timeout - (ContinuousClock.now - admitted))
    }

    /// Counts the connection for `client` from now on (the address a trusted proxy forwards it for); false, and
    /// counted, when `client` is at its limit already, or is not `known` and only reserved handshake places are
    /// left (the connection is then to be closed).
    public func rebind(to client: String, known: Bool = true) -> Bool {
        guard !released, client != address else { return true }
        guard gate.rebind(from: address, to: client, known: known) else { return false }
        address = client
        return true
    }

    /// The connection finished its handshake: it stops counting as handshaking. A device no log lists (`listed`
    /// false) takes one of the places not reserved for listed ones; false, and counted, when none is left (the
    /// connection is then to be closed).
    @discardableResult
    public func established(listed: Bool = true) -> Bool {
        guard handshaking, !released else { return true }
        guard gate.established(listed: listed) else { return false }
        handshaking = false
        unlisted = !listed
        return true
    }

    /// The connection, established as one of a device no log lists, turned out to be of a listed one: it moves to
    /// the reserved places (once; nothing if it was counted as listed already).
    public func listed() {
        guard unlisted, !released else { return }
        unlisted = false
        gate.listed()
    }

    /// Gives the place back (once).
    public func release() {
        guard !released else { return }
        released = true
        gate.release(address: address, handshaking: handshaking, unlisted: unlisted)
    }
}

/// Counts inbound sync connections and admits a new one only while every limit of `SyncListenerLimits` holds.
public final class ConnectionGate: Sendable {
    private struct Counts {
        var total = 0
        var handshaking = 0
        /// Established connections of devices no log lists.
        var unlisted = 0
        var byAddress: [String: Int] = [:]
    }

    /// The limits it holds.
    public let limits: SyncListenerLimits
    private let counts = Mutex(Counts())
    /// Connections closed at once because a limit was reached.
    public let refused = Atomic<Int>(0)

    /// A gate holding `limits`, with no connection yet.
    public init(limits: SyncListenerLimits) { self.limits = limits }

    /// Takes a place for a new connection from `address` (handshaking); false, and counted, when a limit is reached.
    /// Only a `known` address may take the last `reservedHandshakes` places. A nil address is counted in the totals
    /// only (a trusted proxy's connection, until `rebind` checks the client it forwards for).
    public func admit(address: String?, known: Bool = true) -> Bool {
        let handshakes = known ? limits.maxHandshakes : limits.maxHandshakes - limits.reservedHandshakes
        let ok = counts.withLock { c -> Bool in
            guard c.total < limits.maxConnections, c.handshaking < handshakes,
                address.map({ c.byAddress[$0, default: 0] < limits.maxConnectionsPerAddress }) ?? true
            else { return false }
            c.total += 1
            c.handshaking += 1
            if let address { c.byAddress[address, default: 0] += 1 }
            return true
        }
        if !ok { refused.add(1, ordering: .relaxed) }
        return ok
    }

    /// Moves a handshaking connection's count from `old` (nil: none) to `new`; false, and counted, when `new` is at
    /// its limit, or is not `known` and the handshakes (this one among them) reach into the reserved places.
    func rebind(from old: String?, to new: String, known: Bool) -> Bool {
        let handshakes = known ? limits.maxHandshakes : limits.maxHandshakes - limits.reservedHandshakes
        let ok = counts.withLock { c -> Bool in
            guard c.byAddress[new, default: 0] < limits.maxConnectionsPerAddress, c.handshaking <= handshakes
            else { return false }
            c.byAddress[new, default: 0] += 1
            if let old { Self.uncount(old, in: &c) }
            return true
        }
        if !ok { refused.add(1, ordering: .relaxed) }
        return ok
    }

    private static func uncount(_ address: String, in c: inout Counts) {
        let left = c.byAddress[address, default: 1] - 1
        c.byAddress[address] = left > 0 ? left : nil
    }

    /// A connection finished its handshake: it no longer counts as handshaking. One of a device no log lists takes
    /// a place outside the `reservedConnections`; false, and counted, when none is left.
    func established(listed: Bool) -> Bool {
        let ok = counts.withLock { c -> Bool in
            if !listed {
                guard c.unlisted < limits.maxConnections - limits.reservedConnections else { return false }
                c.unlisted += 1
            }
            c.handshaking -= 1
            return true
        }
        if !ok { refused.add(1, ordering: .relaxed) }
        return ok
    }

    /// An established connection counted among the unlisted ones turned out to be of a listed device.
    func listed() {
        counts.withLock { $0.unlisted -= 1 }
    }

    /// Whether a place not reserved for listed devices is free now (for a device whose listing is not known yet).
    public var hasUnreservedPlace: Bool {
        counts.withLock { $0.unlisted < limits.maxConnections - limits.reservedConnections }
    }

    /// The connection from `address` (nil: counted for none) closed; `handshaking` tells whether it had not finished
    /// its handshake, `unlisted` whether it counted among the established ones of devices no log lists.
    public func release(address: String?, handshaking: Bool, unlisted: Bool = false) {
        counts.withLock { c in
            c.total -= 1
            if handshaking { c.handshaking -= 1 }
            if unlisted { c.unlisted -= 1 }
            if let address { Self.uncount(address, in: &c) }
        }
    }

    /// Current counts: all inbound connections, those still handshaking, and the established ones of devices no log
    /// lists.
    public var current: (total: Int, handshaking: Int, unlisted: Int) {
        counts.withLock { ($0.total, $0.handshaking, $0.unlisted) }
    }
}
