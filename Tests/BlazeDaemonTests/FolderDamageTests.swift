// Folder sync when the files are damaged: a clumsy folder tool that copies badly, and a writer killed in the
// middle of an append. The devices and helpers are in FolderTests.swift.

import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

extension FolderTests {
    /// Copies that arrive late, partial, damaged, rolled back or torn: refused and counted, never taken as data.
    @Suite struct Damage {
        @Test func aFolderToolThatCopiesBadlyCorruptsNothingAndEveryRejectionIsCounted() throws {
            // A and B each see their own copy of the folder; a clumsy "folder tool" in this test copies between the two
            // with delays, partial copies, duplicates under conflict names, reordering, damage and rollbacks.
            let team = try FolderTeam(count: 2, arguments: ["--folder-poll-interval", "0.05"])
            let (x, y) = (TempDir(), TempDir())
            let (a, b) = (team.clients[0], team.clients[1])
            _ = try a.call("folder.add", ["db": "team", "path": .string(x.path)])
            _ = try b.call("folder.add", ["db": "team", "path": .string(y.path)])
            let space = try spaceOf(a)
            var tool = ClumsyFolderTool(
                seed: testSeed("clumsy folder tool"),
                routes: [(x.path + "/" + space + "/" + team.nodes[0], y.path + "/" + space + "/" + team.nodes[0]),
                         (y.path + "/" + space + "/" + team.nodes[1], x.path + "/" + space + "/" + team.nodes[1])])
            // A starts a shared counter; once B has it, both write and count concurrently.
            _ = try a.call("doc.put", ["db": "team", "collection": "log", "id": "counter", "doc": ["hits": 0]])
            var rounds = 0
            while rounds < 2000, (try? b.call("doc.get", ["db": "team", "collection": "log", "id": "counter"])) == nil {
                try tool.round(finishing: rounds > 20)
                rounds += 1
                usleep(10_000)
            }
            var written = 0
            let deadline = Date().addingTimeInterval(90)
            var converged = false
            while Date() < deadline {
                if written < 120 {
                    for _ in 0..<6 {
                        let (c, who) = written % 2 == 0 ? (a, "a") : (b, "b")
                        _ = try c.call("doc.put", ["db": "team", "collection": "log", "id": .string("\(who)\(written)"), "doc": ["n": .int(Int64(written))]])
                        _ = try c.call("doc.patch", ["db": "team", "collection": "log", "id": "counter", "incr": ["hits": 1]])
                        written += 1
                    }
                }
                try tool.round(finishing: written >= 120)
                // Equal documents are not enough: two replicas that each lack the other's last increment show the same
                // counter value. Equal version vectors say both hold every change.
                if written >= 120, tool.quiet, try versionVector(a) == versionVector(b),
                    try replicaState(a, "team") == replicaState(b, "team"), try replicaState(a, "team").docs == 121
                {
                    converged = true
                    break
                }
                // One round of the tool per pass; the daemons poll every 50 ms.
                usleep(20_000)
            }
            #expect(converged, "A and B converge through the clumsy tool (\(tool.stats))")
            let hits = (try a.call("doc.get", ["db": "team", "collection": "log", "id": "counter"])["doc"]?["hits"], try b.call("doc.get", ["db": "team", "collection": "log", "id": "counter"])["doc"]?["hits"])
            let states = (try replicaState(a, "team"), try replicaState(b, "team"))
            #expect(hits.0 == 120 && hits.1 == 120, "\(String(describing: hits)) \(states)")
            // The tool did every kind of damage, and each reached a daemon's counters as a refusal, never as data.
            #expect(
                tool.stats.partial > 0 && tool.stats.conflictCopies > 0 && tool.stats.rollbacks > 0 && tool.stats.damaged > 0
                    && tool.stats.deleted > 0, "\(tool.stats)")
            var rejected: [String: Int] = [:]
            func count() throws {
                rejected = [:]
                for (c, path) in [(a, x.path), (b, y.path)] {
                    for (k, v) in try folderStatus(c, path)["rejected"]?.objectValue ?? [:] {
                        rejected[k, default: 0] += Int(v.intValue ?? 0)
                    }
                    #expect(try c.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["forks"] == [])
                }
            }
            try count()
            // One more rollback for certain: B's copy of A's head file goes back to its first version.
            let rollbacksBefore = rejected["rollback", default: 0]
            let headCopy = y.path + "/" + space + "/" + team.nodes[0] + "/head"
            try #require(tool.history[headCopy]?.first).write(to: URL(fileURLWithPath: headCopy))
            #expect(try eventually { try count(); return rejected["rollback", default: 0] > rollbacksBefore }, "\(rejected)")
            #expect(rejected["torn_record", default: 0] + rejected["malformed", default: 0] > 0, "\(rejected)")
            for c in [a, b] {
                let check = try c.call("db.info", ["db": "team"])
                #expect(check["documents"] == 121)
            }
            team.stopAll()
        }

