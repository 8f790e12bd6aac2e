import BlazeBlob
import BlazeProtocol
import BlazeStore
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Blobs: files put into a database as content-defined chunks, read back whole or by range (ARCHITECTURE.md, "Blobs").
extension Methods {
    static let blobPut = MethodHandler(RPC.BlobPut.self) { p, ctx in
        let db = try ctx.writableDatabase(p.db)
        let put = try ctx.blobs.put(db: db, keys: try ctx.sync.blobKeys(db: db), path: p.path, type: p.type)
        ctx.logger.info("Blob put", metadata: ["db": "\(db.name)", "blob": "\(put.id)", "bytes": "\(put.size)", "stored": "\(put.storedBytes)"])
        return putResult(put)
    }.onTransferPool()

    static let blobUpload = MethodHandler(RPC.BlobUpload.self) { p, ctx in
        let db = try ctx.writableDatabase(p.db)
        let id = try ctx.blobs.startUpload(db: db, keys: try ctx.sync.blobKeys(db: db), connection: ctx.connectionID, type: p.type)
        return .init(upload: id)
    }

    static let blobAppend = MethodHandler(RPC.BlobAppend.self) { p, ctx in
        _ = try ctx.database(p.db)
        return .init(size: try ctx.blobs.append(upload: p.upload, db: p.db, connection: ctx.connectionID, data: p.data))
    }

    static let blobFinish = MethodHandler(RPC.BlobFinish.self) { p, ctx in
        _ = try ctx.database(p.db)
        return putResult(try ctx.blobs.finish(upload: p.upload, db: p.db, connection: ctx.connectionID))
    }

    static let blobAbort = MethodHandler(RPC.BlobAbort.self) { p, ctx in
        _ = try ctx.database(p.db)
        try ctx.blobs.abort(upload: p.upload, db: p.db, connection: ctx.connectionID)
        return .init(aborted: true)
    }

    static let blobRead = MethodHandler(deferred: RPC.BlobRead.self) { p, ctx, reply in
        let db = try ctx.database(p.db)
        let offset = p.offset ?? 0
        let length = p.length ?? Blobs.maxReadBytes
        guard offset >= 0, length >= 0 else {
            throw StoreError(.invalidArgument, kind: "invalid_range", "offset and length must not be negative")
        }
        guard length <= Blobs.maxReadBytes else {
            throw StoreError(.limitExceeded, kind: "too_large", "blob.read returns at most \(Blobs.maxReadBytes) bytes per call")
        }
        // The chunks the range covers are fetched from peers when this device lacks them; no thread waits meanwhile.
        ctx.blobs.whenHeld(
            db: db, blob: p.blob, sync: ctx.sync, inline: ctx.answersInline,
            needed: { manifest in manifest.pieces(overlapping: offset, length: length).map { $0.piece.id } }
        ) { _, manifest, reader in
            var data: [UInt8] = []
            try Blobs.mapped { try reader.read(manifest, offset: offset, length: length) { data += $0 } }
            return RPC.BlobRead.Result(data: Data(data).base64EncodedString(), offset: offset, bytes: data.count, size: manifest.size)
        } done: { reply($0) }
    }

