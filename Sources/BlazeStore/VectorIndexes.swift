import BlazeVector
import Foundation
import GRDB
import Synchronization

/// The vector indexes of one database held in memory: each a `VectorMatrix` built from `vector_rows` on its first
/// search and caught up with the rows written since before every later one (the rows only grow in `seq`), and, once
/// it holds `approximateFrom` rows, an `HNSWGraph` over it built on a thread of its own (searches answer exactly
/// meanwhile). Searches run one at a time, each in a read transaction begun after the previous ended, so the matrix
/// never gets ahead of the documents a search reads.
final class VectorIndexes: Sendable {
    /// Rows from which an index gets a graph: below, an exact search of 768-d vectors takes about a millisecond.
    static let approximateFrom = 10_000
    /// Rows a search adds to a built graph before it searches (more are searched exactly until later searches add
    /// them), so no search waits long for rows written since the build.
    static let extendPerSearch = 32

    private struct Held {
        /// The seq of the build marker the rows were loaded under.
        var build: Int64
        /// The last row seq applied.
        var seen: Int64
        var matrix: VectorMatrix
        var metric: VectorMetric
        /// The graph over the matrix's slots, once built.
        var graph: HNSWGraph?
        /// A graph is being built for the matrix generation it names.
        var building: UInt64?
        /// Whether the matrix or graph changed since they were read from or written to the index's file.
        var unsaved = true
    }

    /// The database file's path (index files are kept beside it: `VectorIndexFile`); nil keeps none.
    let databasePath: String?

    /// The indexes of the database at `databasePath`.
    init(databasePath: String?) {
        self.databasePath = databasePath
    }

    private let held = Mutex<[String: Held]>([:])
    /// Graphs their threads finished, by index, until the next search of the index takes them.
    private let finished = Mutex<[String: HNSWGraph]>([:])
    private let order = Mutex<Void>(())
    /// Matrix generations whose graph builds are to stop (their index was let go or loaded again).
    private let cancelled = Mutex<Set<UInt64>>([])
    private let closed = Atomic<Bool>(false)

    /// Runs `body` while no other search of this database runs.
    func serialized<T>(_ body: () throws -> T) throws -> T {
        try order.withLock { _ in try body() }
    }

    /// Stops graph builds under way (the database is closing).
    func close() {
        closed.store(true, ordering: .relaxed)
    }

    /// Index `name`'s matrix, caught up with `db`'s rows (loaded whole when first asked, or when the rows were built
    /// again), and its graph when one is built (extended by up to `extendPerSearch` rows); nil when the index is not
    /// built. Called inside `serialized`.
    func caughtUp(
        _ name: String, dimensions: Int, metric: VectorMetric, fileLimit: Int = .max, _ db: Database
    ) throws -> (VectorMatrix, HNSWGraph?)? {
        guard let build = try VectorIndexSQL.build(of: name, in: db) else {
            held.withLock { _ = $0.removeValue(forKey: name) }
            return nil
        }
        var entry = held.withLock { h -> Held? in h.removeValue(forKey: name) }
        if entry == nil { entry = try fromFile(name, build: build, dimensions: dimensions, metric: metric, maxBytes: fileLimit, db) }
        if entry?.build != build || entry?.matrix.dimensions != dimensions || entry?.metric != metric {
            if let building = entry?.building { _ = cancelled.withLock { $0.insert(building) } }
            var matrix = VectorMatrix(dimensions: dimensions)
            let rows = try Int.fetchOne(
                db, sql: "SELECT count(*) FROM vector_rows WHERE idx = ? AND doc >= 0 AND v IS NOT NULL", arguments: [name]) ?? 0
            matrix.reserve(rows)
            entry = Held(build: build, seen: build, matrix: matrix, metric: metric)
        }
        // Taken out of `entry`, so the matrix has one owner and is changed in place.
        guard var current = entry.take() else { return nil }
        let rows = try Row.fetchCursor(
            // NOT INDEXED: the rows after `seen` by rowid, not every row of the index through `vector_rows_doc`.
            db.cachedStatement(sql: "SELECT seq, doc, v FROM vector_rows NOT INDEXED WHERE seq > ? AND idx = ? ORDER BY seq"),
            arguments: [current.seen, name])
        while let row = try rows.next() {
            let seq: Int64 = row[0], doc: Int64 = row[1]
            current.seen = seq
            current.unsaved = true
            guard doc >= 0 else { continue }
            if let bytes = row[2] as Data?, bytes.count == dimensions * 4 {
                let floats = [Float](unsafeUninitializedCapacity: dimensions) { buffer, count in
                    count = bytes.copyBytes(to: buffer) / 4
                }
                current.matrix.set(doc, floats)
            } else {
                current.matrix.remove(doc)
            }
        }
        if let graph = finished.withLock({ $0.removeValue(forKey: name) }), graph.generation == current.matrix.generation {
            current.graph = graph
            current.building = nil
            current.unsaved = true
        }
        if current.graph?.generation != current.matrix.generation { current.graph = nil }
        if var graph = current.graph.take() {
            let nodes = graph.nodes
            graph.extend(to: min(current.matrix.slotCount, graph.nodes + Self.extendPerSearch), in: current.matrix)
            if graph.nodes != nodes { current.unsaved = true }
            current.graph = graph
        } else if current.matrix.count >= Self.approximateFrom, current.building != current.matrix.generation {
            current.building = current.matrix.generation
            startBuilding(name, over: current.matrix, metric: metric)
        }
        let result = (current.matrix, current.graph)
        held.withLock { $0[name] = current }
        return result
    }