        @Test func killNineWhileAppendingLeavesNoTornEntryAcceptedAndTheWriterContinuesItsChain() throws {
            var team = try FolderTeam(count: 2, arguments: ["--folder-poll-interval", "0.05"])
            let folder = TempDir()
            let (a, b) = (team.clients[0], team.clients[1])
            for c in [a, b] { _ = try c.call("folder.add", ["db": "team", "path": .string(folder.path)]) }
            let space = try spaceOf(a)
            // A writes in a burst and is killed in the middle of it.
            let daemonA = team.daemons[0]
            let writer = Thread {
                guard let a = try? daemonA.connect() else { return }
                for i in 0..<2000 {
                    guard (try? a.call("doc.put", ["db": "team", "collection": "burst", "id": .string("d\(i)"), "doc": ["i": .int(Int64(i))]])) != nil
                    else { return }
                }
            }
            writer.start()
            let dirA = folder.path + "/" + space + "/" + team.nodes[0]
            #expect(eventually { (try? count(b, "burst")) ?? 0 > 50 })
            team.daemons[0].kill9()
            // What a crash can leave behind at the end of the segment: a record cut short, then one whose checksum fails.
            let segment = dirA + "/" + (filesUnder(dirA).filter { $0.hasSuffix(".seg") }.max() ?? "")
            let handle = try #require(FileHandle(forWritingAtPath: segment))
            handle.seekToEndOfFile()
            handle.write(Data([0, 0, 4, 0] + [UInt8](repeating: 7, count: 8) + [UInt8](repeating: 0xAB, count: 1024)))
            try handle.close()
            #expect(eventually { (try? folderStatus(b, folder.path)["rejected"]?["torn_record"]?.intValue ?? 0) ?? 0 >= 1 })
            let heldByB = try replicaState(b, "team")
            // A starts again: it cuts the torn bytes off, continues its chain, and B follows without a fork.
            try team.restart(0)
            let a2 = team.clients[0]
            let before = try ownSeq(a2, "team")
            for i in 0..<20 {
                _ = try a2.call("doc.put", ["db": "team", "collection": "after", "id": .string("z\(i)"), "doc": ["i": .int(Int64(i))]])
            }
            #expect(try ownSeq(a2, "team") == before + 20)
            #expect(try eventually { try replicaState(b, "team") == replicaState(a2, "team") })
            #expect(try replicaState(b, "team").docs >= heldByB.docs + 20)
            #expect(try b.call("sync.status", ["db": "team"])["databases"]?.arrayValue?.first?["forks"] == [])
            let bad = try folderStatus(b, folder.path)["rejected"]?.objectValue ?? [:]
            #expect(Set(bad.keys).isSubset(of: ["torn_record"]), "\(bad)")
            #expect(team.daemons[0].logText.contains("torn record"))
            team.stopAll()
        }
    }
}

