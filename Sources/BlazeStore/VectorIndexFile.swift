import BlazeVector
import Crypto
import Foundation

/// A vector index's matrix and graph kept in a file beside its database (`NAME.db.vx-HEX`: HEX is the first 16 bytes
/// of the SHA-256 of the index name, in hex; the header holds the whole digest), written when the database closes so that the next daemon searches with the graph at once instead of
/// building it again (about a minute of one core for 100,000 768-d rows).
///
/// Only a cache: never synced, never in backups, and used only when it is exactly what the database's rows say. It
/// names the build it was made from and its save (the build marker's seq in `vector_rows` and the 16 random bytes
/// that marker holds, renewed just before each save: a rebuild, a restore or a snapshot install makes a new marker,
/// and a copy of the database from before the save holds other bytes) and the last row seq it covers; the rows after
/// that are caught up from the table as usual. A file of another index, build or save, of a seq the table has not
/// reached, not a regular file, truncated, of the wrong size for the counts it announces, with a wrong SHA-256, of
/// other graph parameters than the daemon builds with, or with any part that `VectorIndexImage.restore()` refuses is
/// removed and the index is built from its rows instead.
///
/// Layout (little-endian; the arrays are written as the machine holds them, so files are kept only on little-endian
/// machines): the header (`headerSize` bytes: magic, format, the index name's SHA-256, build, nonce, seen,
/// dimensions, metric, m, efConstruction, the five array counts, entry, top layer), the arrays (ids, components,
/// layer-0 counts and links, upper nodes, counts and links), then the SHA-256 of everything before it.
enum VectorIndexFile {
    static let magic = Array("BLZVXG01".utf8)
    static let format: UInt32 = 1
    static let headerSize = 8 + 4 + 32 + 8 + 16 + 8 + 4 + 1 + 1 + 4 + 5 * 8 + 4 + 4
    /// Whether this machine keeps files (little-endian: the arrays are written as held).
    static let supported = UInt32(1).littleEndian == 1

    /// What a file must match to be used: the index's build marker (its seq and bytes) and, at most, the last row seq.
    struct Stamp: Equatable {
        var build: Int64
        var nonce: [UInt8]
        var seen: Int64
    }

    /// The SHA-256 of an index name, which its file's header holds.
    static func digest(of index: String) -> [UInt8] { Array(SHA256.hash(data: Array(index.utf8))) }

    /// The file of index `index` of the database at `database` (a fixed length whatever the name's).
    static func path(database: String, index: String) -> String {
        database + ".vx-" + digest(of: index).prefix(16).map { String(format: "%02x", $0) }.joined()
    }

    /// Whether `name` (a file name in the databases' directory) is one of database file `file`'s index files, or a
    /// temporary one: exactly 32 lowercase hex digits after `.vx-`, so no other database's file (whose names end in
    /// `.db`) ever matches.
    static func belongs(_ name: String, to file: String) -> Bool {
        guard name.hasPrefix(file + ".vx-") else { return false }
        var rest = name.utf8.dropFirst(file.utf8.count + 4)
        if rest.count == 36, rest.suffix(4).elementsEqual(".tmp".utf8) { rest = rest.dropLast(4) }
        return rest.count == 32 && rest.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }

