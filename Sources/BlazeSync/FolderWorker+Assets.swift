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
/// on the wire, to its own `<space>/<device>/assets/<chunk id>` when no listed member's `assets/` has them yet (and
/// removes those its store no longer holds), and the
/// link is a source the engine's `ChunkFetcher` asks for chunks: it looks for them in every listed writer's `assets/`
/// and stores those that open as their id.
extension FolderWorker {
    /// Chunks written to the folder per round at most (each a durable file; the next round goes on).
    static let assetsPerRound = 64
    /// Milliseconds between looks at a chunk store that changed, for chunks the folder lacks.
    static let assetsScanIntervalMs: UInt64 = 1_000
    /// Milliseconds between looks at chunks left to other members' copies (one may have swept its copy).
    static let assetsRecheckIntervalMs: UInt64 = 60_000

    /// Writes sealed chunks of this database that no listed member's `assets/` holds yet (at most `assetsPerRound`).
    /// The store is listed again only once it changed; each other writer's `assets/` is listed once per look.
    func publishAssets() throws {
        let store = try engine.chunkStores.store(for: db)
        if !assetsSeeded {
            // A device started again finds what it wrote before: only what its own `assets/` lacks is written. A file
            // of another size than its chunk seals to (cut short by a failing disk, say) is written again.
            assetsKnown.formUnion(assetFiles(in: ownDir + "/assets") { id in store.size(of: id).map { SealedChunk.maxSealedCount(content: $0) } })
            assetsSeeded = true
        }
        removeSweptAssets(store)
        let now = uptimeMs()
        if pendingAssets.isEmpty {
            let recheck = assetsLeftElsewhere && now >= assetsScannedAt + Self.assetsRecheckIntervalMs
            guard store.generation != assetsGeneration || recheck, now >= assetsScannedAt + Self.assetsScanIntervalMs else { return }
            (assetsGeneration, assetsScannedAt, assetsLeftElsewhere) = (store.generation, now, false)
            pendingAssets = store.all().filter { !assetsKnown.contains($0) }
            guard !pendingAssets.isEmpty else { return }
            elsewhere = heldElsewhere()
        }
        guard let sealing = space.snapshot.key.chunkSealing else { return }
        let assetsFD = try openDirectory(at: ownFD, "assets", path: ownDir + "/assets")
        defer { close(assetsFD) }
        var written = 0
        while written < Self.assetsPerRound, let id = pendingAssets.popLast(), !control.stopping.load(ordering: .acquiring) {
            if elsewhere.contains(id) {
                // Not taken as written: the member holding that copy may sweep it, and then this one writes it.
                assetsLeftElsewhere = true
                continue
            }
            guard let sealed = try? SealedChunk.seal(reading: id, from: store, space: space.id, epoch: sealing.epoch.value, secret: sealing.secret)
            else { continue }
            do {
                try replaceFile(at: assetsFD, id.hex, with: sealed)
            } catch {
                // One chunk that cannot be written (a full folder, something in the way) does not stop the others;
                // the next look at the store tries it again.
                fail("cannot write chunk \(id) to the folder: \(error)")
                continue
            }
            assetsKnown.insert(id)
            written += 1
        }
        if written > 0 { report.update { $0.chunksSent += written } }
        if !pendingAssets.isEmpty { watch.signal.wake() }
    }

    /// Removes from this device's own `assets/` the chunks its store's sweeps removed since the last look
    /// (`blob.gc`: nothing this device holds refers to them), so the folder lets them go with it. Only what a sweep
    /// removed: a chunk merely missing from the store (a lost directory) stays in the folder for the others.
    func removeSweptAssets(_ store: ChunkStore) {
        let (swept, next) = store.swept(after: sweptMark)
        guard !swept.isEmpty else { return }
        // Removed relative to the directory opened without following links: nothing outside it is touched.
        guard let assetsFD = try? openDirectory(at: ownFD, "assets", path: ownDir + "/assets") else { return }
        defer { close(assetsFD) }
        sweptMark = next
        var removed = 0
        for id in swept where !store.contains(id) {
            if unlinkat(assetsFD, id.hex, 0) == 0 { removed += 1 }
            assetsKnown.remove(id)
        }
        if removed > 0 { engine.logger.info("Swept chunks left the folder", metadata: ["db": "\(db.name)", "chunks": "\(removed)"]) }
    }

    /// The chunks whose regular files lie in the `assets/` of the space's other listed members.
    func heldElsewhere() -> Set<ChunkID> {
        let log = space.snapshot.membership
        var held = Set<ChunkID>()
        for writer in (try? writerDirectories()) ?? [] where writer != me && (log == nil || log?.member(writer.bytes) != nil) {
            held.formUnion(assetFiles(in: spaceDir + "/" + writer.hex + "/assets"))
        }
        return held
    }

    /// The chunks whose regular files lie in the `assets/` directory `dir`: each no larger than a sealed chunk can be,
    /// or, when `sealedSize` is given, exactly the size it gives for the chunk (nil: the chunk is not counted).
    func assetFiles(in dir: String, sealedSize: ((ChunkID) -> Int?)? = nil) -> Set<ChunkID> {
        var held = Set<ChunkID>()
        for name in (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? [] {
            guard let id = ChunkID(hex: name) else { continue }
            var st = stat()
            guard lstat(dir + "/" + name, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG, Int(st.st_size) <= PeerMessage.maxSealedChunkBytes
            else { continue }
            if let sealedSize, sealedSize(id) != Int(st.st_size) { continue }
            held.insert(id)
        }
        return held
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
                guard let sealed = readWhole(path, beneath: root, limit: PeerMessage.maxSealedChunkBytes),
                    let epoch = SealedChunk.epoch(of: sealed)
                else { continue }
                let secrets = key.secrets(epoch: Epoch(epoch))
                // Sealed under an epoch this device holds no key for (yet): not the writer's fault.
                guard !secrets.isEmpty, let keys = try? engine.blobKeys(db: db) else { continue }
                let chunkStore: ChunkStore
                do { chunkStore = try engine.chunkStores.store(for: db) } catch {
                    engine.chunks.failed(db: db.name, id, source: source, error: ChunkStores.storeError(error))
                    stored = true  // answered: the callers have failed
                    break
                }
                // Opened, checked and stored from where the opened content lies.
                guard let put = try? SealedChunk.open(sealed[...], id: id, keys: keys, secrets: secrets, maximum: keys.chunker.sizes.maximum, { content in
                    Result { () throws(ChunkStoreError) -> Int in
                        _ = try chunkStore.put(id, content)
                        return content.count
                    }
                })
                else {
                    // Altered, or another chunk under its name: counted and skipped; another writer's copy may be whole.
                    report.reject(.badChunk)
                    continue
                }
                let count: Int
                do { count = try put.get() } catch {
                    engine.chunks.failed(db: db.name, id, source: source, error: ChunkStores.storeError(error))
                    stored = true  // answered: the callers have failed
                    break
                }
                report.update { $0.chunksReceived += 1; $0.chunkBytesReceived += count }
                engine.chunks.arrived(source, db: db.name, id)
                stored = true
                break
            }
            if !stored { engine.chunks.lacks(source, db: db.name, [id]) }
        }
    }

    /// Answers every chunk asked with "lacks" (the round failed: the folder is missing or unreadable).
    func refuseAssetAsks() {
        guard let source = chunkSource else { return }
        let asked = assetAsks.take()
        if !asked.isEmpty { engine.chunks.lacks(source, db: db.name, asked) }
    }
}

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
