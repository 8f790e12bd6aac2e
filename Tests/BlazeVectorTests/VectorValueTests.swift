import BlazeProtocol
import BlazeTestSupport
import Testing

@testable import BlazeVector

/// The vector value's text forms and the exact search's kernel, against plain arithmetic.
@Suite struct VectorValueTests {
    @Test func base64RoundTripsAndRefusesAnythingNotCanonical() throws {
        var rng = SeededRandom(seed: testSeed("vector-base64"))
        for n in [1, 2, 3, 5, 8, 100, 768, 4096] {
            let v = (0..<n).map { _ in Float.random(in: -1e6...1e6, using: &rng) }
            let text = VectorValue.encode(v)
            #expect(VectorValue.decode(text) == v)
            // Foundation-free base64 is the standard one: 4 characters per 3 bytes, padded.
            #expect(text.utf8.count == (n * 4 + 2) / 3 * 4)
        }
        #expect(VectorValue.encode([1]) == "AACAPw==")
        #expect(VectorValue.decode("AACAPw==") == [1])
        for bad in ["", "AACAPw=", "AACAPw", "AACAPx==", "AACA Pw==", "AACAP===", "=AACAPw=", "AACAPw==AACAPw==", "AAC*Pw==", "AACAfw=="] {
            #expect(VectorValue.decode(bad) == nil, "\(bad)")
        }
        #expect(VectorValue.decode(VectorValue.encode([Float](repeating: 1, count: 4097))) == nil)
    }

    @Test func valuesAreNormalizedAndExpanded() throws {
        let given: JSONValue = ["a": ["$vector": [0.1, 2, -3.5]], "b": .array([["$vector": "AACAPw=="], 4]), "c": "x"]
        let stored = try VectorValue.normalized(given)
        #expect(stored["a"] == VectorValue.stored([0.1, 2, -3.5]))
        #expect(stored["b"]?.arrayValue?.first == VectorValue.stored([1]))
        #expect(VectorValue.expanded(stored) == ["a": ["$vector": [0.1, 2, -3.5]], "b": .array([["$vector": [1]], 4]), "c": "x"])
        #expect(VectorValue.occurs(in: given) && !VectorValue.occurs(in: ["a": [1, 2], "b": ["c": "d"]]))
        // Malformed stored values (from another replica) are left as they are.
        #expect(VectorValue.expanded(["$vector": "nope"]) == ["$vector": "nope"])
    }

    @Test func theRuntimeChosenKernelAgreesWithTheSwiftOne() {
        var rng = SeededRandom(seed: testSeed("vector-kernel"))
        #expect(["avx512", "avx2", "sse"].contains(VectorMatrix.instructionSet))
        for n in [0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 768, 1000, 4096] {
            let a = (0..<n).map { _ in Float.random(in: -2...2, using: &rng) }
            let b = (0..<n).map { _ in Float.random(in: -2...2, using: &rng) }
            let (fast, swift) = a.withUnsafeBufferPointer { x in
                b.withUnsafeBufferPointer { y in
                    (VectorMatrix.dot(x.baseAddress ?? UnsafePointer(bitPattern: 16)!, y.baseAddress ?? UnsafePointer(bitPattern: 16)!, n),
                        VectorMatrix.swiftDot(x.baseAddress ?? UnsafePointer(bitPattern: 16)!, y.baseAddress ?? UnsafePointer(bitPattern: 16)!, n))
                }
            }
            let exact = zip(a, b).reduce(0.0) { $0 + Double($1.0) * Double($1.1) }
            #expect(abs(Double(fast) - exact) <= 1e-4 * max(1, Double(n)), "n=\(n) \(VectorMatrix.instructionSet)")
            #expect(abs(Double(fast) - Double(swift)) <= 1e-4 * max(1, Double(n)), "n=\(n)")
            // The squared L2 distance, the same way.
            let (fastL2, swiftL2) = a.withUnsafeBufferPointer { x in
                b.withUnsafeBufferPointer { y in
                    (VectorMatrix.squaredDistance(x.baseAddress ?? UnsafePointer(bitPattern: 16)!, y.baseAddress ?? UnsafePointer(bitPattern: 16)!, n),
                        VectorMatrix.swiftSquaredDistance(x.baseAddress ?? UnsafePointer(bitPattern: 16)!, y.baseAddress ?? UnsafePointer(bitPattern: 16)!, n))
                }
            }
            let exactL2 = zip(a, b).reduce(0.0) { $0 + (Double($1.0) - Double($1.1)) * (Double($1.0) - Double($1.1)) }
            #expect(abs(Double(fastL2) - exactL2) <= 1e-4 * max(1, Double(n)), "n=\(n) \(VectorMatrix.instructionSet)")
            #expect(abs(Double(fastL2) - Double(swiftL2)) <= 1e-4 * max(1, Double(n)), "n=\(n)")
        }
    }

