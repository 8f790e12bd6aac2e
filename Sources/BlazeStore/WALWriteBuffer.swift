import Foundation
import GRDBSQLite
import Synchronization

/// A VFS over SQLite's default one that gathers a transaction's writes to the write-ahead log into few `pwrite`s.
///
/// SQLite writes each WAL frame as two calls (its 24-byte header, then the page), so a commit of ten pages made
/// twenty system calls before its fsync, and a group commit of several changes many more. For a WAL file whose
/// connection enabled it (`enable(on:)`), this VFS buffers contiguous writes in memory and writes them out before
/// anything could read them or depend on them being in the file: in the `xSync` that ends every commit of a
/// connection with `synchronous = FULL` (SQLite publishes a commit's frames to other connections through the WAL
/// index only after that sync), before any read, size query, truncation or file control on the file, when the
/// buffer is full or a write is not contiguous, and at close. A failed buffered write is reported by the call that
/// flushes it, which SQLite handles as it would the write (the commit fails and rolls back). Under `synchronous =
/// NORMAL` a commit has no sync before its frames are published, which is why buffering is opt-in per connection.
///
/// Every other file (the database, journals) is opened by the default VFS itself and used without indirection, and
/// WAL files of connections that did not enable buffering pass every call straight through. The VFS is installed as
/// the process's default before the first database opens (`install()`).
enum WALWriteBuffer {
    /// WAL writes gathered into the buffer instead of passed on, since the process started (a measure, and what tests
    /// check the buffering against).
    static let gathered = Atomic<Int>(0)

    /// Bytes a WAL file's buffer holds at most before it is written out. It starts at `chunk` and doubles as commits
    /// need (a single write is about ten 4 KiB frames; a group commit of eight, or a bulk transaction, more): each
    /// open database's writer keeps its buffer. Beyond this the gain is nil, the default VFS taking under 128 KiB
    /// per call anyway.
    static let capacity = 1 << 18

    /// Installs the VFS as the default, once per process; returns whether it is installed.
    @discardableResult
    static func install() -> Bool { installed }

    private static let installed: Bool = {
        SQLiteProcess.configure()
        guard let base = sqlite3_vfs_find(nil) else { return false }
        let vfs = UnsafeMutablePointer<sqlite3_vfs>.allocate(capacity: 1)
        vfs.initialize(to: base.pointee)
        vfs.pointee.pNext = nil
        vfs.pointee.zName = UnsafePointer(strdup("blazedb-wal-buffer"))
        // A wrapped WAL file: our methods, the buffer's state, then the default VFS's file.
        vfs.pointee.szOsFile = Int32(headerSize) + base.pointee.szOsFile
        vfs.pointee.xOpen = open
        baseVFS = UnsafePointer(base)
        return sqlite3_vfs_register(vfs, 1) == SQLITE_OK
    }()

    /// The default VFS this one delegates to (set once, before registration).
    nonisolated(unsafe) private static var baseVFS: UnsafePointer<sqlite3_vfs>?

    /// Bytes before the wrapped file: the `sqlite3_file` header (its methods pointer) and the state pointer.
    private static let headerSize = 16

    /// The methods of a wrapped WAL file.
    nonisolated(unsafe) private static let methods: UnsafeMutablePointer<sqlite3_io_methods> = {
        let m = UnsafeMutablePointer<sqlite3_io_methods>.allocate(capacity: 1)
        m.initialize(
            to: sqlite3_io_methods(
                iVersion: 3, xClose: close, xRead: read, xWrite: write, xTruncate: truncate, xSync: sync,
                xFileSize: fileSize, xLock: lock, xUnlock: unlock, xCheckReservedLock: checkReservedLock,
                xFileControl: fileControl, xSectorSize: sectorSize, xDeviceCharacteristics: deviceCharacteristics,
                xShmMap: shmMap, xShmLock: shmLock, xShmBarrier: shmBarrier, xShmUnmap: shmUnmap, xFetch: fetch,
                xUnfetch: unfetch))
        return m
    }()

