import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeStore
import BlazeWire
import Foundation
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Reading a folder: other writers' members and head files, then every segment from where this device stopped.
extension FolderWorker {
    /// The writer directories in the space's directory (32 hex digits, a node id), sorted. A listing that fails
    /// (a network share's hiccup) fails the round: taken for an empty folder, it would make this device write
    /// everything again.
    /// At most `FolderFiles.maxWriterDirectories`, the rest reported: in a space with a log, those of the devices it
    /// lists first (names chosen to sort first cannot hide a listed member), then the others (a device added by an
    /// operation only its own members file holds yet), each in name order; only directories count.
    func writerDirectories() throws -> [NodeID] {
        let log = space.snapshot.membership
        let named = try listing(spaceDir).compactMap { name in NodeID(hex: name).map { (name, $0) } }
        let ordered = named.map { (name: $0.0, node: $0.1, listed: log?.member($0.1.bytes) != nil) }
            .sorted { a, b in a.listed != b.listed ? a.listed : a.name < b.name }
        var out: [NodeID] = []
        for entry in ordered {
            // A link in place of a writer's directory is not followed: the daemon reads only inside the folder.
            var st = stat()
            guard lstat(spaceDir + "/" + entry.name, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR else { continue }
            guard out.count < FolderFiles.maxWriterDirectories else {
                overLimit("the space's directory holds more than \(FolderFiles.maxWriterDirectories) writer directories; the first are read")
                break
            }
            out.append(entry.node)
        }
        return out
    }

    /// Reports a folder over one of its limits (as an error of the link: what is past it is not read), counted once
    /// while it stays the link's last error.
    func overLimit(_ what: String) {
        report.update {
            guard $0.lastError != what else { return }
            $0.errors += 1
            $0.lastError = what
        }
    }

    /// The names in a directory.
    func listing(_ dir: String) throws -> [String] {
        do { return try FileManager.default.contentsOfDirectory(atPath: dir) } catch {
            throw FolderProblem("cannot list \(dir): \(error.localizedDescription)")
        }
    }

    /// The contents of other writers' files called `name` that changed since they were last read (at most
    /// `FolderFiles.maxSmallFile` each).
    func changedFiles(_ name: String) throws -> [[UInt8]] {
        var out: [[UInt8]] = []
        for writer in try writerDirectories() where writer != me {
            let file = spaceDir + "/" + writer.hex + "/" + name
            guard let stamp = FileStamp(path: file), stamps[file] != stamp else { continue }
            stamps[file] = stamp
            if stamp.size > FolderFiles.maxSmallFile {
                // Skipped, not silently: revocations in a members file past the limit would never arrive.
                report.update {
                    $0.errors += 1
                    $0.lastError = "the \(name) file of device \(writer.hex) holds \(stamp.size) bytes, over the \(FolderFiles.maxSmallFile) read"
                }
                continue
            }
            if let bytes = readWhole(file, beneath: root, limit: FolderFiles.maxSmallFile) { out.append(bytes) }
        }
        return out
    }

    /// Merges the membership operations other writers' members files hold.
    func readMembers() throws {
        guard space.snapshot.membership != nil else { return }
        for bytes in try changedFiles("members") {
            let ops: [MembershipOp]
            do {
                ops = try FolderFiles.decodeMembers(bytes, space: space.id).compactMap { try? MembershipOp(bytes: $0) }
            } catch {
                report.reject(error)
                continue
            }
            var aside = SetAsideOps()
            let fresh = try space.merge(ops, aside: &aside, storing: true)
            if !fresh.isEmpty { engine.persist(fresh, space: space) }
        }
    }

    /// Reads other writers' head files: a generation lower than one seen before is a rolled-back copy, reported and
    /// not followed; an own head signing another entry than the one held at its seq is fork evidence.
    func readHeads() throws {
        var devices: [String: Int] = [:]
        for writer in try writerDirectories() where writer != me {
            devices[writer.hex] = 1
            let file = spaceDir + "/" + writer.hex + "/head"
            guard let stamp = FileStamp(path: file), stamps[file] != stamp else { continue }
            stamps[file] = stamp
            guard let bytes = readWhole(file, beneath: root, limit: FolderFiles.maxSmallFile) else { continue }
            let head: FolderFiles.Head
            do { head = try FolderFiles.Head(bytes: bytes, space: space.id, writer: writer.bytes) } catch {
                report.reject(error)
                continue
            }
            let seen = headsSeen[writer] ?? 0
            if head.generation < seen {
                report.reject(.rollback)
                report.update {
                    $0.lastError = "the head file of device \(writer.hex) went back from generation \(seen) to \(head.generation) (an older copy)"
                }
                logger.warning(
                    "Folder head rolled back",
                    metadata: ["db": "\(db.name)", "writer": "\(writer.hex)", "seen": "\(seen)", "found": "\(head.generation)"])
                continue
            }
            if head.generation > seen {
                headsSeen[writer] = head.generation
                try? db.setFolderHeadSeen(root, writer: writer, generation: head.generation)
            }
            heads[writer] = head
            if let own = head.ownHead, let held = try? db.heldHash(origin: writer, seq: own.seq), held != own.hash {
                if (try? db.recordFork(head: own, seq: own.seq, hash: own.hash, key: space.snapshot.key)) == true {
                    report.reject(.fork)
                }
            }
        }
        report.update {
            if $0.connectionsByDevice != devices {
                $0.connectionsByDevice = devices
                $0.connections = devices.count
                if let last = devices.keys.sorted().last, $0.lastDevice == nil { $0.lastDevice = last }
            }
        }
    }

    /// Reads every writer's segments from where it stopped, storing what verifies; repeats while a pass stored
    /// something a waiting record needs (files can arrive in any order).
    func scan() throws {
        var present: Set<String> = []
        for _ in 0..<64 {
            var progress = false
            var waiting = false
            // In a space with a log, only the segments of devices it lists: anyone else's would be refused.
            let log = space.snapshot.membership
            for writer in try writerDirectories() where log == nil || log?.member(writer.bytes) != nil {
                let dir = spaceDir + "/" + writer.hex
                if writer != me { watch.watch(dir) }
                for name in try segmentFiles(dir) {
                    let key = writer.hex + "/" + name
                    present.insert(key)
                    let outcome = try read(file: dir + "/" + name, key: key, writer: writer)
                    progress = progress || outcome.stored
                    waiting = waiting || outcome.waiting
                }
            }
            if !(progress && waiting) || control.stopping.load(ordering: .acquiring) { break }
        }
        // Files that are gone no longer count for what the folder holds.
        for key in files.keys where !present.contains(key) { files[key] = nil }
    }

    /// The segment files of a directory: those named as writers name them first, in number order, then any other
    /// name (copies the folder tool renamed), skipping the head, members and acks files, the assets directory and
    /// temporary files; at most
    /// `FolderFiles.maxFilesPerDirectory` (the rest reported).
    func segmentFiles(_ dir: String) throws -> [String] {
        let names = try listing(dir)
        let candidates = names.filter {
            $0 != "head" && $0 != "members" && $0 != "acks" && $0 != "assets" && !$0.hasSuffix(".tmp") && !$0.hasPrefix(".")
        }
        if candidates.count > FolderFiles.maxFilesPerDirectory {
            overLimit("\(dir) holds \(candidates.count) files; the first \(FolderFiles.maxFilesPerDirectory) are read")
        }
        return Array(candidates.sorted(by: Self.segmentOrder).prefix(FolderFiles.maxFilesPerDirectory))
    }

    /// Writers' own segment names first, in number order, then other names in name order.
    static func segmentOrder(_ a: String, _ b: String) -> Bool {
        switch (FolderFiles.segmentNumber(a), FolderFiles.segmentNumber(b)) {
        case (let x?, let y?): return x < y
        case (.some, nil): return true
        case (nil, .some): return false
        case (nil, nil): return a < b
        }
    }

    /// Reads a segment file from where this device stopped in it.
    func read(file: String, key: String, writer: NodeID) throws -> (stored: Bool, waiting: Bool) {
        guard let stamp = FileStamp(path: file), stamp.regular else { return (false, false) }
        var cursor = files[key] ?? FileCursor()
        // Replaced (another inode) or shorter than what was read: a rolled-back or re-copied file is read afresh.
        if let old = cursor.stamp, old.inode != stamp.inode || old.device != stamp.device || stamp.size < cursor.offset {
            cursor = FileCursor()
        }
        defer { files[key] = cursor }
        guard cursor.usable else { return (false, false) }
        if cursor.stamp == stamp && !cursor.retry(held: held, keys: space.snapshot.key.entryKeyCount) {
            return (false, cursor.waiting)
        }
        cursor.stamp = stamp
        let fd = openForReading(file, beneath: root)
        guard fd >= 0 else { return (false, cursor.waiting) }
        defer { close(fd) }
        if cursor.offset == 0 {
            // A header not all there yet is a file being written or copied: read again later.
            guard let header = preadAll(fd, offset: 0, count: FolderFiles.segmentHeaderSize),
                header.count == FolderFiles.segmentHeaderSize
            else { return (false, false) }
            if let problem = FolderFiles.segmentHeaderProblem(header[...], space: space.id, writer: writer.bytes) {
                cursor.usable = false
                report.reject(problem)
                if problem == .incompatibleProtocol {
                    report.update {
                        $0.lastError = "a segment of device \(writer.hex) is of a newer folder format than \(FolderFiles.version): upgrade this device"
                    }
                }
                return (false, false)
            }
            cursor.offset = FolderFiles.segmentHeaderSize
        }
        var stored = false
        var blocked = false
        var position = cursor.offset
        reading: while !control.stopping.load(ordering: .acquiring),
            let bytes = preadRecord(fd, offset: position, available: stamp.size - position)
        {
            switch FolderFiles.scanRecord(bytes[...]) {
            case .incomplete:
                break reading
            case .damaged:
                // A torn append (its writer cuts it off when it restarts) or damage: nothing after it is trusted.
                if cursor.damagedAt != position {
                    cursor.damagedAt = position
                    report.update { $0.rejected["torn_record", default: 0] += 1 }
                }
                break reading
            case .record(let body, let size):
                switch try handle(record: Array(bytes[body]), offset: position, cursor: &cursor) {
                case .done(let added):
                    stored = stored || added
                    if !blocked {
                        cursor.offset = position + size
                        cursor.memo[position] = nil
                    }
                case .waiting:
                    blocked = true
                }
                position += size
            }
        }
        cursor.waiting = blocked
        return (stored, blocked)
    }

    /// The outcome of one record.
    enum RecordOutcome {
        /// Nothing more to do with it (stored, held already, or refused for good); `stored` when it added entries.
        case done(stored: Bool)
        /// It needs entries not held yet, or keys not received yet: read again later.
        case waiting
    }

    /// Verifies and stores one record (one batch ending at a signed head), or finds it held already, or waiting.
    func handle(record body: [UInt8], offset: Int, cursor: inout FileCursor) throws -> RecordOutcome {
        if let memo = cursor.memo[offset] {
            switch memo {
            case .done: return .done(stored: false)
            case .gap(let origin, let first) where first > (held[origin] ?? 0) + 1: return .waiting
            case .keys(let count) where space.snapshot.key.entryKeyCount <= count: return .waiting
            case .later(let after, _) where ContinuousClock.now < after: return .waiting
            default: break
            }
        }
        let batch: EntryBatch
        do {
            guard case .entries(let b) = try PeerMessage(decoding: body) else { throw SyncRejection.malformed }
            batch = b
        } catch {
            return refused(SyncRejection.malformed, offset: offset, cursor: &cursor)
        }
        let origin = batch.origin
        let first = batch.entries[0].header.seq
        let have = held[origin] ?? 0
        if batch.head.seq <= have, (try? db.heldHash(origin: origin, seq: batch.head.seq)) == batch.head.hash,
            (try? EntryChain.verifyLinks(batch.entries, head: batch.head, previousHash: nil, space: space.id)) != nil
        {
            // Held already, and these are exactly the entries held: they count for what the folder holds.
            cursor.cover(origin, first...batch.head.seq)
            cursor.memo[offset] = .done
            return .done(stored: false)
        }
        if first > have + 1 {
            cursor.memo[offset] = .gap(origin, first)
            return .waiting
        }
        let snapshot = space.snapshot
        do {
            let verified = try db.verify(batch: batch, key: snapshot.key, membership: snapshot.membership)
            let outcome = try db.store(verified)
            held[origin] = max(have, batch.head.seq)
            cursor.cover(origin, first...batch.head.seq)
            cursor.memo[offset] = .done
            report.update {
                $0.receivedEntries += outcome.stored
                $0.lastSyncMs = nowMs()
            }
            noteMissing(parked: outcome.report.parked > 0)
            return .done(stored: outcome.stored > 0)
        } catch let reason as SyncRejection {
            if reason == .unknownEpoch || reason == .badSeal, cursor.memo[offset] == nil {
                // Sealed with a key this device has not received yet (or damaged): counted once, read again when keys
                // arrive.
                report.reject(reason)
                cursor.memo[offset] = .keys(snapshot.key.entryKeyCount)
                return .waiting
            }
            if reason == .unknownEpoch || reason == .badSeal {
                cursor.memo[offset] = .keys(snapshot.key.entryKeyCount)
                return .waiting
            }
            if reason.mayClear {
                // Read again later (5 s, doubling up to 30 min); counted the first time.
                var tries = 0
                if case .later(_, let t)? = cursor.memo[offset] { tries = t } else { report.reject(reason) }
                let wait = min(Duration.seconds(1800), Duration.seconds(5) * (1 << min(tries, 20)))
                cursor.memo[offset] = .later(after: .now + wait, tries: tries + 1)
                return .waiting
            }
            if reason == .fork { _ = try? db.recordFork(batch: batch, key: snapshot.key) }
            return refused(reason, offset: offset, cursor: &cursor)
        }
    }

    /// Counts a refused record once and moves past it for good.
    func refused(_ reason: SyncRejection, offset: Int, cursor: inout FileCursor) -> RecordOutcome {
        report.reject(reason)
        report.update { $0.lastError = "rejected: \(reason.rawValue)" }
        logger.warning(
            "Folder sync refused a record",
            metadata: ["db": "\(db.name)", "folder": "\(root)", "reason": "\(reason.rawValue)"])
        cursor.memo[offset] = .done
        return .done(stored: false)
    }

    /// Re-reads what received changes depend on and this device lacks (`sync.status` `waiting`).
    func noteMissing(parked: Bool) {
        let book = report.book
        guard parked || book.hasMissing(db: db.name) else { return }
        guard let needed = try? db.missingDependencies(), let vector = try? db.versionVector() else { return }
        book.setMissing(db: db.name, needed: needed, held: vector, parkedBy: parked ? report.peer : nil)
    }

    /// For each origin, the highest seq up to which the folder holds every entry (in any writer's files) that some
    /// current member may still need: entries at or below `floor` are held by all of them.
    func coverage(floor: [NodeID: UInt64]) -> [NodeID: UInt64] {
        var ranges: [NodeID: [ClosedRange<UInt64>]] = [:]
        for cursor in files.values {
            for (origin, list) in cursor.ranges { ranges[origin, default: []] += list }
        }
        var out = floor
        for (origin, list) in ranges {
            var upTo: UInt64 = floor[origin] ?? 0
            for r in list.sorted(by: { $0.lowerBound < $1.lowerBound }) {
                guard r.lowerBound <= upTo + 1 else { break }
                upTo = max(upTo, r.upperBound)
            }
            out[origin] = upTo
        }
        return out
    }
}
