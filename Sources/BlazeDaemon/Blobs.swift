import BlazeBlob
import BlazeProtocol
import BlazeStore
import BlazeSync
import Foundation
import NIOPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// The daemon's blobs: each database's chunk store, in `<name>.blobs` beside its file, and the in-band uploads in
/// progress (ARCHITECTURE.md, "Blobs").
final class Blobs: Sendable {
    /// Most decoded bytes one `blob.append` carries.
    static let maxAppendBytes = 4 << 20
    /// Most bytes one `blob.read` returns.
    static let maxReadBytes = 4 << 20
    /// Uploads one connection may have open at once.
    static let maxUploadsPerConnection = 4
    /// Uploads open at once over all connections (each holds up to a window of four chunks, 16 MiB, in memory once
    /// it has received bytes, and while an append's chunks are being stored up to 16 MiB more on its lanes' threads,
    /// which end when it waits for its client: `ChunkLanes`).
    static let maxUploads = 64
    /// Longest media type accepted.
    static let maxTypeLength = 255
    /// The media type of a blob put without one.
    static let defaultType = "application/octet-stream"

    /// The largest blob accepted, in bytes.
    let maxBlobBytes: Int
    /// Whether a connection is still open (an upload is only started for an open one).
    private let isOpen: @Sendable (Int) -> Bool
    /// Every database's chunk store (the sync engine's: sessions serve and fetch chunks from the same stores).
    let stores: ChunkStores
    /// The I/O pool, where reads that waited for chunks run.
    let pool: NIOThreadPool
    /// Where fetch progress goes (subscriptions with `blobs: true`).
    let events = BlobEvents()
    /// Uploads in progress by id.
    let uploads = Mutex<[String: Upload]>([:])
    /// The number of the next upload id.
    private let nextUpload = Atomic<Int>(1)

    /// One upload: the connection and database it belongs to, its media type, and its writer (nil once finished).
    final class Upload: Sendable {
        let connection: Int
        let db: String
        let type: String
        let writer: Mutex<BlobWriter?>

        init(connection: Int, db: String, type: String, writer: BlobWriter) {
            self.connection = connection
            self.db = db
            self.type = type
            self.writer = Mutex(writer)
        }
    }

    /// What a put returns.
    struct Put {
        let id: ChunkID
        let size: Int
        let type: String
        let chunks: Int
        let storedBytes: Int
    }

    /// Blobs of at most `maxBlobBytes` bytes kept in `stores`, read on `pool`; `isOpen` tells whether a connection id
    /// is still open.
    init(maxBlobBytes: Int, stores: ChunkStores, pool: NIOThreadPool, isOpen: @escaping @Sendable (Int) -> Bool) {
        self.maxBlobBytes = maxBlobBytes
        self.stores = stores
        self.pool = pool
        self.isOpen = isOpen
    }

    /// The chunk store of `db`, opened (and created) on first use.
    func store(for db: BlazeDatabase) throws -> ChunkStore { try stores.store(for: db) }

    /// Ends the uploads of connection `connection` (it closed).
    func dropUploads(connection: Int) {
        uploads.withLock { $0 = $0.filter { $0.value.connection != connection } }
    }

    /// Forgets database `name` and removes its chunks (it was dropped).
    func forget(db name: String, directory: String) {
        stores.forget(db: name, directory: directory)
        uploads.withLock { $0 = $0.filter { $0.value.db != name } }
    }