    /// Builds a graph over `matrix` (a copy that shares its storage until either changes) on a thread of its own and
    /// hands it to the index when it is done, if the index still has that matrix generation.
    private func startBuilding(_ name: String, over matrix: VectorMatrix, metric: VectorMetric) {
        let thread = Thread { [self] in
            var graph = HNSWGraph(for: matrix, metric: metric)
            var done = 0
            func stopped() -> Bool {
                closed.load(ordering: .relaxed) || cancelled.withLock { $0.contains(matrix.generation) }
            }
            while done < matrix.slotCount {
                if stopped() { return }
                done = min(matrix.slotCount, done + 1000)
                graph.extend(to: done, in: matrix)
            }
            if !stopped() { finished.withLock { $0[name] = graph } }
        }
        thread.name = "blazed.vector-graph"
        thread.start()
    }

    /// Index `name` as its file holds it, if the file matches the index's build and the rows (`VectorIndexFile`).
    private func fromFile(
        _ name: String, build: Int64, dimensions: Int, metric: VectorMetric, maxBytes: Int, _ db: Database
    ) throws -> Held? {
        guard let databasePath, let nonce = try VectorIndexSQL.nonce(of: name, build: build, in: db) else { return nil }
        let path = VectorIndexFile.path(database: databasePath, index: name)
        // A file larger than what may be held is left for a later search with more room (its rows are searched).
        var st = stat()
        guard stat(path, &st) == 0, Int(st.st_size) <= maxBytes else { return nil }
        let maxSeen = try Int64.fetchOne(db, sql: "SELECT max(seq) FROM vector_rows") ?? 0
        guard let (image, seen) = VectorIndexFile.load(path, index: name, build: build, nonce: nonce, maxSeen: maxSeen) else { return nil }
        guard image.dimensions == dimensions, image.metric == metric, let (matrix, graph) = try? image.restore() else {
            unlink(path)
            return nil
        }
        return Held(build: build, seen: seen, matrix: matrix, metric: metric, graph: graph, unsaved: false)
    }

    /// What `BlazeDatabase.saveVectorIndexes` writes: each held index that has a graph and changed since it was read
    /// or written, with the build and last row it covers (marked saved: a failed write is not tried again). Takes the
    /// graphs finished meanwhile first. Call inside `serialized`.
    func unsavedImages() -> [(name: String, build: Int64, seen: Int64, image: VectorIndexImage)] {
        let done = finished.withLock { f in
            defer { f = [:] }
            return f
        }
        return held.withLock { held in
            var out: [(name: String, build: Int64, seen: Int64, image: VectorIndexImage)] = []
            for name in held.keys.sorted() {
                guard var h = held[name] else { continue }
                if let graph = done[name], graph.generation == h.matrix.generation { (h.graph, h.building, h.unsaved) = (graph, nil, true) }
                if let graph = h.graph, graph.generation == h.matrix.generation, h.unsaved {
                    out.append((name, h.build, h.seen, VectorIndexImage(matrix: h.matrix, graph: graph)))
                    h.unsaved = false
                }
                held[name] = h
            }
            return out
        }
    }

    /// Whether index `name` is held in memory.
    func isHeld(_ name: String) -> Bool { held.withLock { $0[name] != nil } }

    /// Bytes the held indexes' vectors (each slot's components, norm and id, live or dead) and graph links take.
    func heldBytes() -> Int {
        held.withLock {
            $0.values.reduce(0) { $0 + $1.matrix.slotCount * ($1.matrix.dimensions * 4 + 12) + ($1.graph?.bytes ?? 0) }
        }
    }

    /// Lets go of index `name`: its memory, a finished graph not yet taken, and a graph being built for it (stopped).
    func forget(_ name: String) {
        if let building = held.withLock({ $0.removeValue(forKey: name)?.building }) { _ = cancelled.withLock { $0.insert(building) } }
        finished.withLock { _ = $0.removeValue(forKey: name) }
    }

    /// Lets go of every held index not named in `names` (dropped, or no longer built).
    func keepOnly(_ names: Set<String>) {
        for name in held.withLock({ Array($0.keys) }) where !names.contains(name) { forget(name) }
        finished.withLock { f in f = f.filter { names.contains($0.key) } }
    }

    /// Whether index `name` has a graph, or one finished building that its next search takes.
    func hasGraph(_ name: String) -> Bool {
        held.withLock { $0[name]?.graph != nil } || finished.withLock { $0[name] != nil }
    }
}
