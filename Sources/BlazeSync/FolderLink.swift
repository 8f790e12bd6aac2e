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

/// How folder links read and write (SYNC.md §10).
public struct FolderOptions: Sendable, Equatable {
    /// Milliseconds between scans of the folder when nothing announced a change: the only pace without inotify, and
    /// the safety net with it (inotify does not see what other machines write on a network share).
    public var pollIntervalMs: Int
    /// Watch the folder with inotify where the system offers it.
    public var inotify: Bool
    /// Bytes after which a segment file is finished and the next one started.
    public var segmentBytes: Int

    /// Options with the defaults: inotify, a 2 s poll, 4 MiB segments.
    public init(pollIntervalMs: Int = 2000, inotify: Bool = true, segmentBytes: Int = 4 << 20) {
        self.pollIntervalMs = pollIntervalMs
        self.inotify = inotify
        self.segmentBytes = segmentBytes
    }
}

/// Syncs one database through one shared folder: a thread that appends this device's view of what the folder lacks
/// to its own directory and reads every other device's directory (SYNC.md §10). Stopped with `stop()`.
final class FolderLink: Sendable {
    /// The folder (absolute path).
    let path: String
    private let signal: WakeSignal
    private let control = FolderControl()

    /// Starts the link's thread; nil when no wake-up pipe can be made.
    init?(engine: SyncEngine, space: SharedSpace, path: String, options: FolderOptions) {
        guard let signal = WakeSignal() else { return nil }
        self.path = path
        self.signal = signal
        let control = self.control
        let thread = Thread {
            let worker = FolderWorker(
                engine: engine, space: space, root: path, options: options, signal: signal, control: control)
            worker.run()
            control.finished.signal()
        }
        thread.name = "blazed-folder"
        thread.stackSize = 4 << 20
        thread.start()
    }

    /// Makes the link publish and scan now.
    func wake() { signal.wake() }

    /// Stops the link and waits (up to 10 s) for its thread to finish the step it is in.
    func stop() {
        control.stopping.store(true, ordering: .releasing)
        signal.wake()
        _ = control.finished.wait(timeout: .now() + 10)
    }
}

/// What a folder link and its thread share: the stop flag, and the signal that the thread is done.
final class FolderControl: Sendable {
    let stopping = Atomic<Bool>(false)
    let finished = DispatchSemaphore(value: 0)
}

/// What a folder link's thread keeps: where it stopped reading each file, what the folder holds, and this device's
/// own segment. Touched by that thread only.
final class FolderWorker {
    let engine: SyncEngine
    let space: SharedSpace
    let db: BlazeDatabase
    let root: String
    let spaceDir: String
    let ownDir: String
    let me: NodeID
    let options: FolderOptions
    let watch: FolderWatch
    let control: FolderControl
    let report: LinkReport
    let logger: Logger

    /// Reading position and findings per file, by `writer/name`.
    var files: [String: FileCursor] = [:]
    /// Highest generation seen of each writer's head file.
    var headsSeen: [NodeID: UInt64] = [:]
    /// The latest head file accepted from each other writer.
    var heads: [NodeID: FolderFiles.Head] = [:]
    /// Stamp of each writer's head and members file when last read.
    var stamps: [String: FileStamp] = [:]
    /// What this device holds, per origin (kept current while storing).
    var held: [NodeID: UInt64] = [:]
    /// This device's head file generation.
    var generation: UInt64 = 0
    /// The segment this device appends to.
    var segment: OwnSegment?
    /// This device's directory, opened without following links for the round in progress (-1 between rounds):
    /// everything it writes or removes goes through this descriptor, so swapping a link in for the directory's path
    /// cannot send a write anywhere else.
    var ownFD: Int32 = -1
    /// What this device held when it last wrote its head file, and when (uptime ms).
    var headHeld: [NodeID: UInt64] = [:]
    var headWrittenAt: UInt64 = 0
    /// Membership operations written to this device's members file.
    var membersWritten = -1
    /// Whether the last step failed, and how (counted once per distinct failure).
    var lastFailure: String?

    init(
        engine: SyncEngine, space: SharedSpace, root: String, options: FolderOptions, signal: WakeSignal,
        control: FolderControl
    ) {
        self.engine = engine
        self.space = space
        self.db = space.db
        self.root = root
        self.options = options
        self.control = control
        me = NodeID(bytes: engine.identity.nodeID)
        spaceDir = root + "/" + hexString(space.id)
        ownDir = spaceDir + "/" + me.hex
        watch = FolderWatch(signal: signal, useInotify: options.inotify)
        report = LinkReport(book: engine.status, peer: "folder:" + root, direction: .folder, db: space.db.name)
        logger = engine.logger
    }

