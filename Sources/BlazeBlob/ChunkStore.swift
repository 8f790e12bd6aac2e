import BlazeProtocol
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// A database's chunks on disk, one file per chunk, beside the database file and outside its pages.
///
/// Layout: `<directory>/<first two hex digits of the id>/<the id in hex>`, holding the chunk's content as it is on
/// this device (the database file itself is not encrypted at rest; chunks are sealed when they leave, by
/// `SealedChunk`). A chunk is written to a temporary file in its directory, synced, renamed into place and the
/// directory synced, so it is durable before `put` returns: a document that references it commits after. A file
/// present under a chunk's name is always the whole chunk. Files only this process writes are trusted on read; what
/// comes from elsewhere is checked against its id before `put`.
public final class ChunkStore: Sendable {
    /// The store's directory.
    public let directory: String
    /// Counts chunks added and removed through this store: a reader that lists the store can tell whether it changed.
    private let changes = Atomic<Int>(0)

    /// Serializes a sweep's look at a chunk and its removal with a put that finds the chunk held and renews it, and
    /// holds the chunks pinned by puts under way (how many pins each): a sweep leaves those.
    private let sweepLock = Mutex<[ChunkID: Int]>([:])
    /// The chunks sweeps removed, in order (`swept(after:)`), and how many went before the first one kept.
    private let sweptLog = Mutex<(base: Int, ids: [ChunkID])>((0, []))
    /// Chunks renamed into place whose directory is not synced yet: a put that finds one held syncs the directory
    /// itself before it counts the chunk as stored.
    private let unsynced = Mutex<Set<ChunkID>>([])
    /// The most swept ids remembered (the oldest half goes past it).
    static let sweptLogLimit = 100_000

    /// Changes so far (chunks added or removed since this store was opened).
    public var generation: Int { changes.load(ordering: .acquiring) }