/// A folder tool that does its job badly: it copies each writer's directory from one folder to the other with
/// random delays and in random order, copies files in part first, keeps duplicates under conflict names, damages
/// copies, loses copies for a while, and now and then hands back an older version of a file it copied before.
struct ClumsyFolderTool {
    var random: SeededRandom
    let routes: [(from: String, to: String)]
    /// Earlier versions of copied files, by destination path.
    var history: [String: [Data]] = [:]
    var stats = Stats()
    /// True when the last round copied nothing new.
    var quiet = false

    struct Stats: CustomStringConvertible {
        var copies = 0, partial = 0, conflictCopies = 0, rollbacks = 0, damaged = 0, deleted = 0
        var description: String {
            "copies \(copies), partial \(partial), conflict copies \(conflictCopies), rollbacks \(rollbacks), damaged \(damaged), "
                + "deleted \(deleted)"
        }
    }

    init(seed: UInt64, routes: [(String, String)]) {
        random = SeededRandom(seed: seed)
        self.routes = routes.map { (from: $0.0, to: $0.1) }
    }

    /// One round over every file of every route. When `finishing`, every file ends up an exact copy (after any
    /// mischief done in the round), so that the sides can converge.
    mutating func round(finishing: Bool) throws {
        quiet = true
        let fm = FileManager.default
        for route in routes {
            try fm.createDirectory(atPath: route.to, withIntermediateDirectories: true)
            for name in ((try? fm.contentsOfDirectory(atPath: route.from)) ?? []).shuffled(using: &random) where !name.hasSuffix(".tmp") {
                guard let source = fm.contents(atPath: route.from + "/" + name) else { continue }
                let target = route.to + "/" + name
                let current = fm.contents(atPath: target)
                if current == source { continue }
                quiet = false
                // Late: this file waits for a later round.
                if !finishing && Int.random(in: 0..<3, using: &random) == 0 { continue }
                // Each kind of mischief once as soon as a file allows it, then at random.
                let owed = [
                    stats.rollbacks == 0 && history[target]?.first.map { $0 != current } == true ? 0 : nil,
                    stats.partial == 0 && source.count > 64 ? 1 : nil,
                    stats.damaged == 0 && name.hasSuffix(".seg") && source.count > 200 ? 2 : nil,
                    stats.conflictCopies == 0 ? 3 : nil,
                    stats.deleted == 0 && current != nil ? 4 : nil,
                ].compactMap { $0 }.first
                let roll = finishing ? Int.random(in: 2..<10, using: &random) : owed ?? Int.random(in: 0..<10, using: &random)
                if !finishing && roll == 0, let old = history[target]?.first, old != current {
                    // Hands back an older version.
                    try old.write(to: URL(fileURLWithPath: target))
                    stats.rollbacks += 1
                    continue
                }
                if !finishing && roll == 4 && current != nil {
                    // Loses the copy for a while.
                    try FileManager.default.removeItem(atPath: target)
                    stats.deleted += 1
                    continue
                }
                if !finishing && roll == 1 && source.count > 64 {
                    // A partial copy, written in place.
                    let cut = Int.random(in: 1..<source.count, using: &random)
                    try source.prefix(cut).write(to: URL(fileURLWithPath: target))
                    stats.partial += 1
                    continue
                }
                if roll == 2 && name.hasSuffix(".seg") && source.count > 200 {
                    // A damaged duplicate under a conflict name: one byte flipped in its last record.
                    var bad = source
                    bad[bad.count - 10] ^= 0x40
                    try bad.write(to: URL(fileURLWithPath: route.to + "/" + name + ".sync-conflict-20261123-\(stats.damaged)"))
                    stats.damaged += 1
                }
                if roll == 3 {
                    try source.write(to: URL(fileURLWithPath: target.replacingOccurrences(of: ".seg", with: "") + " (conflicted copy \(stats.conflictCopies))"))
                    stats.conflictCopies += 1
                }
                try source.write(to: URL(fileURLWithPath: target), options: .atomic)
                history[target, default: []].append(source)
                stats.copies += 1
            }
        }
    }
}