    /// Publishes and reads until stopped: at once, then whenever woken, a watched directory changes or the poll
    /// interval passes.
    func run() {
        // A new link (after a pause, a restart) starts with a clean slate; what is still wrong shows again.
        report.update { $0.lastError = nil }
        var feedToken: Int?
        let signal = watch.signal
        while feedToken == nil && !control.stopping.load(ordering: .acquiring) {
            switch db.feed.attach(after: db.feed.lastSequence, { _ in signal.wake() }) {
            case .attached(let token): feedToken = token
            case .behind: continue
            case .ended: return
            }
        }
        let registration = engine.register(db: db.name) { signal.wake() }
        defer {
            if let feedToken { db.feed.detach(feedToken) }
            engine.unregister(registration)
            segment?.close()
            report.update { $0.connectionsByDevice = [:]; $0.connections = 0 }
        }
        do {
            headsSeen = try db.folderHeadsSeen(root)
            generation = try db.folderGeneration(root)
        } catch {
            fail("cannot read the folder's state: \(error)")
        }
        // This device's own head file: an older generation than recorded was handed back by the folder tool (the
        // next one written replaces it); a newer one means this database is older than the folder (restored).
        if let bytes = readWhole(ownDir + "/head", limit: 4096),
            let head = try? FolderFiles.Head(bytes: bytes, space: space.id, writer: me.bytes)
        {
            if head.generation < generation {
                report.reject(.rollback)
                report.update {
                    $0.lastError = "this device's head file went back from generation \(self.generation) to \(head.generation) (an older copy)"
                }
            }
            generation = max(generation, head.generation)
        }
        while !control.stopping.load(ordering: .acquiring) {
            step()
            watch.wait(milliseconds: options.pollIntervalMs)
        }
    }

    /// One round: read what others wrote, then write what the folder lacks.
    func step() {
        do {
            guard isDirectory(root) else {
                throw FolderProblem("the folder \(root) is missing (an unmounted drive?); retrying every \(options.pollIntervalMs) ms")
            }
            ownFD = try openOwnDirectory()
            defer {
                close(ownFD)
                ownFD = -1
            }
            watch.watch(spaceDir)
            held = try db.syncVector()
            try readMembers()
            try readHeads()
            try scan()
            try publish()
            if lastFailure != nil {
                lastFailure = nil
                report.update { $0.lastError = nil }
            }
        } catch {
            fail("\(error)")
        }
    }

    /// Opens (creating them if needed) `<space>/<device>` inside the folder, refusing a symbolic link at either
    /// level: the folder itself may be a link (~/Dropbox to a mount), nothing inside it.
    func openOwnDirectory() throws -> Int32 {
        let rootFD = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard rootFD >= 0 else { throw FolderProblem("cannot open the folder \(root): \(errnoText())") }
        defer { close(rootFD) }
        let spaceFD = try openDirectory(at: rootFD, hexString(space.id), path: spaceDir)
        defer { close(spaceFD) }
        return try openDirectory(at: spaceFD, me.hex, path: ownDir)
    }

    /// Opens directory `name` inside `parent`, creating it first if it is not there; never through a link.
    func openDirectory(at parent: Int32, _ name: String, path: String) throws -> Int32 {
        if mkdirat(parent, name, 0o755) != 0 && errno != EEXIST {
            throw FolderProblem("cannot create \(path): \(errnoText())")
        }
        let fd = openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard fd >= 0 else {
            throw FolderProblem("\(path) is not a plain directory (a symbolic link?); not writing through it: \(errnoText())")
        }
        return fd
    }

    /// Counts a failure once per distinct message.
    func fail(_ message: String) {
        guard message != lastFailure else { return }
        lastFailure = message
        logger.warning("Folder sync failed", metadata: ["db": "\(db.name)", "folder": "\(root)", "error": "\(message)"])
        report.update { $0.errors += 1; $0.lastError = message }
    }

    // MARK: Reading

    /// The writer directories in the space's directory (32 hex digits, a node id), sorted. A listing that fails
    /// (a network share's hiccup) fails the round: taken for an empty folder, it would make this device write
    /// everything again.
    func writerDirectories() throws -> [NodeID] {
        try listing(spaceDir).compactMap { name in
            // A link in place of a writer's directory is not followed: the daemon reads only inside the folder.
            var st = stat()
            guard let node = NodeID(hex: name), lstat(spaceDir + "/" + name, &st) == 0, (st.st_mode & S_IFMT) == S_IFDIR
            else { return nil }
            return node
        }.sorted()
    }

    /// The names in a directory.
    func listing(_ dir: String) throws -> [String] {
        do { return try FileManager.default.contentsOfDirectory(atPath: dir) } catch {
            throw FolderProblem("cannot list \(dir): \(error.localizedDescription)")
        }
    }

