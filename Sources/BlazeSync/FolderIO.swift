import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import Foundation
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Where this device stopped reading one segment file, and which entries its records hold.
struct FileCursor {
    /// The file as last read, nil before the first read.
    var stamp: FileStamp?
    /// Everything before this offset is done with (0: the header is not checked yet).
    var offset = 0
    /// False once the header showed the file is not a segment of this space and directory.
    var usable = true
    /// Entries per origin its done records hold (ranges of seqs).
    var ranges: [NodeID: [ClosedRange<UInt64>]] = [:]
    /// Outcomes of records after `offset` (behind a waiting record), by offset.
    var memo: [Int: Memo] = [:]
    /// Offset of a damaged record already counted.
    var damagedAt: Int?
    /// True while a record waits for entries or keys.
    var waiting = false

    enum Memo: Equatable {
        case done
        case gap(NodeID, UInt64)
        case keys(Int)
        /// Refused for a reason that may clear (`SyncRejection.mayClear`): read again from `after`, for the `tries`th
        /// time.
        case later(after: ContinuousClock.Instant, tries: Int)
    }

    /// True when an unchanged file has a waiting record that what is held now (or the keys) may let through.
    func retry(held: [NodeID: UInt64], keys: Int) -> Bool {
        guard waiting else { return false }
        return memo.values.contains {
            switch $0 {
            case .gap(let origin, let first): return first <= (held[origin] ?? 0) + 1
            case .keys(let count): return keys > count
            case .later(let after, _): return ContinuousClock.now >= after
            case .done: return false
            }
        }
    }

    /// Notes that the file holds `origin`'s entries `range`.
    mutating func cover(_ origin: NodeID, _ range: ClosedRange<UInt64>) {
        var list = ranges[origin] ?? []
        if let last = list.last, range.lowerBound <= last.upperBound + 1, range.lowerBound >= last.lowerBound {
            list[list.count - 1] = last.lowerBound...max(last.upperBound, range.upperBound)
        } else {
            list.append(range)
        }
        ranges[origin] = list
    }
}

/// What identifies a file's version cheaply: device, inode, size and modification time.
struct FileStamp: Equatable {
    var device: UInt64
    var inode: UInt64
    var size: Int
    var modified: Int
    var regular: Bool

    /// The stamp of the file at `path` itself (a symbolic link is not followed, and is not `regular`), nil when
    /// there is none.
    init?(path: String) {
        var st = stat()
        guard lstat(path, &st) == 0 else { return nil }
        device = UInt64(st.st_dev)
        inode = UInt64(st.st_ino)
        size = Int(st.st_size)
        modified = Int(st.st_mtim.tv_sec) * 1_000_000_000 + Int(st.st_mtim.tv_nsec)
        regular = (st.st_mode & S_IFMT) == S_IFREG
    }
}

/// The segment file this device appends to.
struct OwnSegment {
    let path: String
    let name: String
    let number: UInt64
    let fd: Int32
    let inode: UInt64
    var size: Int