    @Test func nearlyCoincidingRowsGetTheirL2DistanceToTheLastDigits() throws {
        // Through the norms, 0.5 and 0.50001 are 0 to 5e-4 apart; their differences say 1e-5.
        let rows: [[Float]] = [[0.5], [0.50001]]
        var m = VectorMatrix(dimensions: 1)
        m.set(1, rows[0])
        m.set(2, [-0.9])
        let want = Double(Float(0.50001) - Float(0.5))
        let hits = m.nearest(to: rows[1], k: 2, metric: .l2)
        #expect(hits.map(\.id) == [1, 2])
        #expect(abs(Double(hits[0].distance) - want) < 1e-9)
        #expect(m.nearest(to: rows[1], k: 1, metric: .l2, among: [1]).first?.distance == hits[0].distance)
        var graph = HNSWGraph(for: m, metric: .l2)
        graph.extend(to: m.slotCount, in: m)
        #expect(graph.nearest(to: rows[1], k: 1, ef: 8, in: m).first?.distance == hits[0].distance)
        var streaming = StreamingNearest(query: rows[1], k: 1, metric: .l2)
        rows[0].withUnsafeBufferPointer { streaming.offer(1, $0) }
        #expect(streaming.hits.first?.distance == hits[0].distance)
        // Lengths through every part of the differences' kernels (64-, 32-, 16- and 8-wide bodies, and tails).
        for n in [1, 7, 8, 15, 16, 17, 33, 64, 65, 100, 768] {
            let a = (0..<n).map { Float($0) * 0.25 + 0.5 }, b = a.map { $0 + 1e-5 }
            var matrix = VectorMatrix(dimensions: n)
            matrix.set(7, a)
            let exact = zip(a, b).reduce(0.0) { $0 + Double($1.0 - $1.1) * Double($1.0 - $1.1) }.squareRoot()
            let got = try #require(matrix.nearest(to: b, k: 1, metric: .l2).first)
            #expect(abs(Double(got.distance) - exact) < 1e-6 * exact, "n=\(n)")
        }
    }

    @Test func exactSearchMatchesArithmeticForEveryMetric() throws {
        var rng = SeededRandom(seed: testSeed("vector-search"))
        for d in [1, 7, 8, 31, 32, 33, 100] {
            var m = VectorMatrix(dimensions: d)
            var rows: [Int64: [Float]] = [:]
            for id in 0..<Int64(200) {
                let v = (0..<d).map { _ in Float.random(in: -1...1, using: &rng) }
                m.set(id, v)
                rows[id] = v
            }
            for id in stride(from: Int64(0), to: 200, by: 3) {
                m.remove(id)
                rows[id] = nil
            }
            m.set(1, rows[1]!.map { $0 * 2 })
            rows[1] = rows[1]!.map { $0 * 2 }
            #expect(m.count == rows.count)
            let q = (0..<d).map { _ in Float.random(in: -1...1, using: &rng) }
            for metric in VectorMetric.allCases {
                let got = m.nearest(to: q, k: 10, metric: metric)
                func plain(_ v: [Float]) -> Double {
                    let dot = zip(v, q).reduce(0.0) { $0 + Double($1.0) * Double($1.1) }
                    let nv = v.reduce(0.0) { $0 + Double($1) * Double($1) }, nq = q.reduce(0.0) { $0 + Double($1) * Double($1) }
                    switch metric {
                    case .ip: return -dot
                    case .l2: return zip(v, q).reduce(0.0) { $0 + Double($1.0 - $1.1) * Double($1.0 - $1.1) }.squareRoot()
                    case .cosine: return 1 - dot / (nv * nq).squareRoot()
                    }
                }
                let expected = rows.map { (id: $0.key, d: plain($0.value)) }.sorted { $0.d < $1.d }
                #expect(got.count == 10)
                for (hit, want) in zip(got, expected.prefix(10)) {
                    #expect(abs(Double(hit.distance) - want.d) < 1e-4 * max(1, abs(want.d)), "d=\(d) \(metric)")
                }
                // The tenth nearest's distance bounds every row left out.
                let bound = Double(got.last!.distance)
                #expect(expected.dropFirst(10).allSatisfy { $0.d >= bound - 1e-4 })
            }
            let even = m.nearest(to: q, k: 5, metric: .l2, admits: { $0 % 2 == 0 })
            #expect(even.count == 5 && even.allSatisfy { $0.id % 2 == 0 })
            // The same from the candidates' ids (ids not held are skipped).
            #expect(m.nearest(to: q, k: 5, metric: .l2, among: Array(stride(from: Int64(0), to: 400, by: 2))) == even)
            #expect(m.nearest(to: [1], k: 5, metric: .l2).isEmpty == (d != 1))
        }
    }
}