    /// The chunk store in `directory`, created if missing (with its parents, mode 0700).
    public init(directory: String) throws(ChunkStoreError) {
        self.directory = directory
        do {
            try FileManager.default.createDirectory(
                atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        } catch {
            throw ChunkStoreError("cannot create the chunk directory \(directory): \(error.localizedDescription)", reason: .invalid)
        }
        Self.removeLeftovers(in: directory)
    }

    /// The path of chunk `id`'s file.
    public func path(of id: ChunkID) -> String {
        let hex = id.hex
        return "\(directory)/\(hex.prefix(2))/\(hex)"
    }

    /// Whether chunk `id` is held here.
    public func contains(_ id: ChunkID) -> Bool {
        var info = stat()
        return lstat(path(of: id), &info) == 0 && (info.st_mode & S_IFMT) == S_IFREG
    }

    /// The size in bytes of chunk `id`, nil when it is not held.
    public func size(of id: ChunkID) -> Int? {
        var info = stat()
        guard lstat(path(of: id), &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else { return nil }
        return Int(info.st_size)
    }

    /// Stores `content` as chunk `id` durably; returns false (and writes nothing) when it is held already. The caller
    /// has checked that `id` is the content's id.
    @discardableResult
    public func put(_ id: ChunkID, _ content: UnsafeRawBufferPointer, pinning pins: ChunkPins? = nil) throws(ChunkStoreError) -> Bool {
        // Pinned first (a sweep leaves it from now until the pins go), then, when held already, its file renewed (its
        // time set to now), so a sweep counts it as just written: a blob put again is never swept before the
        // document that refers to it commits.
        let held = path(of: id)
        let renewed = sweepLock.withLock { pinned in
            if let pins, pins.add(id) { pinned[id, default: 0] += 1 }
            return contains(id) && utimensat(AT_FDCWD, held, nil, AT_SYMLINK_NOFOLLOW) == 0
        }
        let final = path(of: id)
        let parent = String(final[..<final.lastIndex(of: "/")!])
        if renewed {
            // Another put's file, renamed and perhaps not yet durable: this put's caller may commit right after.
            if unsynced.withLock({ $0.contains(id) }) { try Self.syncDirectory(parent) }
            return false
        }
        if mkdir(parent, 0o700) != 0 && errno != EEXIST { throw .system("create \(parent)", errno) }
        let temporary = "\(parent)/.tmp-\(id.hex)-\(UInt64.random(in: 0...UInt64.max))"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw .system("create \(temporary)", errno) }
        var written = 0
        while written < content.count {
            let n = write(fd, content.baseAddress!.advanced(by: written), content.count - written)
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else {
                let code = errno
                close(fd)
                unlink(temporary)
                throw .system("write \(temporary)", code)
            }
            written += n
        }
        guard fsync(fd) == 0 else {
            let code = errno
            close(fd)
            unlink(temporary)
            throw .system("sync \(temporary)", code)
        }
        close(fd)
        defer { changes.add(1, ordering: .releasing) }
        unsynced.withLock { _ = $0.insert(id) }
        defer { unsynced.withLock { _ = $0.remove(id) } }
        guard rename(temporary, final) == 0 else {
            let code = errno
            unlink(temporary)
            throw .system("rename \(temporary)", code)
        }
        try Self.syncDirectory(parent)
        return true
    }

    /// Stores `content` as chunk `id` durably (see `put(_:_:)`).
    @discardableResult
    public func put(_ id: ChunkID, _ content: [UInt8], pinning pins: ChunkPins? = nil) throws(ChunkStoreError) -> Bool {
        let result = content.withUnsafeBytes { raw in Result { () throws(ChunkStoreError) -> Bool in try put(id, raw, pinning: pins) } }
        return try result.get()
    }

    /// Tells the kernel the cached pages of chunks `ids` will not be read again soon: clean ones are dropped (every
    /// chunk is durable once `put` returns), so reading a large blob through does not fill memory with its pages.
    public func dropCached(_ ids: [ChunkID]) {
        for id in ids {
            let fd = open(path(of: id), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
            guard fd >= 0 else { continue }
            _ = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)
            close(fd)
        }
    }

    /// Chunk `id`'s file opened for reading, with its size; nil when it is not held. Only a regular file is opened:
    /// no symbolic link is followed, and the open does not block (a FIFO planted under a chunk's name must not hang
    /// it; regular files ignore the flag). The caller closes the descriptor.
    func openChunk(_ id: ChunkID) throws(ChunkStoreError) -> (Int32, Int)? {
        let fd = open(path(of: id), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
        guard fd >= 0 else {
            if errno == ENOENT { return nil }
            throw .system("open chunk \(id)", errno)
        }
        var info = stat()
        guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
            close(fd)
            throw ChunkStoreError("chunk \(id) is not a regular file", reason: .invalid)
        }
        return (fd, Int(info.st_size))
    }

    /// Up to `length` bytes of chunk `id` from `offset` (fewer at its end); nil when the chunk is not held.
    public func read(_ id: ChunkID, offset: Int = 0, length: Int = .max) throws(ChunkStoreError) -> [UInt8]? {
        guard let (fd, size) = try openChunk(id) else { return nil }
        defer { close(fd) }
        guard offset >= 0, length >= 0 else { throw ChunkStoreError("a read needs a non-negative offset and length", reason: .invalid) }
        let count = offset >= size ? 0 : min(length, size - offset)
        var failure: Int32 = 0
        // Uninitialized: every byte is read into before the array is used (or the read throws).
        let out = [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            var done = 0
            while done < count {
                let n = pread(fd, buffer.baseAddress!.advanced(by: done), count - done, off_t(offset + done))
                if n < 0 && errno == EINTR { continue }
                guard n > 0 else {
                    failure = n < 0 ? errno : EIO
                    break
                }
                done += n
            }
            initialized = done
        }
        guard failure == 0 else { throw .system("read chunk \(id)", failure) }
        return out
    }

    /// Copies `length` bytes of chunk `id` from `offset` to file descriptor `output` (at its position) in the kernel
    /// (`sendfile`, or reads and writes where it is not available); false when the chunk is not held.
    public func copy(_ id: ChunkID, offset: Int, length: Int, to output: Int32) throws(ChunkStoreError) -> Bool {
        guard let (fd, size) = try openChunk(id) else { return false }
        defer { close(fd) }
        guard offset >= 0, length >= 0, offset <= size, length <= size - offset else {
            throw ChunkStoreError("chunk \(id) holds \(size) bytes, not \(offset + length)", reason: .invalid)
        }
        var from = off_t(offset)
        var left = length
        while left > 0 {
            let n = sendfile(output, fd, &from, left)
            if n < 0 && errno == EINTR { continue }
            if n < 0 && (errno == ENOSYS || errno == EINVAL) {
                // A descriptor it cannot copy to: plain reads and writes.
                guard let part = try read(id, offset: Int(from), length: left) else { return false }
                var done = 0
                while done < part.count {
                    let w = part.withUnsafeBytes { write(output, $0.baseAddress!.advanced(by: done), part.count - done) }
                    if w < 0 && errno == EINTR { continue }
                    guard w > 0 else { throw .system("write a copy of chunk \(id)", w < 0 ? errno : EIO) }
                    done += w
                }
                return true
            }
            guard n > 0 else { throw .system("copy chunk \(id)", n < 0 ? errno : EIO) }
            left -= n
        }
        return true
    }

    /// Fills `buffer` from file descriptor `fd` at its position, reading until it is full; a file that ends first is
    /// an error (`EIO`), as any failed read (`what` names it).
    static func readFully(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, what: String) throws(ChunkStoreError) {
        var done = 0
        while done < buffer.count {
            let n = Glibc.read(fd, buffer.baseAddress!.advanced(by: done), buffer.count - done)
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { throw .system(what, n < 0 ? errno : EIO) }
            done += n
        }
    }

    /// Removes chunk `id`; false when it was not held.
    @discardableResult
    public func remove(_ id: ChunkID) -> Bool {
        guard unlink(path(of: id)) == 0 else { return false }
        changes.add(1, ordering: .releasing)
        return true
    }

    /// Pins chunk `id` in `pins` when it is held here (a sweep leaves it until the pins go); false when it is not.
    public func pin(_ id: ChunkID, into pins: ChunkPins) -> Bool {
        sweepLock.withLock { pinned in
            guard contains(id) else { return false }
            if pins.add(id) { pinned[id, default: 0] += 1 }
            return true
        }
    }

    /// Releases pins of `ids` (a put under way ended).
    func unpin(_ ids: [ChunkID]) {
        sweepLock.withLock { pinned in
            for id in ids {
                let left = pinned[id, default: 0] - 1
                pinned[id] = left > 0 ? left : nil
            }
        }
    }

    /// Removes every chunk not in `keeping`, not pinned by a put under way, whose file was last written or renewed
    /// before `cutoff` (Unix seconds); returns how many went and their bytes. What went is remembered for
    /// `swept(after:)`.
    public func sweep(keeping: Set<ChunkID>, writtenBefore cutoff: Double) throws(ChunkStoreError) -> (removed: Int, bytes: Int) {
        sweep(try unkept(keeping: keeping, writtenBefore: cutoff), writtenBefore: cutoff)
    }

    /// The chunks held that are not in `keeping` and whose file was last written or renewed before `cutoff`, as
    /// they are now: what `sweep(_:writtenBefore:)` may remove once nothing has come to refer to them.
    public func unkept(keeping: Set<ChunkID>, writtenBefore cutoff: Double) throws(ChunkStoreError) -> [ChunkID] {
        try listed().filter { id in
            var info = stat()
            return !keeping.contains(id) && lstat(path(of: id), &info) == 0 && Self.modified(info) < cutoff
        }
    }

    /// The last time a file was written or renewed, Unix seconds.
    private static func modified(_ info: stat) -> Double { Double(info.st_mtim.tv_sec) + Double(info.st_mtim.tv_nsec) / 1e9 }

    /// Removes each of `candidates` that is still a regular file last written or renewed before `cutoff` and not
    /// pinned by a put under way (checked at its removal); returns how many went and their bytes. What went is
    /// remembered for `swept(after:)`.
    public func sweep(_ candidates: [ChunkID], writtenBefore cutoff: Double) -> (removed: Int, bytes: Int) {
        var gone: [ChunkID] = []
        var bytes = 0
        for id in candidates {
            let file = path(of: id)
            sweepLock.withLock { pinned in
                var info = stat()
                guard pinned[id] == nil, lstat(file, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG,
                    Self.modified(info) < cutoff, unlink(file) == 0
                else { return }
                gone.append(id)
                bytes += Int(info.st_size)
            }
        }
        if !gone.isEmpty {
            changes.add(gone.count, ordering: .releasing)
            sweptLog.withLock { log in
                log.ids += gone
                if log.ids.count > Self.sweptLogLimit {
                    let drop = log.ids.count - Self.sweptLogLimit / 2
                    log.ids.removeFirst(drop)
                    log.base += drop
                }
            }
        }
        return (gone.count, bytes)
    }

    /// The chunks sweeps removed after position `mark` of their log (0: since the store was opened), and the position
    /// to ask from next time; those forgotten since (more than `sweptLogLimit`) are not told.
    public func swept(after mark: Int) -> (ids: [ChunkID], next: Int) {
        sweptLog.withLock { log in
            let from = max(0, mark - log.base)
            return (from < log.ids.count ? Array(log.ids[from...]) : [], log.base + log.ids.count)
        }
    }

    /// Every chunk held, in no particular order (file names that are not chunk ids are skipped); throws when a
    /// directory cannot be read (a sweep must not take a partial listing for the whole).
    func listed() throws(ChunkStoreError) -> [ChunkID] {
        var out: [ChunkID] = []
        let fm = FileManager.default
        let shards: [String]
        do { shards = try fm.contentsOfDirectory(atPath: directory) } catch { throw ChunkStoreError("cannot list \(directory): \(error)", reason: .invalid) }
        for shard in shards where shard.utf8.count == 2 {
            let names: [String]
            do { names = try fm.contentsOfDirectory(atPath: "\(directory)/\(shard)") } catch {
                throw ChunkStoreError("cannot list \(directory)/\(shard): \(error)", reason: .invalid)
            }
            for name in names { if let id = ChunkID(hex: name), name.hasPrefix(shard) { out.append(id) } }
        }
        return out
    }

    /// Every chunk held, in no particular order (file names that are not chunk ids are skipped).
    public func all() -> [ChunkID] {
        var out: [ChunkID] = []
        let fm = FileManager.default
        for shard in (try? fm.contentsOfDirectory(atPath: directory)) ?? [] where shard.utf8.count == 2 {
            for name in (try? fm.contentsOfDirectory(atPath: "\(directory)/\(shard)")) ?? [] {
                if let id = ChunkID(hex: name), name.hasPrefix(shard) { out.append(id) }
            }
        }
        return out
    }

    /// Syncs directory `path`, so that a rename into it is durable.
    static func syncDirectory(_ path: String) throws(ChunkStoreError) {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw .system("open \(path)", errno) }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw .system("sync \(path)", errno) }
    }

