import BlazeTestSupport
import Testing

@testable import BlazeVector

/// The approximate index against exact search: recall on clustered vectors for each metric, rows removed never
/// returned, rows added after the build found, filters kept.
@Suite struct HNSWGraphTests {
    /// `n` vectors around `n / 50` centres, and `q` queries near the same centres.
    static func clustered(_ n: Int, _ d: Int, queries q: Int, seed: UInt64) -> ([[Float]], [[Float]]) {
        var rng = SeededRandom(seed: seed)
        let centres = (0..<max(1, n / 50)).map { _ in (0..<d).map { _ in Float.random(in: -1...1, using: &rng) } }
        func near() -> [Float] { centres[Int.random(in: 0..<centres.count, using: &rng)].map { $0 + Float.random(in: -0.3...0.3, using: &rng) } }
        return ((0..<n).map { _ in near() }, (0..<q).map { _ in near() })
    }

    static func recall(_ got: [VectorHit], _ exact: [VectorHit]) -> Double {
        Double(Set(got.map(\.id)).intersection(exact.map(\.id)).count) / Double(max(1, exact.count))
    }

    @Test(arguments: VectorMetric.allCases)
    func recallIsHighAndRemovedRowsAreNeverReturned(metric: VectorMetric) throws {
        let (vectors, queries) = Self.clustered(4000, 24, queries: 40, seed: testSeed("hnsw-\(metric)"))
        var matrix = VectorMatrix(dimensions: 24)
        for (i, v) in vectors.enumerated() { matrix.set(Int64(i), v) }
        var graph = HNSWGraph(for: matrix, metric: metric, parameters: .init(m: 12, efConstruction: 100))
        graph.extend(to: matrix.slotCount, in: matrix)
        #expect(graph.nodes == 4000)
        var total = 0.0
        for q in queries {
            let got = graph.nearest(to: q, k: 10, ef: 64, in: matrix)
            #expect(got.count == 10)
            total += Self.recall(got, matrix.nearest(to: q, k: 10, metric: metric))
        }
        #expect(total / Double(queries.count) >= 0.95, "recall@10 \(total / Double(queries.count)) with ef 64")

        // Removed and replaced rows: the graph keeps them as routing nodes and never returns them; the replacing
        // vectors (new slots, past the graph) are searched exactly until the graph is extended to them.
        for id in stride(from: Int64(0), to: 4000, by: 5) { matrix.remove(id) }
        for id in stride(from: Int64(1), to: 400, by: 5) { matrix.set(id, vectors[Int(id + 1)]) }
        #expect(matrix.generation == graph.generation)
        for q in queries.prefix(10) {
            let got = graph.nearest(to: q, k: 10, ef: 64, in: matrix)
            #expect(got.allSatisfy { $0.id % 5 != 0 })
            #expect(Self.recall(got, matrix.nearest(to: q, k: 10, metric: metric)) >= 0.7)
        }
        graph.extend(to: matrix.slotCount, in: matrix)
        #expect(graph.nodes == matrix.slotCount)
        var after = 0.0
        for q in queries {
            let got = graph.nearest(to: q, k: 10, ef: 64, in: matrix)
            #expect(got.allSatisfy { $0.id % 5 != 0 })
            after += Self.recall(got, matrix.nearest(to: q, k: 10, metric: metric))
        }
        #expect(after / Double(queries.count) >= 0.95)
        // A filter admitting every third row: only those come back.
        let third = graph.nearest(to: queries[0], k: 10, ef: 200, in: matrix, admits: { $0 % 3 == 0 })
        #expect(third.count == 10 && third.allSatisfy { $0.id % 3 == 0 && $0.id % 5 != 0 })
        #expect(Self.recall(third, matrix.nearest(to: queries[0], k: 10, metric: metric, admits: { $0 % 3 == 0 })) >= 0.8)
    }

    @Test func aCompactedMatrixIsNotSearchedThroughAnOldGraph() {
        var matrix = VectorMatrix(dimensions: 2)
        for i in 0..<3000 { matrix.set(Int64(i), [Float(i), 1]) }
        var graph = HNSWGraph(for: matrix, metric: .l2)
        graph.extend(to: matrix.slotCount, in: matrix)
        // Removing more than half compacts the matrix (a new generation): the old graph then searches exactly.
        for i in 0..<2000 { matrix.remove(Int64(i)) }
        #expect(matrix.generation != graph.generation && matrix.count == 1000 && matrix.slotCount < 3000)
        #expect(graph.nearest(to: [2500, 1], k: 3, ef: 10, in: matrix).map(\.id) == [2500, 2499, 2501])
    }

    @Test func anImageRestoresTheSameGraphAndRefusesDamagedParts() throws {
        let (vectors, queries) = Self.clustered(1500, 16, queries: 10, seed: testSeed("hnsw-image"))
        var matrix = VectorMatrix(dimensions: 16)
        for (i, v) in vectors.enumerated() { matrix.set(Int64(i + 1), v) }
        for id in stride(from: Int64(1), to: 1500, by: 7) { matrix.remove(id) }  // dead slots stay routing nodes
        var graph = HNSWGraph(for: matrix, metric: .cosine, parameters: .init(m: 8, efConstruction: 64))
        graph.extend(to: matrix.slotCount - 100, in: matrix)  // a graph behind its matrix, as a saved one may be
        let image = VectorIndexImage(matrix: matrix, graph: graph)
        #expect(!image.upperNodes.isEmpty, "no node above layer 0: the test would not cover the upper layers")
        let (restored, restoredGraph) = try image.restore()
        #expect(restored.generation != matrix.generation && restoredGraph.generation == restored.generation)
        #expect(restored.count == matrix.count && restoredGraph.nodes == graph.nodes)
        for q in queries {
            #expect(restoredGraph.nearest(to: q, k: 10, ef: 40, in: restored) == graph.nearest(to: q, k: 10, ef: 40, in: matrix))
            #expect(restored.nearest(to: q, k: 10, metric: .l2) == matrix.nearest(to: q, k: 10, metric: .l2))
        }
        // Every damaged part is refused before anything searches it.
        func refused(_ change: (inout VectorIndexImage) -> Void) -> Bool {
            var damaged = image
            change(&damaged)
            do {
                _ = try damaged.restore()
                return false
            } catch {
                return true
            }
        }
        #expect(refused { $0.values[5] = .nan })
        #expect(refused { $0.values[5] = 3e38 })  // finite, but its squared norm is not
        #expect(refused { $0.values.removeLast() })
        #expect(refused { $0.ids[3] = $0.ids[2] })
        #expect(refused { $0.ids[3] = -5 })
        #expect(refused { $0.links0[0] = Int32($0.count0.count) })
        #expect(refused { $0.links0[0] = 0 })  // a node linked to itself
        #expect(refused { $0.count0[0] = UInt8(2 * $0.parameters.m + 1) })
        #expect(refused { $0.count0.append(0) })
        #expect(refused { $0.upperNodes[0] = $0.upperNodes[0] &+ 1 })
        #expect(refused { $0.upperNodes.removeFirst() })
        #expect(refused { $0.upperCounts[0] = UInt8($0.parameters.m + 1) })
        #expect(refused { $0.upperLinks[0] = -1 })
        #expect(refused { $0.upperLinks.append(0) })
        #expect(refused { $0.entry = $0.entry == 0 ? 1 : 0 })
        #expect(refused { $0.topLayer += 1 })
        #expect(refused { $0.dimensions = 0 })
        #expect(refused { $0.parameters.m = 1 })
    }
}
