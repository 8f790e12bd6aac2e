import BlazeStore
import Foundation
import Synchronization

/// What `folder.list` reports for one folder.
public struct FolderInfo: Sendable, Equatable {
    /// The folder's path.
    public var path: String
    /// The other devices writing into it (node ids, hex), as their directories show.
    public var devices: [String]
    /// Unix milliseconds of the last entries written or read, nil before the first.
    public var lastSyncMs: Int64?
    /// The latest problem, for humans; nil when the last round went well.
    public var lastError: String?
}

/// Folder containers (SYNC.md §10): a database syncs through each folder it was given with `folder.add`, one
/// `FolderLink` thread per folder, stopped while sync is paused.
extension SyncEngine {
    /// Makes `path` (an existing directory, absolute) a folder `db` syncs through; returns false when it was already.
    public func addFolder(db: BlazeDatabase, path: String) throws -> Bool {
        guard try space(db: db) != nil else {
            throw StoreError(
                .syncFailure, kind: "not_shared", "database \(db.name) is not shared; run db.share or db.join first")
        }
        let added = try db.addFolder(path)
        refreshFolders(db: db.name)
        return added
    }

    /// Stops syncing `db` through `path`; what this device wrote there stays (other devices may still read it).
    public func removeFolder(db: BlazeDatabase, path: String) throws -> Bool {
        let removed = try db.removeFolder(path)
        let link = folderLinks.withLock { $0.removeValue(forKey: LinkKey(db: db.name, address: path)) }
        link?.stop()
        status.forget(db: db.name, peer: "folder:" + path)
        return removed
    }

    /// The folders `db` syncs through, with what their links last saw.
    public func folders(db: BlazeDatabase) throws -> [FolderInfo] {
        let live = Dictionary(status.peers(db: db.name).map { ($0.peer, $0) }, uniquingKeysWith: { a, _ in a })
        return try db.folders().map { path in
            let s = live["folder:" + path]
            return FolderInfo(path: path, devices: s?.devices ?? [], lastSyncMs: s?.lastSyncMs, lastError: s?.lastError)
        }
    }

    /// Makes the running folder links of `db` match its configured folders (none while paused).
    func refreshFolders(db name: String) {
        guard let db = try? store.database(name), let space = try? space(db: db), let paths = try? db.folders() else {
            return
        }
        let wanted = isPaused(db: name) ? Set<String>() : Set(paths)
        let options = folderOptions
        var toStop: [FolderLink] = []
        folderLinks.withLock { l in
            for (k, link) in l where k.db == name && !wanted.contains(k.address) {
                toStop.append(link)
                l[k] = nil
            }
            for path in wanted where l[LinkKey(db: name, address: path)] == nil {
                guard let link = FolderLink(engine: self, space: space, path: path, options: options) else { continue }
                l[LinkKey(db: name, address: path)] = link
            }
        }
        for link in toStop { link.stop() }
    }

    /// Stops the folder links of `db` (of every database when nil).
    func stopFolders(db name: String?) {
        let stopped = folderLinks.withLock { l in
            let mine = l.filter { name == nil || $0.key.db == name }
            for k in mine.keys { l[k] = nil }
            return Array(mine.values)
        }
        for link in stopped { link.stop() }
    }
}
