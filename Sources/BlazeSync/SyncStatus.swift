import BlazeCrypto
import Foundation
import Synchronization

/// Who opened a sync connection.
public enum PeerDirection: String, Sendable {
    /// This daemon connected to a peer it was told about (`peer.add`).
    case outbound
    /// A peer connected to this daemon's listener.
    case inbound
}

/// What `sync.status` reports for one peer of one database.
public struct PeerStatus: Sendable, Equatable {
    /// `host:port` for peers this daemon connects to; `inbound` for everything peers connected here for.
    public var peer: String
    /// Who opened the connections.
    public var direction: PeerDirection
    /// Connections currently established (inbound peers may hold several).
    public var connections = 0
    /// Established connections per remote device (node id hex), as each proved in its handshake.
    var connectionsByDevice: [String: Int] = [:]
    /// The remote device of the latest established connection (node id hex), nil before the first.
    public var lastDevice: String?
    /// Unix milliseconds of the last entries or state exchanged, nil before the first.
    public var lastSyncMs: Int64?
    /// Entries sent and stored, since the daemon started.
    public var sentEntries = 0
    /// Entries received and stored here (duplicates not counted), since the daemon started.
    public var receivedEntries = 0
    /// Bytes sent on the wire after the handshake (framing and every message included), since the daemon started.
    public var sentBytes = 0
    /// Bytes received on the wire after the handshake, since the daemon started.
    public var receivedBytes = 0
    /// Entries this side holds that the peer lacked when last compared.
    public var peerBehind = 0
    /// Entries the peer holds that this side lacked when last compared.
    public var selfBehind = 0
    /// Connection attempts and sessions that failed.
    public var errors = 0
    /// The latest failure, for humans.
    public var lastError: String?
    /// Refused entries, heads and frames, by reason (`SyncRejection` raw values).
    public var rejected: [String: Int] = [:]

    /// True while at least one connection is established.
    public var connected: Bool { connections > 0 }

    /// The remote devices (node ids, hex) of the established connections, sorted.
    public var devices: [String] { connectionsByDevice.keys.sorted() }

    /// Counts a connection established with `device`.
    mutating func connect(device: String) {
        connections += 1
        connectionsByDevice[device, default: 0] += 1
        lastDevice = device
    }

    /// Counts the end of a connection with `device`.
    mutating func disconnect(device: String) {
        connections = max(0, connections - 1)
        if let n = connectionsByDevice[device] { connectionsByDevice[device] = n > 1 ? n - 1 : nil }
    }
}

/// The sync counters of every database and peer, shared by sessions and read by `sync.status`.
final class StatusBook: Sendable {
    private let book = Mutex<[String: [String: PeerStatus]]>([:])

    func update(db: String, peer: String, direction: PeerDirection, _ edit: (inout PeerStatus) -> Void) {
        book.withLock { b in
            var s = b[db]?[peer] ?? PeerStatus(peer: peer, direction: direction)
            edit(&s)
            b[db, default: [:]][peer] = s
        }
    }

    func reject(db: String, peer: String, direction: PeerDirection, _ reason: SyncRejection) {
        update(db: db, peer: peer, direction: direction) {
            $0.rejected[reason.rawValue, default: 0] += 1
            $0.lastError = "rejected: \(reason.rawValue)"
        }
    }

    func peers(db: String) -> [PeerStatus] {
        book.withLock { ($0[db] ?? [:]).values.sorted { $0.peer < $1.peer } }
    }

    func forget(db: String, peer: String? = nil) {
        book.withLock { b in
            if let peer { b[db]?[peer] = nil } else { b[db] = nil }
        }
    }
}

/// Unix milliseconds now.
func nowMs() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }
