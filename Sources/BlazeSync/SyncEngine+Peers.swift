import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import Foundation
import Logging
import NIOCore
import NIOPosix
import Synchronization

/// The peers a database syncs with: the configured addresses and the outbound links that reach them.
extension SyncEngine {
    /// Adds `address` as a peer of `db` (which must be shared) and connects to it.
    public func addPeer(db: BlazeDatabase, address: PeerAddress) throws -> Bool {
        guard try space(db: db) != nil else {
            throw StoreError(
                .syncFailure, kind: "not_shared", "database \(db.name) is not shared; run db.share or db.join first")
        }
        let added = try db.addPeer(address.description)
        // A relay not heard from yet may be of an earlier build: until it answers, this device states that it can be
        // sent entry format 2 only (SYNC.md §6, "Entry formats").
        if added, let space = try space(db: db), try issueFormatStatement(db: db, space: space) { membershipChanged(db: db.name) }
        refreshLinks(db: db.name)
        return added
    }

    /// Removes a peer of `db` and closes its link.
    public func removePeer(db: BlazeDatabase, address: PeerAddress) throws -> Bool {
        let removed = try db.removePeer(address.description)
        let link = links.withLock { $0.removeValue(forKey: LinkKey(db: db.name, address: address.description)) }
        link?.stop()
        status.forget(db: db.name, peer: address.description)
        if removed, let space = try space(db: db), try issueFormatStatement(db: db, space: space) { membershipChanged(db: db.name) }
        return removed
    }

    /// Makes the running links of `db` match its configured peers (none while paused).
    func refreshLinks(db name: String) {
        refreshFolders(db: name)
        guard let db = try? store.database(name), let space = try? space(db: db), let peers = try? db.peers() else { return }
        let isPaused = paused.withLock { $0.contains(name) }
        var toStart: [OutboundLink] = []
        var toStop: [OutboundLink] = []
        links.withLock { l in
            let wanted = isPaused ? Set<String>() : Set(peers)
            for (k, link) in l where k.db == name && !wanted.contains(k.address) {
                toStop.append(link)
                l[k] = nil
            }
            for address in wanted where l[LinkKey(db: name, address: address)] == nil {
                guard let parsed = PeerAddress(address) else { continue }
                let link = OutboundLink(engine: self, space: space, address: parsed)
                l[LinkKey(db: name, address: address)] = link
                toStart.append(link)
                status.update(db: name, peer: address, direction: .outbound) { _ in }
            }
        }
        for link in toStop { link.stop() }
        for link in toStart { link.connect() }
    }

    func stopLinks(db name: String) {
        let stopped = links.withLock { l in
            let mine = l.filter { $0.key.db == name }
            for k in mine.keys { l[k] = nil }
            return Array(mine.values)
        }
        for link in stopped { link.stop() }
    }
}