    /// Merges the membership operations other writers' members files hold.
    func readMembers() throws {
        guard space.snapshot.membership != nil else { return }
        for writer in try writerDirectories() where writer != me {
            let file = spaceDir + "/" + writer.hex + "/members"
            guard let stamp = FileStamp(path: file), stamps[file] != stamp else { continue }
            stamps[file] = stamp
            guard let bytes = readWhole(file, limit: FolderFiles.maxSmallFile) else { continue }
            do {
                let ops = try FolderFiles.decodeMembers(bytes, space: space.id).compactMap { try? MembershipOp(bytes: $0) }
                let fresh = space.merge(ops)
                if !fresh.isEmpty { engine.persist(fresh, space: space) }
            } catch {
                report.reject(error)
            }
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
            guard let bytes = readWhole(file, limit: 4096) else { continue }
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
            for writer in try writerDirectories() {
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
    /// name (copies the folder tool renamed), skipping the head and members files and temporary files.
    func segmentFiles(_ dir: String) throws -> [String] {
        let names = try listing(dir)
        let candidates = names.filter { $0 != "head" && $0 != "members" && !$0.hasSuffix(".tmp") && !$0.hasPrefix(".") }
        return candidates.sorted { a, b in
            switch (FolderFiles.segmentNumber(a), FolderFiles.segmentNumber(b)) {
            case (let x?, let y?): return x < y
            case (.some, nil): return true
            case (nil, .some): return false
            case (nil, nil): return a < b
            }
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
        let fd = open(file, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return (false, cursor.waiting) }
        defer { close(fd) }
        if cursor.offset == 0 {
            // A header not all there yet is a file being written or copied: read again later.
            guard let header = preadAll(fd, offset: 0, count: FolderFiles.segmentHeaderSize),
                header.count == FolderFiles.segmentHeaderSize
            else { return (false, false) }
            guard FolderFiles.checkSegmentHeader(header[...], space: space.id, writer: writer.bytes) else {
                cursor.usable = false
                report.reject(.malformed)
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

    // MARK: Writing

    /// Appends every entry held here that the folder lacks to this device's own segment, makes it durable, then
    /// replaces the head file; writes the members file when the log grew.
    func publish() throws {
        let snapshot = space.snapshot
        try db.sealLocal(key: snapshot.key, identity: engine.identity)
        held = try db.syncVector()
        let stable = floor(snapshot)
        let folder = coverage(floor: stable)
        var sent = 0
        for (origin, seq) in held.sorted(by: { $0.key < $1.key }) {
            var after = folder[origin] ?? 0
            while seq > after, !control.stopping.load(ordering: .acquiring),
                let batch = try db.entryBatch(origin: origin, after: after, maxEntries: SyncSession.batchEntries)
            {
                let body = try PeerMessage.entries(batch).encoded()
                guard body.count <= FolderFiles.maxRecordBody else { break }
                try append(FolderFiles.record(body))
                sent += batch.entries.count
                after = batch.head.seq
            }
        }
        if sent > 0, let segment {
            try segment.sync()
            try writeHead()
            report.update {
                $0.sentEntries += sent
                $0.lastSyncMs = nowMs()
            }
        } else if generation == 0 || !exists(at: ownFD, "head")
            || (held != headHeld && uptimeMs() >= headWrittenAt + 1000)
        {
            // What it holds changed (received entries): others learn it, at most once a second, so that entries
            // every member holds can be removed.
            try writeHead()
        }
        try writeMembers(snapshot)
        prune(below: stable)
    }

    /// For each origin, the highest seq that this device and every current member with a head file in this folder
    /// hold, as those head files say: no reader of the folder needs what lies at or below it. A member that does not
    /// use the folder yet does not count; when it starts, its head file lowers the floor and what it lacks is written
    /// again. In spaces without a membership log (members unknown) the floor is zero: nothing is removed.
    func floor(_ snapshot: SharedSpace.Snapshot) -> [NodeID: UInt64] {
        guard let membership = snapshot.membership else { return [:] }
        var out = held
        for member in membership.current {
            let node = NodeID(bytes: member.keys.nodeID)
            guard node != me, let head = heads[node] else { continue }
            let theirs = Dictionary(head.held.map { (NodeID(bytes: $0.key), $0.value) }, uniquingKeysWith: max)
            for (origin, seq) in out { out[origin] = min(seq, theirs[origin] ?? 0) }
        }
        return out
    }

    /// Removes this device's files whose every entry lies at or below the floor (never the segment being appended
    /// to): the folder's size follows what its readers still need, not the history.
    func prune(below stable: [NodeID: UInt64]) {
        guard !stable.isEmpty else { return }
        for (key, cursor) in files where key.hasPrefix(me.hex + "/") {
            let name = String(key.dropFirst(me.hex.count + 1))
            guard name != segment?.name, cursor.usable, !cursor.waiting, cursor.memo.isEmpty,
                let stamp = cursor.stamp, cursor.offset == stamp.size, !cursor.ranges.isEmpty,
                cursor.ranges.allSatisfy({ origin, list in list.allSatisfy { $0.upperBound <= stable[origin] ?? 0 } })
            else { continue }
            if unlinkat(ownFD, name, 0) == 0 {
                files[key] = nil
                logger.debug("Folder segment every member holds removed", metadata: ["db": "\(db.name)", "file": "\(name)"])
            }
        }
    }

    /// Appends one record to this device's current segment, starting the next segment when it is full.
    func append(_ record: [UInt8]) throws {
        if segment == nil || !(segment?.isCurrent(in: ownFD) ?? false) {
            segment?.close()
            segment = try OwnSegment.open(dirFD: ownFD, dir: ownDir, space: space.id, writer: me.bytes, logger: logger)
        }
        guard var current = segment else { return }
        if current.size >= options.segmentBytes {
            try current.sync()
            current.close()
            current = try OwnSegment.create(
                dirFD: ownFD, dir: ownDir, number: current.number + 1, space: space.id, writer: me.bytes)
        }
        try current.append(record)
        segment = current
    }

    /// Replaces the head file (a temporary file, synced, renamed over it, the directory synced).
    func writeHead() throws {
        generation += 1
        let bytes = FolderFiles.Head.encode(
            space: space.id, identity: engine.identity, generation: generation, timeMs: UInt64(max(0, nowMs())),
            segment: segment?.number ?? 0, ownHead: try db.latestHead(origin: me),
            held: Dictionary(uniqueKeysWithValues: held.map { ($0.key.bytes, $0.value) }))
        try replaceFile(at: ownFD, "head", with: bytes)
        try db.setFolderGeneration(root, generation)
        headHeld = held
        headWrittenAt = uptimeMs()
    }

    /// Writes the members file when the log holds operations it does not.
    func writeMembers(_ snapshot: SharedSpace.Snapshot) throws {
        guard snapshot.membership != nil, snapshot.ops.count != membersWritten || !exists(at: ownFD, "members") else {
            return
        }
        let ops = snapshot.ops.values.sorted { $0.hash.lexicographicallyPrecedes($1.hash) }.map(\.bytes)
        try replaceFile(at: ownFD, "members", with: FolderFiles.members(space: space.id, ops: ops))
        membersWritten = snapshot.ops.count
    }
}

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
    }

    /// True when an unchanged file has a waiting record that what is held now (or the keys) may let through.
    func retry(held: [NodeID: UInt64], keys: Int) -> Bool {
        guard waiting else { return false }
        return memo.values.contains {
            switch $0 {
            case .gap(let origin, let first): return first <= (held[origin] ?? 0) + 1
            case .keys(let count): return keys > count
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
    static func open(dirFD: Int32, dir: String, space: [UInt8], writer: [UInt8], logger: Logger) throws -> OwnSegment {
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
    static func create(dirFD: Int32, dir: String, number: UInt64, space: [UInt8], writer: [UInt8]) throws -> OwnSegment {
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

/// The whole file, nil when missing, unreadable or larger than `limit`.
func readWhole(_ path: String, limit: Int) -> [UInt8]? {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return nil }
    defer { close(fd) }
    var st = stat()
    guard fstat(fd, &st) == 0, Int(st.st_size) <= limit else { return nil }
    return preadAll(fd, offset: 0, count: Int(st.st_size))
}

/// True when `name` exists in the directory `dirFD` (a link counts; it is not followed).
func exists(at dirFD: Int32, _ name: String) -> Bool {
    var st = stat()
    return fstatat(dirFD, name, &st, AT_SYMLINK_NOFOLLOW) == 0
}

/// Replaces file `name` of the directory `dirFD` atomically and durably: a temporary file beside it (never through a
/// link), synced, renamed over it, the directory synced.
func replaceFile(at dirFD: Int32, _ name: String, with bytes: [UInt8]) throws {
    let tmp = name + ".tmp"
    let fd = openat(dirFD, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0o644)
    guard fd >= 0 else { throw FolderProblem("cannot create \(tmp): \(errnoText())") }
    var done = 0
    while done < bytes.count {
        let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + done, bytes.count - done) }
        if n < 0 && errno == EINTR { continue }
        guard n > 0 else {
            close(fd)
            throw FolderProblem("cannot write \(tmp): \(errnoText())")
        }
        done += n
    }
    guard fsync(fd) == 0 else {
        close(fd)
        throw FolderProblem("cannot sync \(tmp): \(errnoText())")
    }
    close(fd)
    guard renameat(dirFD, tmp, dirFD, name) == 0 else { throw FolderProblem("cannot rename \(tmp): \(errnoText())") }
    _ = fsync(dirFD)
}
