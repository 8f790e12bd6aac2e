import BlazeCRDT
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The set of databases under one data directory, each in `<dir>/databases/<name>.db`.
public final class Store: Sendable {
    /// The data directory.
    public let directory: String
    /// Limits handed to every database.
    public let limits: StoreLimits
    /// The node id every local change is authored by.
    public let node: NodeID
    /// Where every database reports its commits (nil: nowhere).
    public let metrics: StoreMetrics?
    /// The open databases by name; held by every change to them (which also updates `shards`).
    private let open = Mutex<[String: BlazeDatabase]>([:])
    /// Copies of `open`, each thread reading its own: the lookup every request makes takes no lock another event loop
    /// takes too (with one lock, the loops of an 8-loop daemon queued on it: 12% of their time).
    private let shards = Sharded<[String: BlazeDatabase]>([:])
    /// Names being restored: taken, though no file exists yet.
    private let reserved = Mutex<Set<String>>([])
    /// The last listing of the databases directory and when it was read (nil once this store created or removed one).
    private let listing = Mutex<(names: [String], at: ContinuousClock.Instant)?>(nil)

    /// File suffix of database files.
    public static let fileSuffix = ".db"

    /// Opens (creating, mode 0700) the data directory; local changes are authored by `node`, and every database
    /// reports its commits to `metrics`.
    public init(directory: String, limits: StoreLimits = StoreLimits(), node: NodeID, metrics: StoreMetrics? = nil) throws {
        self.directory = directory
        self.limits = limits
        self.node = node
        self.metrics = metrics
        SQLiteProcess.configure()
        try Self.prepareDirectory(directory)
        try Self.prepareDirectory(directory + "/databases")
    }

