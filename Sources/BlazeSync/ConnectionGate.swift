import Synchronization

/// Limits on inbound sync connections (SYNC.md §8, "Listener limits"): they hold before a byte is parsed, so a
/// stranger with no key cannot use up the daemon's file descriptors or starve its local clients.
public struct SyncListenerLimits: Sendable, Equatable {
    /// Inbound connections that have not finished their handshake.
    public var maxHandshakes = 64
    /// Inbound connections in all (handshaking or established).
    public var maxConnections = 256
    /// Inbound connections from one source address.
    public var maxConnectionsPerAddress = 16
    /// Milliseconds an inbound or outbound handshake may take, much shorter than the silence limit.
    public var handshakeTimeoutMs = 5_000

    /// Default limits.
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
    private var released = false

    /// The place `gate` gave a connection from `address` (`admit` returned true).
    public init(gate: ConnectionGate, address: String?) {
        self.gate = gate
        self.address = address
    }

    /// Counts the connection for `client` from now on (the address a trusted proxy forwards it for); false, and
    /// counted, when `client` is at its limit already (the connection is then to be closed).
    public func rebind(to client: String) -> Bool {
        guard !released, client != address else { return true }
        guard gate.rebind(from: address, to: client) else { return false }
        address = client
        return true
    }

    /// The connection finished its handshake: it stops counting as handshaking.
    public func established() {
        guard handshaking, !released else { return }
        handshaking = false
        gate.established()
    }

    /// Gives the place back (once).
    public func release() {
        guard !released else { return }
        released = true
        gate.release(address: address, handshaking: handshaking)
    }
}

/// Counts inbound sync connections and admits a new one only while every limit of `SyncListenerLimits` holds.
public final class ConnectionGate: Sendable {
    private struct Counts {
        var total = 0
        var handshaking = 0
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
    /// A nil address is counted in the totals only (a trusted proxy's connection, until `rebind`).
    public func admit(address: String?) -> Bool {
        let ok = counts.withLock { c -> Bool in
            guard c.total < limits.maxConnections, c.handshaking < limits.maxHandshakes,
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

    /// Moves a connection's count from `old` (nil: none) to `new`; false, and counted, when `new` is at its limit.
    func rebind(from old: String?, to new: String) -> Bool {
        let ok = counts.withLock { c -> Bool in
            guard c.byAddress[new, default: 0] < limits.maxConnectionsPerAddress else { return false }
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

    /// The connection from `address` finished its handshake: it no longer counts as handshaking.
    public func established() {
        counts.withLock { $0.handshaking -= 1 }
    }

    /// The connection from `address` (nil: counted for none) closed; `handshaking` tells whether it had not finished
    /// its handshake.
    public func release(address: String?, handshaking: Bool) {
        counts.withLock { c in
            c.total -= 1
            if handshaking { c.handshaking -= 1 }
            if let address { Self.uncount(address, in: &c) }
        }
    }

    /// Current counts: all inbound connections and those still handshaking.
    public var current: (total: Int, handshaking: Int) {
        counts.withLock { ($0.total, $0.handshaking) }
    }
}