    /// Writes `image` of index `index` covering rows up to `stamp.seen` to `path` (through a temporary file renamed
    /// into place, so a crash leaves the old file or none, and at worst a temporary one the next save removes).
    static func save(_ image: VectorIndexImage, index: String, stamp: Stamp, to path: String) throws {
        precondition(stamp.nonce.count == 16)
        guard supported else { return }
        let temporary = path + ".tmp"
        unlink(temporary)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
        var sink = Sink(fd: fd)
        do {
            var header: [UInt8] = magic
            header.reserveCapacity(headerSize)
            func put<T: FixedWidthInteger>(_ value: T) { withUnsafeBytes(of: value.littleEndian) { header.append(contentsOf: $0) } }
            put(format)
            header.append(contentsOf: digest(of: index))
            put(stamp.build)
            header.append(contentsOf: stamp.nonce)
            put(stamp.seen)
            put(UInt32(image.dimensions))
            put(UInt8(VectorMetric.allCases.firstIndex(of: image.metric)!))
            put(UInt8(image.parameters.m))
            put(UInt32(image.parameters.efConstruction))
            for count in [image.ids.count, image.count0.count, image.upperNodes.count, image.upperCounts.count, image.upperLinks.count] {
                put(UInt64(count))
            }
            put(image.entry)
            put(UInt32(image.topLayer))
            assert(header.count == headerSize)
            try sink.write(header)
            try sink.write(image.ids)
            try sink.write(image.values)
            try sink.write(image.count0)
            try sink.write(image.links0)
            try sink.write(image.upperNodes)
            try sink.write(image.upperCounts)
            try sink.write(image.upperLinks)
            try sink.finish()
        } catch {
            close(fd)
            unlink(temporary)
            throw error
        }
        close(fd)
        guard rename(temporary, path) == 0 else {
            let code = errno
            unlink(temporary)
            throw POSIXError(POSIXErrorCode(rawValue: code) ?? .EIO)
        }
    }

    /// The image of index `index` in `path` and the last row seq it covers, if it matches `build` and `nonce` and
    /// covers no row after `maxSeen`; nil when there is no such file. An unusable file is removed (`reason` says why).
    static func load(
        _ path: String, index: String, build: Int64, nonce: [UInt8], maxSeen: Int64, reason: ((String) -> Void)? = nil
    ) -> (VectorIndexImage, seen: Int64)? {
        guard supported else { return nil }
        // Not blocking: a FIFO put in its place must not hold the search (and the database's other searches) forever.
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
        guard fd >= 0 else {
            if errno == ELOOP { unlink(path) }
            return nil
        }
        defer { close(fd) }
        do {
            return try read(fd, index: index, build: build, nonce: nonce, maxSeen: maxSeen)
        } catch {
            reason?("\(error)")
            unlink(path)
            return nil
        }
    }