    /// Creates a private (0700) directory if it does not exist.
    public static func prepareDirectory(_ path: String) throws {
        if !FileManager.default.fileExists(atPath: path) {
            try FileManager.default.createDirectory(
                atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        }
    }

    /// The file of database `name`.
    public func path(_ name: String) -> String { directory + "/databases/" + name + Self.fileSuffix }

    /// Bytes of database `name`'s file and its write-ahead log, as the file system reports them (0 for what is
    /// missing); reads no page.
    public func fileBytes(of name: String) -> Int {
        // stat(2) itself: FileManager's attributes also look up the owner's and group's names (NSS, maybe a network
        // directory), and db.list calls this on an event loop.
        [path(name), path(name) + "-wal"].reduce(0) { sum, p in
            var st = stat()
            return sum + (stat(p, &st) == 0 ? Int(st.st_size) : 0)
        }
    }

    /// The names of the databases open now, sorted.
    public var openNames: [String] { open.withLock { $0.keys.sorted() } }

    /// Creates a new database; fails if it exists.
    public func create(_ name: String) throws -> BlazeDatabase {
        try Names.validateDatabase(name)
        return try open.withLock { open in
            let path = self.path(name)
            if open[name] != nil || FileManager.default.fileExists(atPath: path) || reserved.withLock({ $0.contains(name) }) {
                throw StoreError(.alreadyExists, kind: "database_exists", "database \(Names.quoted(name)) already exists")
            }
            let db = try BlazeDatabase(name: name, path: path, limits: limits, node: node, metrics: metrics)
            open[name] = db
            mirror(name, db)
            listing.withLock { $0 = nil }
            return db
        }
    }

    /// Takes `name` for a database about to be written in place (a restore); fails if it exists or is taken.
    func reserve(_ name: String) throws {
        try open.withLock { open in
            let taken = open[name] != nil || FileManager.default.fileExists(atPath: path(name))
            guard !taken, reserved.withLock({ $0.insert(name).inserted }) else {
                throw StoreError(.alreadyExists, kind: "database_exists", "database \(Names.quoted(name)) already exists")
            }
        }
    }

    /// Gives back a name taken by `reserve`.
    func release(_ name: String) {
        _ = reserved.withLock { $0.remove(name) }
        listing.withLock { $0 = nil }
    }

    /// True while `db` is the open database of its name (not dropped, not replaced by a database made anew).
    public func isCurrent(_ db: BlazeDatabase) -> Bool {
        open.withLock { $0[db.name] === db }
    }

    /// Returns an existing database, opening it on first use; throws not-found if it does not exist.
    public func database(_ name: String) throws -> BlazeDatabase {
        // An open database's name was valid when it opened.
        if let db = shards.withLocal({ $0[name] }) { return db }
        try Names.validateDatabase(name)
        return try open.withLock { open in
            if let db = open[name] { return db }
            let path = self.path(name)
            guard FileManager.default.fileExists(atPath: path) else {
                throw StoreError(.notFound, kind: "database_not_found", "database \(Names.quoted(name)) does not exist")
            }
            let db = try BlazeDatabase(name: name, path: path, limits: limits, node: node, metrics: metrics)
            open[name] = db
            mirror(name, db)
            return db
        }
    }

    /// Sets (or with nil removes) `name` in every shard; call holding `open`, so shards change in its order.
    private func mirror(_ name: String, _ db: BlazeDatabase?) {
        shards.withEach { $0[name] = db }
    }

    /// Names of all databases, sorted.
    public func list() throws -> [String] {
        let files = try FileManager.default.contentsOfDirectory(atPath: directory + "/databases")
        let names = files.filter { $0.hasSuffix(Self.fileSuffix) }.map { String($0.dropLast(Self.fileSuffix.count)) }
            .filter { (try? Names.validateDatabase($0)) != nil }.sorted()
        listing.withLock { $0 = (names, .now) }
        return names
    }

    /// How many databases there are, from a listing at most `maxAge` old: exact after this store's own creations and
    /// removals, within `maxAge` of a file added or removed by hand (`daemon.info` asks on every call).
    public func count(maxAge: Duration = .seconds(1)) throws -> Int {
        if let cached = listing.withLock({ $0 }), ContinuousClock.now - cached.at < maxAge { return cached.names.count }
        return try list().count
    }

    /// Deletes a database and its files. Requests already running against it finish on the unlinked file.
    public func drop(_ name: String) throws {
        try Names.validateDatabase(name)
        try open.withLock { open in
            let path = self.path(name)
            guard open[name] != nil || FileManager.default.fileExists(atPath: path) else {
                throw StoreError(.notFound, kind: "database_not_found", "database \(Names.quoted(name)) does not exist")
            }
            if let dropped = open.removeValue(forKey: name) {
                mirror(name, nil)
                dropped.feed.end(
                    StoreError(.notFound, kind: "database_dropped", "database \(Names.quoted(name)) was dropped"))
                // No checkpoint may write into the files once they are gone.
                try? dropped.connections.checkpointer.close()
            }
            defer { listing.withLock { $0 = nil } }
            for suffix in ["", "-wal", "-shm"] where FileManager.default.fileExists(atPath: path + suffix) {
                try FileManager.default.removeItem(atPath: path + suffix)
            }
            // Its copies kept before format upgrades hold its documents too (`DatabaseFormat`), and its vector index
            // files copies of its vectors (`VectorIndexFile`).
            let file = (path as NSString).lastPathComponent
            let directory = (path as NSString).deletingLastPathComponent
            for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
            where Self.isFormatCopy(name, of: file) || VectorIndexFile.belongs(name, to: file) {
                try? FileManager.default.removeItem(atPath: directory + "/" + name)
            }
        }
    }

    /// Whether `name` is a copy of database file `file` kept before a format upgrade: `FILE.format-N.bak` or
    /// `FILE.format-N-TIME.bak`, digits only between, so another database's copies (`a.db.format-1.db.format-2.bak`
    /// for database `a.db.format-1`) never match `a.db`'s.
    static func isFormatCopy(_ name: String, of file: String) -> Bool {
        guard name.hasPrefix(file + ".format-"), name.hasSuffix(".bak") else { return false }
        let middle = name.utf8.dropFirst(file.utf8.count + 8).dropLast(4)
        return !middle.isEmpty && middle.allSatisfy { (0x30...0x39).contains($0) || $0 == UInt8(ascii: "-") }
    }

    /// Closes every open database (used at shutdown).
    public func closeAll() {
        let dbs = open.withLock { open in
            defer {
                open.removeAll()
                shards.withEach { $0.removeAll() }
            }
            return Array(open.values)
        }
        for db in dbs { try? db.close() }
    }
}