    static let blobGet = MethodHandler(RPC.BlobGet.self) { p, ctx in
        let db = try ctx.database(p.db)
        // A path that cannot be written is refused before anything is fetched (`writeNewFile` checks again).
        try checkNewFile(p.path)
        // Every chunk this device lacks is fetched (and kept); the file is written as they arrive, in order. The
        // pages of what is copied are let go as it goes (the fetched chunks are durable, the file is written back
        // from now on), so a large blob does not fill memory with pages nothing reads again soon.
        var size = 0
        try writeNewFile(p.path) { fd in
            var written = 0
            let (_, manifest, reader) = try ctx.blobs.fetchWhole(db: db, blob: p.blob, sync: ctx.sync) { manifest, reader, fetched in
                written = try reader.copyHeld(manifest, from: written, to: fd)
                reader.store.dropCached(fetched)
                _ = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)
            }
            written = try reader.copyHeld(manifest, from: written, to: fd)
            guard written == manifest.pieces.count else {
                throw ChunkStoreError("chunk \(manifest.pieces[written].id) of the blob is not held here", reason: .missing)
            }
            size = manifest.size
        }
        return .init(path: p.path, bytes: size)
    }.onTransferPool()

    static let blobStat = MethodHandler(deferred: RPC.BlobStat.self) { p, ctx, reply in
        let db = try ctx.database(p.db)
        // The manifest is fetched when this device lacks it; the chunks are not.
        let sync = ctx.sync
        ctx.blobs.whenHeld(db: db, blob: p.blob, sync: sync, inline: ctx.answersInline, needed: { _ in [] }) { id, manifest, reader in
            var held = 0
            var heldBytes = 0
            var missing: [ChunkID] = []
            for piece in manifest.pieces {
                if reader.store.contains(piece.id) {
                    held += 1
                    heldBytes += piece.length
                } else {
                    missing.append(piece.id)
                }
            }
            return RPC.BlobStat.Result(
                id: id.hex, size: manifest.size, chunks: manifest.pieces.count, heldChunks: held, heldBytes: heldBytes,
                fetchingChunks: sync.chunksBeingFetched(db: db, among: missing))
        } done: { reply($0) }
    }

    /// The result of `blob.put` and `blob.finish`.
    static func putResult(_ put: Blobs.Put) -> RPCSchema.BlobPutResult {
        let info = RPCSchema.BlobInfo(id: put.id.hex, size: put.size, type: put.type)
        let ref: JSONValue = .object(["$blob": .object(["id": .string(put.id.hex), "size": .int(Int64(put.size)), "type": .string(put.type)])])
        return .init(blob: info, ref: ref, chunks: put.chunks, storedBytes: put.storedBytes)
    }

    /// Throws what `writeNewFile` would for `path` when it is not an absolute file path, it or `path.partial` exists, its
    /// directory does not or cannot be written, or its name leaves no room for `.partial`.
    static func checkNewFile(_ path: String) throws {
        guard path.hasPrefix("/"), !path.hasSuffix("/") else {
            throw StoreError(.invalidArgument, kind: "invalid_path", "path must be an absolute file path, got \(path)")
        }
        var info = stat()
        for name in [path, path + ".partial"] where lstat(name, &info) == 0 {
            throw StoreError(.alreadyExists, kind: "file_exists", "cannot create \(path): \(name) exists")
        }
        let directory = (path as NSString).deletingLastPathComponent
        let name = (path as NSString).lastPathComponent
        guard stat(directory.isEmpty ? "/" : directory, &info) == 0, (info.st_mode & S_IFMT) == S_IFDIR,
            access(directory.isEmpty ? "/" : directory, W_OK | X_OK) == 0
        else {
            throw StoreError(.invalidArgument, kind: "invalid_path", "cannot create \(path): \(directory) is not a writable directory")
        }
        // `path.partial` is written first: its name must fit too.
        guard name.utf8.count + ".partial".utf8.count <= Int(NAME_MAX) else {
            throw StoreError(.invalidArgument, kind: "invalid_path", "cannot create \(path): its name is too long")
        }
    }

    /// Creates the file at `path` (absolute, in an existing directory, not existing) with what `body` writes to its
    /// descriptor, so that it appears only complete and nothing is overwritten: written as an unnamed file in its
    /// directory (`O_TMPFILE`), synced, then linked to `path`, so a daemon stopped midway leaves nothing behind; where
    /// the file system has no unnamed files, written to `path.partial` and linked from there. The directory is opened
    /// once and every step goes through that descriptor, so a directory renamed or replaced meanwhile cannot send the
    /// file, its link or the sync of its name anywhere else. `unnamedIfPossible: false` takes the `.partial` way
    /// (for tests, whose file systems all have unnamed files).
    static func writeNewFile(_ path: String, unnamedIfPossible: Bool = true, _ body: (Int32) throws -> Void) throws {
        guard path.hasPrefix("/") else { throw StoreError(.invalidArgument, kind: "invalid_path", "path must be absolute, got \(path)") }
        let directory = (path as NSString).deletingLastPathComponent
        let parent = directory.isEmpty ? "/" : directory
        let name = (path as NSString).lastPathComponent, partial = name + ".partial"
        func failure(_ what: String, _ code: Int32) -> StoreError {
            StoreError(
                code == EEXIST ? .alreadyExists : .invalidArgument, kind: code == EEXIST ? "file_exists" : "invalid_path",
                "cannot create \(what): \(String(cString: strerror(code)))")
        }
        let dir = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dir >= 0 else { throw failure(path, errno) }
        defer { close(dir) }
        // Linking an unnamed file takes its /proc/self/fd name.
        var fd: Int32 = unnamedIfPossible && access("/proc/self/fd", F_OK) == 0 ? openat(dir, ".", O_WRONLY | O_CLOEXEC | unnamedFile, 0o600) : -1
        let unnamed = fd >= 0
        if !unnamed { fd = openat(dir, partial, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600) }
        guard fd >= 0 else { throw failure(path + ".partial", errno) }
        var closed = false
        defer { if !closed { close(fd) } }
        do {
            try body(fd)
            guard fsync(fd) == 0 else { throw ChunkStoreError.system("sync \(unnamed ? path : path + ".partial")", errno) }
            let linked = unnamed
                ? linkat(AT_FDCWD, "/proc/self/fd/\(fd)", dir, name, AT_SYMLINK_FOLLOW) : linkat(dir, partial, dir, name, 0)
            let code = errno
            closed = true
            close(fd)
            guard linked == 0 else { throw failure(path, code) }
            if !unnamed { unlinkat(dir, partial, 0) }
            // The new name is durable once its directory is synced.
            fsync(dir)
        } catch {
            if !unnamed { unlinkat(dir, partial, 0) }
            throw Blobs.storeError(error)
        }
    }

    /// Linux's `O_TMPFILE` (`__O_TMPFILE | O_DIRECTORY`, the same on x86-64 and ARM64), which Glibc's module does not export.
    static let unnamedFile: Int32 = 0o20_000_000 | O_DIRECTORY
}
