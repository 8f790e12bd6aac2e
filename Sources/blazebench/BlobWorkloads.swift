import BlazeBlob
import BlazeProtocol
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// BLOB: putting a file into a chunk store and reading it back, against `cp` of the same file on the same disk.
enum BlobWorkloads {
    /// Runs the group on a file of `megabytes` MiB of random bytes, `repeats` times; each repeat's ratio is taken
    /// against the `cp` run just before it.
    static func run(dir: String, megabytes: Int, repeats: Int) throws -> [Result] {
        let work = dir + "/blob"
        try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: work) }
        let source = work + "/source"
        try writeRandomFile(source, bytes: megabytes << 20)
        let keys = try BlobKeys(space: SpaceID(bytes: [UInt8](repeating: 1, count: 16))!, genesis: (0..<32).map { _ in UInt8.random(in: 0...255) })
        let mib = Double(megabytes)

        var cpPut: [Double] = [], cpGet: [Double] = [], put: [Double] = [], putAgain: [Double] = [], get: [Double] = []
        var chunkCount = 0
        for r in 0..<repeats {
            // Durable copies on both sides: `cp` then an fsync of the copy, as a put syncs every chunk.
            let copy = work + "/copy-\(r)"
            cpPut.append(mib / (try seconds { try shell("cp '\(source)' '\(copy)' && sync '\(copy)'") }))
            let store = try ChunkStore(directory: work + "/chunks-\(r)")
            var blob: (id: ChunkID, manifest: BlobManifest, storedBytes: Int)?
            put.append(mib / (try seconds { blob = try putFile(source, keys: keys, store: store) }))
            putAgain.append(mib / (try seconds { _ = try putFile(source, keys: keys, store: store) }))
            guard let blob, blob.storedBytes == megabytes << 20 else { throw BenchFailure("BLOB: the put stored \(blob?.storedBytes ?? 0) bytes") }
            chunkCount = blob.manifest.pieces.count
            // Reads from the page cache on both sides (the file and the chunks were just written), into a new file.
            let out = work + "/out-\(r)"
            cpGet.append(mib / (try seconds { try shell("cp '\(copy)' '\(out)-cp'") }))
            get.append(mib / (try seconds { try getFile(blob.manifest, to: out, keys: keys, store: store) }))
            guard FileManager.default.contentsEqual(atPath: out, andPath: source) else { throw BenchFailure("BLOB: the blob read back differs") }
            // The chunk stores stay until the group ends: on ext4 without a journal (this machine's disk), a new inode is
            // not taken from those freed in the last minute, so removing one repeat's 400 chunk files right before the
            // next put would make every file it creates skip past them (measured: a third of the put's time).
            for path in [copy, out, out + "-cp"] { unlink(path) }
        }
        // Where a put's time goes, in memory: cutting alone, and naming (HMAC-SHA256) alone, over 64 MiB.
        let sample = [UInt8](try Data(contentsOf: URL(fileURLWithPath: source)).prefix(64 << 20))
        let sampleMiB = Double(sample.count) / Double(1 << 20)
        var cutting: [Double] = [], naming: [Double] = []
        for _ in 0..<repeats {
            cutting.append(sampleMiB / seconds { _ = keys.chunker.cuts(of: sample) })
            naming.append(sampleMiB / seconds { _ = keys.id(of: sample) })
        }
        func paired(_ mine: [Double], _ theirs: [Double]) -> [Double] { zip(mine, theirs).map { $0 / $1 } }
        var rows = [
            Result(name: "B0.cpDurable", unit: "MiB/s", samples: cpPut, better: "higher", note: "cp of a \(megabytes) MiB file, then sync of the copy"),
            Result(name: "B0.cpCached", unit: "MiB/s", samples: cpGet, better: "higher", note: "cp of the same file from the page cache"),
            Result(
                name: "B1.put", unit: "MiB/s", samples: put, better: "higher", baseline: "B0.cpDurable", target: "≥ 0.5× cp",
                note: "\(chunkCount) chunks: chunked, named (HMAC-SHA256) and each synced to its own file"),
            Result(
                name: "B1.putAgain", unit: "MiB/s", samples: putAgain, better: "higher", baseline: "B0.cpDurable",
                note: "the same file again: every chunk held already, nothing written"),
            Result(
                name: "B2.get", unit: "MiB/s", samples: get, better: "higher", baseline: "B0.cpCached", target: "≥ 0.5× cp",
                note: "the blob read chunk by chunk into a new file"),
        ]
        rows.append(Result(name: "B3.cutOnly", unit: "MiB/s", samples: cutting, better: "higher", note: "content-defined cuts of 64 MiB in memory"))
        rows.append(Result(name: "B3.nameOnly", unit: "MiB/s", samples: naming, better: "higher", note: "HMAC-SHA256 of 64 MiB in memory"))
        rows[2].paired["B0.cpDurable"] = paired(put, cpPut)
        rows[3].paired["B0.cpDurable"] = paired(putAgain, cpPut)
        rows[4].paired["B0.cpCached"] = paired(get, cpGet)
        return rows
    }

    /// Puts the file at `path` as one blob.
    static func putFile(_ path: String, keys: BlobKeys, store: ChunkStore) throws -> (id: ChunkID, manifest: BlobManifest, storedBytes: Int) {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw BenchFailure("BLOB: cannot open \(path)") }
        defer { close(fd) }
        var writer = BlobWriter(keys: keys, store: store, maxSize: 1 << 40)
        try writer.append(reading: fd)
        return try writer.finish()
    }

    /// Writes the blob of `manifest` to a new file at `path`.
    static func getFile(_ manifest: BlobManifest, to path: String, keys: BlobKeys, store: ChunkStore) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw BenchFailure("BLOB: cannot create \(path)") }
        defer { close(fd) }
        try BlobReader(store: store, maxSize: 1 << 40, chunkMaximum: keys.chunker.sizes.maximum).copy(manifest, to: fd)
    }

    /// Writes `bytes` random bytes to a new file at `path`, 1 MiB at a time (the last block shorter).
    static func writeRandomFile(_ path: String, bytes: Int) throws {
        guard FileManager.default.createFile(atPath: path, contents: nil), let handle = FileHandle(forWritingAtPath: path) else {
            throw BenchFailure("BLOB: cannot create \(path)")
        }
        defer { try? handle.close() }
        // SplitMix64 from a random seed: random enough for chunk cuts and no two files alike, without a system call
        // per word (the system generator made writing the bench's files slower than the work measured).
        var state = UInt64.random(in: 0...UInt64.max)
        var left = bytes
        var block = [UInt64](repeating: 0, count: (1 << 20) / 8)
        while left > 0 {
            for i in block.indices {
                state &+= 0x9E37_79B9_7F4A_7C15
                var z = state
                z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
                z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
                block[i] = z ^ (z >> 31)
            }
            let n = min(left, 1 << 20)
            try handle.write(contentsOf: block.withUnsafeBytes { Data($0.prefix(n)) })
            left -= n
        }
    }

    /// Runs `command` with `/bin/sh -c`; throws when it fails.
    static func shell(_ command: String) throws {
        // posix_spawn and waitpid, not `Process`: its wait missed the exit of a short-lived shell started while an
        // sshd child ran (the shell stayed a zombie and the bench hung).
        var pid: pid_t = 0
        let words: [String] = ["/bin/sh", "-c", command]
        let argv: [UnsafeMutablePointer<CChar>?] = words.map { strdup($0) } + [nil]
        defer { for arg in argv { free(arg) } }
        // The shell starts with no signal blocked and every signal at its default action, whatever this process has.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t(), all = sigset_t()
        sigemptyset(&none)
        sigfillset(&all)
        posix_spawnattr_setsigmask(&attributes, &none)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        guard posix_spawn(&pid, "/bin/sh", nil, &attributes, argv, environ) == 0 else { throw BenchFailure("BLOB: cannot run `\(command)`") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 {
            guard errno == EINTR else { throw BenchFailure("BLOB: lost `\(command)`") }
        }
        // Exited normally with status 0.
        guard status & 0x7f == 0, (status >> 8) & 0xff == 0 else { throw BenchFailure("BLOB: `\(command)` failed") }
    }
}