    private static func read(_ fd: Int32, index: String, build: Int64, nonce: [UInt8], maxSeen: Int64) throws -> (VectorIndexImage, seen: Int64) {
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG else { throw VectorFileError("not a regular file") }
        let size = Int(st.st_size)
        guard size >= headerSize + 32 else { throw VectorFileError("\(size) bytes: shorter than a header") }
        var source = Source(fd: fd)
        let header: [UInt8] = try source.read(count: headerSize)
        var at = 0
        func take<T: FixedWidthInteger>(_: T.Type) -> T {
            defer { at += MemoryLayout<T>.size }
            return header.withUnsafeBytes { T(littleEndian: $0.loadUnaligned(fromByteOffset: at, as: T.self)) }
        }
        guard Array(header[0..<8]) == magic else { throw VectorFileError("not an index file") }
        at = 8
        guard take(UInt32.self) == format else { throw VectorFileError("another format") }
        guard Array(header[at..<at + 32]) == digest(of: index) else { throw VectorFileError("made for another index") }
        at += 32
        let fileBuild = take(Int64.self)
        let fileNonce = Array(header[at..<at + 16])
        at += 16
        let seen = take(Int64.self)
        guard fileBuild == build, fileNonce == nonce else { throw VectorFileError("made for another build of the index") }
        guard seen >= build, seen <= maxSeen else { throw VectorFileError("covers rows up to \(seen); the table holds up to \(maxSeen)") }
        let dimensions = Int(take(UInt32.self))
        let metricIndex = Int(take(UInt8.self))
        let m = Int(take(UInt8.self))
        let efConstruction = Int(take(UInt32.self))
        let counts = (0..<5).map { _ in take(UInt64.self) }
        let entry = take(Int32.self)
        let topLayer = Int(take(UInt32.self))
        guard dimensions >= 1, dimensions <= VectorValue.maxDimensions, metricIndex < VectorMetric.allCases.count else {
            throw VectorFileError("header out of range")
        }
        // Only the parameters the daemon builds with: others would change every later insertion's cost and recall.
        guard HNSWGraph.Parameters(m: m, efConstruction: efConstruction) == HNSWGraph.Parameters() else {
            throw VectorFileError("graph parameters m \(m), efConstruction \(efConstruction)")
        }
        // Every count checked against the file's size before anything is allocated for it.
        guard counts.allSatisfy({ $0 <= UInt64(size) }) else { throw VectorFileError("counts larger than the file") }
        let (slots, nodes, upperNodes, upperCounts, upperLinks) = (Int(counts[0]), Int(counts[1]), Int(counts[2]), Int(counts[3]), Int(counts[4]))
        let parts = [
            (slots, 8), (slots, 4 * dimensions), (nodes, 1), (nodes, 4 * 2 * m), (upperNodes, 4), (upperCounts, 1), (upperLinks, 4),
        ]
        var expected = headerSize + 32
        for (count, width) in parts {
            let (bytes, o1) = count.multipliedReportingOverflow(by: width)
            let (sum, o2) = expected.addingReportingOverflow(bytes)
            guard !o1, !o2 else { throw VectorFileError("counts overflow") }
            expected = sum
        }
        guard expected == size else { throw VectorFileError("\(size) bytes where its counts make \(expected)") }
        let ids: [Int64] = try source.read(count: slots)
        let values: [Float] = try source.read(count: slots * dimensions)
        let count0: [UInt8] = try source.read(count: nodes)
        let links0: [Int32] = try source.read(count: nodes * 2 * m)
        let upperNodeList: [Int32] = try source.read(count: upperNodes)
        let upperCountList: [UInt8] = try source.read(count: upperCounts)
        let upperLinkList: [Int32] = try source.read(count: upperLinks)
        let digest = Array(source.hasher.finalize())
        let stored: [UInt8] = try source.read(count: 32)
        guard digest == stored else { throw VectorFileError("its SHA-256 does not match") }
        let image = VectorIndexImage(
            dimensions: dimensions, metric: VectorMetric.allCases[metricIndex],
            parameters: HNSWGraph.Parameters(m: m, efConstruction: efConstruction), ids: ids, values: values,
            count0: count0, links0: links0, upperNodes: upperNodeList, upperCounts: upperCountList, upperLinks: upperLinkList,
            entry: entry, topLayer: topLayer)
        return (image, seen)
    }

    /// Writes to a file descriptor, hashing what it writes; `finish` appends the hash.
    private struct Sink {
        let fd: Int32
        var hasher = SHA256()

        mutating func write<T>(_ array: [T]) throws {
            try array.withUnsafeBytes { bytes in
                hasher.update(bufferPointer: bytes)
                var at = 0
                while at < bytes.count {
                    let n = Glibc.write(fd, bytes.baseAddress! + at, min(bytes.count - at, 1 << 24))
                    if n < 0 && errno == EINTR { continue }
                    guard n > 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
                    at += n
                }
            }
        }

        mutating func finish() throws {
            let digest = Array(hasher.finalize())
            var copy = self
            copy.hasher = SHA256()
            try copy.write(digest)
        }
    }

    /// Reads from a file descriptor into arrays of exactly the size asked, hashing what it read.
    private struct Source {
        let fd: Int32
        var hasher = SHA256()

        mutating func read<T>(count: Int) throws -> [T] {
            try [T](unsafeUninitializedCapacity: count) { buffer, initialized in
                let bytes = UnsafeMutableRawBufferPointer(buffer)
                var at = 0
                while at < bytes.count {
                    let n = Glibc.read(fd, bytes.baseAddress! + at, min(bytes.count - at, 1 << 24))
                    if n < 0 && errno == EINTR { continue }
                    guard n > 0 else { throw VectorFileError("ends early") }
                    at += n
                }
                hasher.update(bufferPointer: UnsafeRawBufferPointer(bytes))
                initialized = count
            }
        }
    }
}

/// Why a vector index file was not used.
struct VectorFileError: Error, CustomStringConvertible {
    let description: String

    init(_ description: String) { self.description = description }
}