    /// A media type checked: printable ASCII, at most `maxTypeLength` characters; the default when nil.
    static func checkedType(_ type: String?) throws -> String {
        guard let type else { return defaultType }
        guard !type.isEmpty, type.utf8.count <= maxTypeLength, type.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            throw StoreError(
                .invalidArgument, kind: "invalid_type",
                "a blob's type is 1 to \(maxTypeLength) printable ASCII characters without spaces (e.g. image/jpeg)")
        }
        return type
    }

    /// Puts the regular file at `path` as a blob of `db` named with `keys`.
    func put(db: BlazeDatabase, keys: BlobKeys, path: String, type: String?) throws -> Put {
        let type = try Self.checkedType(type)
        guard path.hasPrefix("/") else { throw StoreError(.invalidArgument, kind: "invalid_path", "path must be absolute, got \(path)") }
        // Non-blocking and not following a final symbolic link: a FIFO must not hang the daemon, and the file is the
        // one named. A device or a directory is refused by its type before any read.
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
        guard fd >= 0 else {
            let code = errno
            let reason = code == ELOOP ? "it is a symbolic link" : String(cString: strerror(code))
            throw StoreError(code == ENOENT ? .notFound : .invalidArgument, kind: code == ENOENT ? "file_not_found" : "invalid_path",
                "cannot read \(path): \(reason)")
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG else {
            throw StoreError(.invalidArgument, kind: "invalid_path", "\(path) is not a regular file")
        }
        guard Int(info.st_size) <= maxBlobBytes else {
            throw StoreError(.limitExceeded, kind: "blob_too_large", "\(path) is \(info.st_size) bytes, over the \(maxBlobBytes)-byte blob limit")
        }
        var writer = BlobWriter(keys: keys, store: try store(for: db), maxSize: maxBlobBytes)
        do {
            try writer.append(reading: fd)
            let done = try writer.finish()
            return Put(id: done.id, size: done.manifest.size, type: type, chunks: done.manifest.pieces.count, storedBytes: done.storedBytes)
        } catch {
            throw Self.storeError(error)
        }
    }

    /// Starts an upload to `db` for connection `connection`; returns its id.
    func startUpload(db: BlazeDatabase, keys: BlobKeys, connection: Int, type: String?) throws -> String {
        let type = try Self.checkedType(type)
        let writer = BlobWriter(keys: keys, store: try store(for: db), maxSize: maxBlobBytes)
        let id = "u\(nextUpload.add(1, ordering: .relaxed).oldValue)"
        let upload = Upload(connection: connection, db: db.name, type: type, writer: writer)
        try uploads.withLock { uploads in
            // Uploads of connections that closed are dropped when they close; this catches a close that raced
            // this start.
            uploads = uploads.filter { isOpen($0.value.connection) }
            guard uploads.values.filter({ $0.connection == connection }).count < Self.maxUploadsPerConnection else {
                throw StoreError(.limitExceeded, kind: "too_many_uploads", "a connection may have \(Self.maxUploadsPerConnection) uploads open at once: finish one first")
            }
            guard uploads.count < Self.maxUploads else {
                throw StoreError(.limitExceeded, kind: "too_many_uploads", "\(Self.maxUploads) uploads are open in this daemon: retry later")
            }
            uploads[id] = upload
        }
        return id
    }

    /// The upload `id` of connection `connection` to database `db`, or `upload_not_found`.
    private func upload(_ id: String, db: String, connection: Int) throws -> Upload {
        guard let upload = uploads.withLock({ $0[id] }), upload.connection == connection, upload.db == db else {
            throw StoreError(.notFound, kind: "upload_not_found", "no upload \(id) of database \(db) on this connection")
        }
        return upload
    }

    /// Appends base64 `data` to upload `id`; returns the bytes appended so far.
    func append(upload id: String, db: String, connection: Int, data: String) throws -> Int {
        let upload = try upload(id, db: db, connection: connection)
        // The text is checked against the limit before decoding: 4 characters per 3 bytes.
        guard data.utf8.count <= (Self.maxAppendBytes + 2) / 3 * 4 else {
            throw StoreError(.limitExceeded, kind: "too_large", "blob.append carries at most \(Self.maxAppendBytes) bytes")
        }
        guard let bytes = Data(base64Encoded: data) else {
            throw StoreError(.invalidArgument, kind: "invalid_data", "data must be base64 (RFC 4648, with padding)")
        }
        do {
            return try upload.writer.withLock { writer in
                guard writer != nil else { throw StoreError(.notFound, kind: "upload_not_found", "upload \(id) is finished") }
                do {
                    try writer!.append([UInt8](bytes))
                } catch {
                    throw Self.storeError(error)
                }
                return writer!.size
            }
        } catch {
            // A failed append ends the upload (the writer refuses everything after a failure): start again.
            uploads.withLock { $0[id] = nil }
            throw error
        }
    }

    /// Ends upload `id` without a blob (the chunks it stored stay: other blobs may share them).
    func abort(upload id: String, db: String, connection: Int) throws {
        _ = try upload(id, db: db, connection: connection)
        uploads.withLock { $0[id] = nil }
    }

    /// Finishes upload `id`: stores its last chunk and manifest.
    func finish(upload id: String, db: String, connection: Int) throws -> Put {
        let upload = try upload(id, db: db, connection: connection)
        defer { uploads.withLock { $0[id] = nil } }
        return try upload.writer.withLock { writer in
            guard var taken = writer.take() else { throw StoreError(.notFound, kind: "upload_not_found", "upload \(id) is finished") }
            do {
                let done = try taken.finish()
                return Put(id: done.id, size: done.manifest.size, type: upload.type, chunks: done.manifest.pieces.count, storedBytes: done.storedBytes)
            } catch {
                throw Self.storeError(error)
            }
        }
    }

    /// A chunk store failure as a store error: a full disk says so.
    static func storeError(_ error: any Error) -> StoreError { ChunkStores.storeError(error) }
}