    /// Turns buffering on for the WAL file of `connection`, which must keep `synchronous = FULL` for as long as it is
    /// open; returns false (and changes nothing) when its WAL is not open or not one of this VFS's files.
    @discardableResult
    static func enable(on connection: OpaquePointer) -> Bool {
        var pointer: UnsafeMutablePointer<sqlite3_file>?
        guard sqlite3_file_control(connection, "main", SQLITE_FCNTL_JOURNAL_POINTER, &pointer) == SQLITE_OK,
            let file = pointer, file.pointee.pMethods == UnsafePointer(methods)
        else { return false }
        buffer(file).enabled = true
        return true
    }

    /// The buffered bytes of one WAL file: `count` bytes that belong at file offset `start`.
    final class Buffer {
        /// Whether writes are buffered (`enable(on:)`); off, every call passes through.
        var enabled = false
        /// `size` bytes, allocated at the first buffered write (a connection that only reads has none).
        var bytes: UnsafeMutableRawPointer?
        /// The allocated size of `bytes`: from `chunk` up to `capacity`.
        var size = 0
        /// Bytes held, not yet written.
        var count = 0
        /// The file offset the first held byte belongs at.
        var start: Int64 = 0

        deinit { bytes?.deallocate() }
    }

    private static let open:
        @convention(c) (
            UnsafeMutablePointer<sqlite3_vfs>?, UnsafePointer<CChar>?, UnsafeMutablePointer<sqlite3_file>?, Int32,
            UnsafeMutablePointer<Int32>?
        ) -> Int32 = { _, name, file, flags, outFlags in
            guard let base = baseVFS, let file, let xOpen = base.pointee.xOpen else { return SQLITE_CANTOPEN }
            let vfs = UnsafeMutablePointer(mutating: base)
            guard flags & SQLITE_OPEN_WAL != 0 else {
                // Not a WAL file: the default VFS's own file, used directly.
                return xOpen(vfs, name, file, flags, outFlags)
            }
            let inner = wrapped(file)
            let rc = xOpen(vfs, name, inner, flags, outFlags)
            guard rc == SQLITE_OK else {
                if let close = inner.pointee.pMethods?.pointee.xClose { _ = close(inner) }
                file.pointee.pMethods = nil
                return rc
            }
            UnsafeMutableRawPointer(file).storeBytes(
                of: Unmanaged.passRetained(Buffer()).toOpaque(), toByteOffset: 8, as: UnsafeMutableRawPointer.self)
            file.pointee.pMethods = UnsafePointer(methods)
            return SQLITE_OK
        }

    /// The default VFS's file inside a wrapped one.
    private static func wrapped(_ file: UnsafeMutablePointer<sqlite3_file>) -> UnsafeMutablePointer<sqlite3_file> {
        (UnsafeMutableRawPointer(file) + headerSize).assumingMemoryBound(to: sqlite3_file.self)
    }

    private static func buffer(_ file: UnsafeMutablePointer<sqlite3_file>) -> Buffer {
        Unmanaged<Buffer>.fromOpaque(UnsafeMutableRawPointer(file).load(fromByteOffset: 8, as: UnsafeMutableRawPointer.self))
            .takeUnretainedValue()
    }

    private static func innerMethods(_ file: UnsafeMutablePointer<sqlite3_file>) -> sqlite3_io_methods {
        wrapped(file).pointee.pMethods!.pointee
    }

    /// Bytes per write handed to the default VFS, whose `xWrite` takes fewer than 128 KiB at a time (it masks the
    /// length with 0x1ffff: 128 KiB exactly would write nothing and report a full disk).
    static let chunk = 1 << 16

    /// Writes out what the buffer holds; SQLITE_OK or the write's error (the buffer is emptied either way).
    private static func flush(_ file: UnsafeMutablePointer<sqlite3_file>) -> Int32 {
        let b = buffer(file)
        guard b.count > 0, let bytes = b.bytes else { return SQLITE_OK }
        let (count, start) = (b.count, b.start)
        b.count = 0
        let xWrite = innerMethods(file).xWrite!
        var done = 0
        while done < count {
            let n = min(chunk, count - done)
            let rc = xWrite(wrapped(file), bytes + done, Int32(n), start + Int64(done))
            guard rc == SQLITE_OK else { return rc }
            done += n
        }
        return SQLITE_OK
    }

