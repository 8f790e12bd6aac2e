import BlazeCRDT
import BlazeCrypto
import BlazeProtocol
import BlazeSettings
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

    /// Options with the defaults of `BlazedSettings`: inotify, a 2 s poll, 4 MiB segments.
    public init(
        pollIntervalMs: Int = BlazedSettings.folderPollInterval.defaultValue,
        inotify: Bool = BlazedSettings.folderInotify.defaultValue,
        segmentBytes: Int = BlazedSettings.folderSegmentBytes.defaultValue
    ) {
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
    /// The acknowledgements (signer and issue time) written to this device's acks file, and when (uptime ms).
    var acksWritten: [[UInt8]: UInt64]?
    var acksWrittenAt: UInt64 = 0
    /// The statements of entry formats the statements file was last written with: node id → when issued.
    var formatsWritten: [[UInt8]: UInt64]?
    /// Whether the last step failed, and how (counted once per distinct failure).
    var lastFailure: String?
    /// Chunks this link wrote to its own `assets/` (or found there), and its place in the store's log of swept chunks.
    var assetsKnown: Set<ChunkID> = []
    /// Whether `assetsKnown` took in what the own `assets/` held when the link started.
    var assetsSeeded = false
    var sweptMark = 0
    /// Whether the last look left chunks to other members' copies: looked at again now and then, since another
    /// member may sweep its copy.
    var assetsLeftElsewhere = false
    /// Chunks of the store still to write to the folder, the chunks other members' `assets/` held at the last look,
    /// and when (uptime ms) and at which generation the store was last listed.
    var pendingAssets: [ChunkID] = []
    var elsewhere: Set<ChunkID> = []
    var assetsScannedAt: UInt64 = 0
    var assetsGeneration = -1
    /// This link's token as a chunk source of the engine's fetcher, while it runs.
    var chunkSource: Int?
    /// Chunks the fetcher asked of this link.
    let assetAsks = AssetAsks()

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
        spaceDir = root + "/" + space.id.hex
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
        let asks = assetAsks
        chunkSource = engine.chunks.attach(db: db.name, folder: true) { ids in
            asks.add(ids)
            signal.wake()
        }
        defer {
            if let feedToken { db.feed.detach(feedToken) }
            engine.unregister(registration)
            if let chunkSource { engine.chunks.detach(chunkSource) }
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
        if let bytes = readWhole(ownDir + "/head", beneath: root, limit: FolderFiles.maxSmallFile),
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
            // Chunks asked for are answered first: a reader waits for them.
            serveAssetAsks()
            held = try db.syncVector()
            try readMembers()
            try readHeads()
            try readAcks()
            try readFormats()
            try scan()
            try publish()
            try publishAssets()
            if lastFailure != nil {
                lastFailure = nil
                report.update { $0.lastError = nil }
            }
        } catch {
            refuseAssetAsks()
            fail("\(error)")
        }
    }

    /// Opens (creating them if needed) `<space>/<device>` inside the folder, refusing a symbolic link at either
    /// level: the folder itself may be a link (~/Dropbox to a mount), nothing inside it.
    func openOwnDirectory() throws -> Int32 {
        let rootFD = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard rootFD >= 0 else { throw FolderProblem("cannot open the folder \(root): \(errnoText())") }
        defer { close(rootFD) }
        let spaceFD = try openDirectory(at: rootFD, space.id.hex, path: spaceDir)
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
}
