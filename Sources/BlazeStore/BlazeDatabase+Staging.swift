import Foundation

/// Staging files beside a database: what a sync session writes there while a snapshot comes (SYNC.md §11).
extension BlazeDatabase {
    /// What follows the database's path in the name of a snapshot staging file.
    public static let snapshotStagingPrefix = ".snapshot-staging-"

    /// Deletes the snapshot staging files beside `path` that a session ended by a crash left: none is in use when
    /// the database opens.
    static func removeLeftoverStaging(path: String) {
        let url = URL(fileURLWithPath: path)
        let prefix = url.lastPathComponent + snapshotStagingPrefix
        let dir = url.deletingLastPathComponent().path
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: dir) else { return }
        // Exactly a staging file's name (the prefix, then a UUID): never another database whose name starts so.
        for name in names where name.hasPrefix(prefix) && UUID(uuidString: String(name.dropFirst(prefix.count))) != nil {
            try? FileManager.default.removeItem(atPath: (dir as NSString).appendingPathComponent(name))
        }
    }
}