    private static let write:
        @convention(c) (UnsafeMutablePointer<sqlite3_file>?, UnsafeRawPointer?, Int32, Int64) -> Int32 = {
            file, data, amount, offset in
            guard let file, let data else { return SQLITE_IOERR | (3 << 8) }
            let b = buffer(file)
            guard b.enabled else { return innerMethods(file).xWrite!(wrapped(file), data, amount, offset) }
            let n = Int(amount)
            let end = b.start + Int64(b.count)
            if b.count > 0, offset >= b.start, offset + Int64(n) <= end {
                // Rewriting bytes still in the buffer (SQLite rewrites a frame a transaction wrote twice).
                (b.bytes! + Int(offset - b.start)).copyMemory(from: data, byteCount: n)
                gathered.add(1, ordering: .relaxed)
                return SQLITE_OK
            }
            if b.count > 0, offset == end, b.count + n <= capacity {
                if b.count + n > b.size {
                    // Grow (by doubling, up to `capacity`), keeping what is held.
                    let size = min(capacity, max(b.size * 2, b.count + n))
                    let grown = UnsafeMutableRawPointer.allocate(byteCount: size, alignment: 16)
                    grown.copyMemory(from: b.bytes!, byteCount: b.count)
                    b.bytes!.deallocate()
                    (b.bytes, b.size) = (grown, size)
                }
                (b.bytes! + b.count).copyMemory(from: data, byteCount: n)
                b.count += n
                gathered.add(1, ordering: .relaxed)
                return SQLITE_OK
            }
            let rc = flush(file)
            guard rc == SQLITE_OK else { return rc }
            guard n <= chunk else { return innerMethods(file).xWrite!(wrapped(file), data, amount, offset) }
            if b.bytes == nil { (b.bytes, b.size) = (UnsafeMutableRawPointer.allocate(byteCount: chunk, alignment: 16), chunk) }
            b.bytes!.copyMemory(from: data, byteCount: n)
            (b.start, b.count) = (offset, n)
            return SQLITE_OK
        }

    private static let read:
        @convention(c) (UnsafeMutablePointer<sqlite3_file>?, UnsafeMutableRawPointer?, Int32, Int64) -> Int32 = {
            file, data, amount, offset in
            guard let file else { return SQLITE_IOERR | (1 << 8) }
            let b = buffer(file)
            if b.count > 0, offset < b.start + Int64(b.count), offset + Int64(amount) > b.start {
                let rc = flush(file)
                guard rc == SQLITE_OK else { return rc }
            }
            return innerMethods(file).xRead!(wrapped(file), data, amount, offset)
        }

    private static let close: @convention(c) (UnsafeMutablePointer<sqlite3_file>?) -> Int32 = { file in
        guard let file else { return SQLITE_OK }
        let flushed = flush(file)
        let closed = innerMethods(file).xClose!(wrapped(file))
        Unmanaged<Buffer>.fromOpaque(UnsafeMutableRawPointer(file).load(fromByteOffset: 8, as: UnsafeMutableRawPointer.self))
            .release()
        file.pointee.pMethods = nil
        return flushed != SQLITE_OK ? flushed : closed
    }

    private static let truncate: @convention(c) (UnsafeMutablePointer<sqlite3_file>?, Int64) -> Int32 = { file, size in
        guard let file else { return SQLITE_IOERR }
        let rc = flush(file)
        return rc != SQLITE_OK ? rc : innerMethods(file).xTruncate!(wrapped(file), size)
    }

    private static let sync: @convention(c) (UnsafeMutablePointer<sqlite3_file>?, Int32) -> Int32 = { file, flags in
        guard let file else { return SQLITE_IOERR }
        let rc = flush(file)
        return rc != SQLITE_OK ? rc : innerMethods(file).xSync!(wrapped(file), flags)
    }

    private static let fileSize: @convention(c) (UnsafeMutablePointer<sqlite3_file>?, UnsafeMutablePointer<Int64>?) -> Int32 = {
        file, size in
        guard let file else { return SQLITE_IOERR }
        let rc = flush(file)
        return rc != SQLITE_OK ? rc : innerMethods(file).xFileSize!(wrapped(file), size)
    }

    private static let lock: @convention(c) (UnsafeMutablePointer<sqlite3_file>?, Int32) -> Int32 = { file, level in
        guard let file else { return SQLITE_IOERR }
        return innerMethods(file).xLock!(wrapped(file), level)
    }

    private static let unlock: @convention(c) (UnsafeMutablePointer<sqlite3_file>?, Int32) -> Int32 = { file, level in
        guard let file else { return SQLITE_IOERR }
        return innerMethods(file).xUnlock!(wrapped(file), level)
    }

    private static let checkReservedLock:
        @convention(c) (UnsafeMutablePointer<sqlite3_file>?, UnsafeMutablePointer<Int32>?) -> Int32 = { file, out in
            guard let file else { return SQLITE_IOERR }
            return innerMethods(file).xCheckReservedLock!(wrapped(file), out)
        }

    private static let fileControl:
        @convention(c) (UnsafeMutablePointer<sqlite3_file>?, Int32, UnsafeMutableRawPointer?) -> Int32 = { file, op, arg in
            guard let file else { return SQLITE_NOTFOUND }
            let rc = flush(file)
            return rc != SQLITE_OK ? rc : innerMethods(file).xFileControl!(wrapped(file), op, arg)
        }

    private static let sectorSize: @convention(c) (UnsafeMutablePointer<sqlite3_file>?) -> Int32 = { file in
        guard let file else { return 4096 }
        return innerMethods(file).xSectorSize!(wrapped(file))
    }

    private static let deviceCharacteristics: @convention(c) (UnsafeMutablePointer<sqlite3_file>?) -> Int32 = { file in
        guard let file else { return 0 }
        return innerMethods(file).xDeviceCharacteristics!(wrapped(file))
    }

    private static let shmMap:
        @convention(c) (
            UnsafeMutablePointer<sqlite3_file>?, Int32, Int32, Int32, UnsafeMutablePointer<UnsafeMutableRawPointer?>?
        ) -> Int32 = { file, page, size, extend, out in
            guard let file, let map = innerMethods(file).xShmMap else { return SQLITE_IOERR }
            return map(wrapped(file), page, size, extend, out)
        }

    private static let shmLock: @convention(c) (UnsafeMutablePointer<sqlite3_file>?, Int32, Int32, Int32) -> Int32 = {
        file, offset, n, flags in
        guard let file, let lock = innerMethods(file).xShmLock else { return SQLITE_IOERR }
        return lock(wrapped(file), offset, n, flags)
    }

    private static let shmBarrier: @convention(c) (UnsafeMutablePointer<sqlite3_file>?) -> Void = { file in
        guard let file, let barrier = innerMethods(file).xShmBarrier else { return }
        barrier(wrapped(file))
    }

    private static let shmUnmap: @convention(c) (UnsafeMutablePointer<sqlite3_file>?, Int32) -> Int32 = { file, delete in
        guard let file, let unmap = innerMethods(file).xShmUnmap else { return SQLITE_OK }
        return unmap(wrapped(file), delete)
    }

    private static let fetch:
        @convention(c) (UnsafeMutablePointer<sqlite3_file>?, Int64, Int32, UnsafeMutablePointer<UnsafeMutableRawPointer?>?)
            -> Int32 = { file, offset, amount, out in
            out?.pointee = nil
            guard let file else { return SQLITE_OK }
            let rc = flush(file)
            guard rc == SQLITE_OK, let fetch = innerMethods(file).xFetch else { return rc }
            return fetch(wrapped(file), offset, amount, out)
        }

    private static let unfetch: @convention(c) (UnsafeMutablePointer<sqlite3_file>?, Int64, UnsafeMutableRawPointer?) -> Int32 =
        { file, offset, pointer in
            guard let file, let unfetch = innerMethods(file).xUnfetch else { return SQLITE_OK }
            return unfetch(wrapped(file), offset, pointer)
        }
}