    /// Removes temporary files a crash left behind (a put that never renamed its file).
    static func removeLeftovers(in directory: String) {
        let fm = FileManager.default
        for shard in (try? fm.contentsOfDirectory(atPath: directory)) ?? [] where shard.utf8.count == 2 {
            for name in (try? fm.contentsOfDirectory(atPath: "\(directory)/\(shard)")) ?? [] where name.hasPrefix(".tmp-") {
                unlink("\(directory)/\(shard)/\(name)")
            }
        }
    }
}

/// A chunk store operation that failed.
public struct ChunkStoreError: Error, Sendable, CustomStringConvertible {
    /// Why an operation failed.
    public enum Reason: Sendable, Equatable {
        /// A system call failed with this error number (`ENOSPC` when the disk is full).
        case system(Int32)
        /// A limit was reached (a blob over its maximum size).
        case limit
        /// A chunk needed is not held here.
        case missing
        /// Stored or given bytes are not what they should be (a manifest that does not decode, a file of the wrong type).
        case invalid
    }

    /// What failed and why.
    public let description: String
    /// Why, as a value.
    public let reason: Reason

    /// An error saying `description`.
    public init(_ description: String, reason: Reason) {
        self.description = description
        self.reason = reason
    }

    /// The failure of a system call doing `what`, with its error number.
    public static func system(_ what: String, _ code: Int32) -> ChunkStoreError {
        ChunkStoreError("cannot \(what): \(String(cString: strerror(code)))", reason: .system(code))
    }
}
