import BlazeCRDT
import BlazeCrypto
import Foundation
import Synchronization

/// Who opened a sync connection.
public enum PeerDirection: String, Sendable {
    /// This daemon connected to a peer it was told about (`peer.add`).
    case outbound
    /// A peer connected to this daemon's listener.
    case inbound
    /// A shared folder (`folder.add`); its "connections" are the other devices writing into it.
    case folder
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
    /// Snapshots sent to a peer that needed entries compacted away here (SYNC.md §11), since the daemon started.
    public var snapshotsSent = 0
    /// Snapshots received and installed, since the daemon started.
    public var snapshotsInstalled = 0
    /// Blob chunks sent because the peer asked for them, since the daemon started.
    public var chunksSent = 0
    /// Blob chunks received, checked and stored, since the daemon started.
    public var chunksReceived = 0
    /// Bytes of blob content those chunks held.
    public var chunkBytesReceived = 0
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
    /// The sync protocol version of the latest established connection (SYNC.md §8, "Versions"); nil before the first.
    public var protocolVersion: Int?
    /// How far the peer's clock is ahead of this device's, in ms, as its `CLOCK` said (protocol 5 and later); nil
    /// before one came.
    public var clockSkewMs: Int?
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

/// Entries of one origin that changes this device received depend on, and that no peer has delivered (`sync.status`
/// `waiting`): a peer or relay that forwards later changes while keeping back what they depend on shows up here.
public struct MissingEntries: Sendable, Equatable {
    /// The origin (node id hex).
    public var origin: String
    /// The highest seq of it that received changes depend on.
    public var upTo: UInt64
    /// The highest seq of it held here.
    public var held: UInt64
    /// Unix milliseconds since when entries of it have been missing.
    public var sinceMs: Int64
    /// The peers whose batches brought the changes that wait (`host:port`, a relay URL, or `inbound`), sorted.
    public var via: [String]
}

/// The sync counters of every database and peer, shared by sessions and read by `sync.status`.
final class StatusBook: Sendable {
    private let book = Mutex<[String: [String: PeerStatus]]>([:])
    /// Per database, per origin (hex): entries received changes depend on and that have not arrived.
    private let missing = Mutex<[String: [String: MissingEntries]]>([:])

    /// Records what `db` now lacks (`needed`: per origin, the highest seq depended on; `held`: its version vector),
    /// noting `peer` as having brought changes that wait when `parkedBy` is set. An origin keeps its first
    /// `sinceMs` while it stays missing; one no longer missing is dropped.
    func setMissing(db: String, needed: [NodeID: UInt64], held: VersionVector, parkedBy peer: String?) {
        missing.withLock { m in
            var now: [String: MissingEntries] = [:]
            for (origin, upTo) in needed {
                var entry = m[db]?[origin.hex] ?? MissingEntries(origin: origin.hex, upTo: upTo, held: 0, sinceMs: nowMs(), via: [])
                entry.upTo = upTo
                entry.held = held[origin]
                if let peer, !entry.via.contains(peer) { entry.via = (entry.via + [peer]).sorted() }
                now[origin.hex] = entry
            }
            m[db] = now.isEmpty ? nil : now
        }
    }

    /// Whether anything is missing for `db`.
    func hasMissing(db: String) -> Bool { missing.withLock { $0[db] != nil } }

    /// What `db` lacks, by origin.
    func missing(db: String) -> [MissingEntries] {
        missing.withLock { ($0[db] ?? [:]).values.sorted { $0.origin < $1.origin } }
    }

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
        if peer == nil { missing.withLock { $0[db] = nil } }
    }
}

/// Unix milliseconds now.
func nowMs() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }
