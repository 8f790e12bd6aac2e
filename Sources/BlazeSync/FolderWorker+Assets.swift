import BlazeBlob
import BlazeCrypto
import BlazeProtocol
import BlazeWire
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Blob chunks in a shared folder (SYNC.md §10, "Assets"): each device writes the chunks its database holds, sealed as
/// on the wire, to its own `<space>/<device>/assets/<chunk id>` when no device's `assets/` has them yet, and the link
/// is a source the engine's `ChunkFetcher` asks for chunks: it looks for them in every listed writer's `assets/` and
/// stores those that open as their id.
extension FolderWorker {
    /// Chunks written to the folder per round at most (each a durable file; the next round goes on).
    static let assetsPerRound = 64
    /// Milliseconds between looks at the chunk store for chunks the folder lacks.
    static let assetsScanIntervalMs: UInt64 = 1_000

    /// Writes sealed chunks of this database that no device's `assets/` holds yet (at most `assetsPerRound`).
    func publishAssets() throws {
        let now = uptimeMs()
        guard pendingAssets.isEmpty == false || now >= assetsScannedAt + Self.assetsScanIntervalMs else { return }
        guard let sealing = space.snapshot.key.chunkSealing else { return }
        let store = try engine.chunkStores.store(for: db)
        if pendingAssets.isEmpty {
            assetsScannedAt = now
            pendingAssets = store.all().filter { !assetsKnown.contains($0) }
            guard !pendingAssets.isEmpty else { return }
        }
        let writers = try writerDirectories()
        let assetsFD = try openDirectory(at: ownFD, "assets", path: ownDir + "/assets")
        defer { close(assetsFD) }
        var written = 0
        while written < Self.assetsPerRound, let id = pendingAssets.popLast(), !control.stopping.load(ordering: .acquiring) {
            let name = id.hex
            if writers.contains(where: { Self.present(spaceDir + "/" + $0.hex + "/assets/" + name) }) {
                assetsKnown.insert(id)
                continue
            }
            guard let content = try store.read(id) else { continue }
            let sealed = content.withUnsafeBytes {
                SealedChunk.seal($0, id: id, space: space.id, epoch: sealing.epoch.value, secret: sealing.secret)
            }
            try replaceFile(at: assetsFD, name, with: sealed)
            assetsKnown.insert(id)
            written += 1
        }
        if written > 0 { report.update { $0.chunksSent += written } }
        if !pendingAssets.isEmpty { watch.signal.wake() }
    }

    /// Whether something is at `path` (a link counts; it is not followed).
    static func present(_ path: String) -> Bool {
        var st = stat()
        return lstat(path, &st) == 0
    }

    /// Answers the fetcher's asks: each chunk from the first listed writer's `assets/` whose file opens as its id.
    func serveAssetAsks() {
        guard let source = chunkSource else { return }
        let asked = assetAsks.take()
        guard !asked.isEmpty else { return }
        let writers = (try? writerDirectories()) ?? []
        let log = space.snapshot.membership
        let key = space.snapshot.key
        for id in asked {
            var stored = false
            for writer in writers where writer != me && (log == nil || log?.member(writer.bytes) != nil) {
                let path = spaceDir + "/" + writer.hex + "/assets/" + id.hex
                guard let sealed = readWhole(path, beneath: root, limit: PeerMessage.maxSealedChunkBytes) else { continue }
                do {
                    let keys = try engine.blobKeys(db: db)
                    guard let epoch = SealedChunk.epoch(of: sealed) else { throw ChunkOpenFailure() }
                    let content = try SealedChunk.open(
                        sealed, id: id, keys: keys, secrets: key.secrets(epoch: Epoch(epoch)), maximum: keys.chunker.sizes.maximum)
                    _ = try engine.chunkStores.store(for: db).put(id, content)
                    report.update { $0.chunksReceived += 1; $0.chunkBytesReceived += content.count }
                    stored = true
                    break
                } catch {
                    // A file that does not open as its id (altered, or another chunk under its name) is counted and
                    // skipped; another writer's copy may be whole.
                    report.reject(.badChunk)
                }
            }
            if stored { engine.chunks.arrived(source, db: db.name, id) } else { engine.chunks.lacks(source, [id]) }
        }
    }
}

/// A sealed chunk that did not name its epoch.
struct ChunkOpenFailure: Error {}

/// Chunks the fetcher asked of a folder link, taken by its thread.
final class AssetAsks: Sendable {
    private let ids = Mutex<[ChunkID]>([])

    /// Adds asked chunks.
    func add(_ more: [ChunkID]) { ids.withLock { $0 += more } }

    /// Takes every chunk asked so far.
    func take() -> [ChunkID] {
        ids.withLock { held in
            defer { held = [] }
            return held
        }
    }
}
