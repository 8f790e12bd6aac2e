import BlazeClient
import Foundation
import Synchronization

/// Local writers of the sync fuzzer: each writes new documents to one daemon until told to stop, reconnecting while
/// its daemon restarts; what was acknowledged and how many writes went unanswered (the daemon went away first).
final class LocalWriters: Sendable {
    let stopping = Atomic<Bool>(false)
    let acknowledged = Mutex<[String]>([])
    let unanswered = Atomic<Int>(0)
    let group = DispatchGroup()

    /// Starts one writer per socket; each tags its ids with the matching tag and writes at most 1,000 documents.
    init(sockets: [(socket: String, tag: String)]) {
        for (socket, tag) in sockets {
            group.enter()
            Thread { [self] in
                defer { group.leave() }
                var client: BlazeConnection?
                var i = 0
                while !stopping.load(ordering: .relaxed) && i < 1_000 {
                    guard let c = client ?? (try? BlazeConnection(socketPath: socket, timeoutSeconds: 60)) else {
                        usleep(50_000)  // the daemon is restarting: try again in a moment
                        continue
                    }
                    client = c
                    let id = "\(tag)\(i)"
                    i += 1
                    do {
                        _ = try c.call("doc.put", ["db": "team", "collection": "local", "id": .string(id), "doc": ["i": .int(Int64(i))]])
                        acknowledged.withLock { $0.append(id) }
                    } catch {
                        unanswered.add(1, ordering: .relaxed)
                        client = nil
                    }
                }
            }.start()
        }
    }

    /// Stops the writers and waits (bounded) for them.
    func stop() -> Bool {
        stopping.store(true, ordering: .relaxed)
        return group.wait(timeout: .now() + 120) == .success
    }
}