    /// Opens this device's latest segment, cutting off a torn record at its end (a crash while appending), or
    /// starts the first one.
    static func open(dirFD: Int32, dir: String, space: SpaceID, writer: [UInt8], logger: Logger) throws -> OwnSegment {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []
        guard let number = names.compactMap(FolderFiles.segmentNumber).max() else {
            return try create(dirFD: dirFD, dir: dir, number: 1, space: space, writer: writer)
        }
        let name = FolderFiles.segmentName(number)
        let path = dir + "/" + name
        let fd = openat(dirFD, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { throw FolderProblem("cannot open \(path): \(errnoText())") }
        var st = stat()
        fstat(fd, &st)
        let size = Int(st.st_size)
        guard let header = preadAll(fd, offset: 0, count: FolderFiles.segmentHeaderSize),
            FolderFiles.checkSegmentHeader(header[...], space: space, writer: writer)
        else {
            // Not a segment this device can continue (damaged, or replaced): the next number starts afresh.
            Glibc.close(fd)
            return try create(dirFD: dirFD, dir: dir, number: number + 1, space: space, writer: writer)
        }
        var end = FolderFiles.segmentHeaderSize
        while end < size {
            guard let chunk = preadRecord(fd, offset: end), case .record(_, let recordSize) = FolderFiles.scanRecord(chunk[...])
            else { break }
            end += recordSize
        }
        if end < size {
            logger.notice("Folder segment had a torn record at its end; cut off", metadata: ["file": "\(path)", "bytes": "\(size - end)"])
            guard ftruncate(fd, off_t(end)) == 0, fsync(fd) == 0 else {
                Glibc.close(fd)
                throw FolderProblem("cannot repair \(path): \(errnoText())")
            }
        }
        return OwnSegment(path: path, name: name, number: number, fd: fd, inode: UInt64(st.st_ino), size: end)
    }

    /// Starts segment `number`: its header is written to a temporary file, synced and renamed into place.
    static func create(dirFD: Int32, dir: String, number: UInt64, space: SpaceID, writer: [UInt8]) throws -> OwnSegment {
        let name = FolderFiles.segmentName(number)
        let path = dir + "/" + name
        try replaceFile(at: dirFD, name, with: FolderFiles.segmentHeader(space: space, writer: writer, number: number))
        let fd = openat(dirFD, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else { throw FolderProblem("cannot open \(path): \(errnoText())") }
        var st = stat()
        fstat(fd, &st)
        return OwnSegment(path: path, name: name, number: number, fd: fd, inode: UInt64(st.st_ino), size: Int(st.st_size))
    }

    /// True while the file of this name in `dirFD` is still the one open here, as long as written (a folder tool
    /// may have replaced it with another copy).
    func isCurrent(in dirFD: Int32) -> Bool {
        var st = stat()
        guard fstatat(dirFD, name, &st, AT_SYMLINK_NOFOLLOW) == 0 else { return false }
        return UInt64(st.st_ino) == inode && Int(st.st_size) == size
    }

    /// Appends bytes at the end (one write per record, so a reader sees a record whole or in part, never mixed).
    mutating func append(_ bytes: [UInt8]) throws {
        var done = 0
        while done < bytes.count {
            let n = bytes.withUnsafeBytes { pwrite(fd, $0.baseAddress! + done, bytes.count - done, off_t(size + done)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { throw FolderProblem("cannot write \(path): \(errnoText())") }
            done += n
        }
        size += bytes.count
    }

    /// Makes what was appended durable.
    func sync() throws {
        guard fsync(fd) == 0 else { throw FolderProblem("cannot sync \(path): \(errnoText())") }
    }

    func close() { Glibc.close(fd) }
}

/// A folder problem for humans (`sync.status` lastError).
struct FolderProblem: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Milliseconds since boot (monotonic).
func uptimeMs() -> UInt64 { DispatchTime.now().uptimeNanoseconds / 1_000_000 }

func errnoText() -> String { String(cString: strerror(errno)) }

/// True when `path` is a directory (or a link to one).
func isDirectory(_ path: String) -> Bool {
    var st = stat()
    return stat(path, &st) == 0 && (st.st_mode & S_IFMT) == S_IFDIR
}

/// Up to `count` bytes at `offset` (fewer at the end of the file); nil when reading fails.
func preadAll(_ fd: Int32, offset: Int, count: Int) -> [UInt8]? {
    var out = [UInt8](repeating: 0, count: count)
    var done = 0
    while done < count {
        let n = out.withUnsafeMutableBytes { pread(fd, $0.baseAddress! + done, count - done, off_t(offset + done)) }
        if n < 0 && errno == EINTR { continue }
        guard n >= 0 else { return nil }
        if n == 0 { break }
        done += n
    }
    out.removeLast(count - done)
    return out
}

/// The record at `offset` with its prefix, as far as the file holds it (its prefix says how long it is, bounded);
/// when `available` bytes cannot hold it, only the prefix (nothing larger is read or allocated before it is there).
func preadRecord(_ fd: Int32, offset: Int, available: Int = .max) -> [UInt8]? {
    guard let prefix = preadAll(fd, offset: offset, count: FolderFiles.recordPrefixSize),
        prefix.count == FolderFiles.recordPrefixSize
    else { return nil }
    let length = Int(prefix[0]) << 24 | Int(prefix[1]) << 16 | Int(prefix[2]) << 8 | Int(prefix[3])
    guard length <= FolderFiles.maxRecordBody, FolderFiles.recordPrefixSize + length <= available else { return prefix }
    return preadAll(fd, offset: offset, count: FolderFiles.recordPrefixSize + length)
}

/// Opens a file of the folder for reading, -1 when it cannot: `path` must lie below `root` (the folder the user named,
/// trusted as it is), and every component after it is opened relative to the one before (`openat`) without following
/// a link: a directory swapped for a link between a listing and this read cannot send the read outside the folder.
/// Never waits (a FIFO put in a file's place must not block the reader).
func openForReading(_ path: String, beneath root: String) -> Int32 {
    guard path.hasPrefix(root + "/") else { return -1 }
    let components = path.dropFirst(root.count + 1).split(separator: "/").map(String.init)
    guard let name = components.last, !components.contains(where: { $0 == ".." || $0 == "." }) else { return -1 }
    var dir = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
    for component in components.dropLast() where dir >= 0 {
        let next = openat(dir, component, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        close(dir)
        dir = next
    }
    guard dir >= 0 else { return -1 }
    defer { close(dir) }
    return openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
}

/// The whole file at `path` below `root` (`openForReading`), nil when missing, unreadable, reached through a link,
/// not a regular file or larger than `limit`.
func readWhole(_ path: String, beneath root: String, limit: Int) -> [UInt8]? {
    let fd = openForReading(path, beneath: root)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var st = stat()
    guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG, Int(st.st_size) <= limit else { return nil }
    return preadAll(fd, offset: 0, count: Int(st.st_size))
}

/// True when `name` exists in the directory `dirFD` (a link counts; it is not followed).
func exists(at dirFD: Int32, _ name: String) -> Bool {
    var st = stat()
    return fstatat(dirFD, name, &st, AT_SYMLINK_NOFOLLOW) == 0
}

/// Replaces file `name` of the directory `dirFD` atomically and durably: a temporary file beside it, synced, renamed
/// over it, the directory synced. Whatever lies at the temporary name is removed first and the file is created anew
/// (never opened through a link, never blocking on a FIFO someone planted there).
func replaceFile(at dirFD: Int32, _ name: String, with bytes: [UInt8]) throws {
    let tmp = name + ".tmp"
    _ = unlinkat(dirFD, tmp, 0)
    let fd = openat(dirFD, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0o644)
    guard fd >= 0 else { throw FolderProblem("cannot create \(tmp): \(errnoText())") }
    var done = 0
    while done < bytes.count {
        let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + done, bytes.count - done) }
        if n < 0 && errno == EINTR { continue }
        guard n > 0 else {
            let problem = FolderProblem("cannot write \(tmp): \(errnoText())")
            close(fd)
            _ = unlinkat(dirFD, tmp, 0)
            throw problem
        }
        done += n
    }
    guard fsync(fd) == 0 else {
        let problem = FolderProblem("cannot sync \(tmp): \(errnoText())")
        close(fd)
        _ = unlinkat(dirFD, tmp, 0)
        throw problem
    }
    close(fd)
    // A failed write leaves no temporary file behind in the folder.
    guard renameat(dirFD, tmp, dirFD, name) == 0 else {
        let problem = FolderProblem("cannot rename \(tmp): \(errnoText())")
        _ = unlinkat(dirFD, tmp, 0)
        throw problem
    }
    _ = fsync(dirFD)
}
