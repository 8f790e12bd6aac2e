import BlazeClient
import BlazeProtocol
import BlazeTestSupport
import Foundation
import Logging
import Synchronization
import Testing

@testable import BlazeDaemon
@testable import BlazeStore

/// How client connections share the daemon's event loops (`ClientLoops`), through an in-process daemon.
@Suite struct ClientLoopTests {
    /// A daemon serving every client connection on one event loop, running until `stop`.
    final class OneLoopDaemon {
        let dir = TempDir()
        let daemon: Daemon
        let serving: Task<Void, any Error>
        var socket: String { daemon.config.socketPath }

        init() async throws {
            var config = DaemonConfig(socketPath: dir.path + "/blazed.sock", dataDirectory: dir.path + "/data")
            config.defaultDatabase = "main"
            config.compactionIntervalMs = 0
            config.clientLoopThreads = 1
            let daemon = try Daemon(config: config, logger: Logger(label: "test"))
            self.daemon = daemon
            serving = Task { try await daemon.run() }
            await daemon.waitUntilListening()
        }

        /// A test that failed before `stop` still ends the daemon.
        deinit { serving.cancel() }

        func stop() async throws {
            serving.cancel()
            try await serving.value
        }
    }

    @Test func aWriteFromAConnectionSharingItsLoopWaitsForTheWriterWithoutHoldingTheLoop() async throws {
        let d = try await OneLoopDaemon()
        let (socket, db) = (d.socket, try d.daemon.store.database("main"))
        // Blocking client calls run on a thread of their own, not on the test's executor.
        let seen = try await onThread {
            let reader = try BlazeConnection(socketPath: socket, timeoutSeconds: 30)
            defer { reader.close() }
            _ = try reader.call("doc.put", ["db": "main", "collection": "c", "id": "r", "doc": ["n": 1]])
            // Hold the database's writer, as a long transaction would.
            let held = DispatchSemaphore(value: 0)
            let release = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                _ = try? db.write { _ in
                    held.signal()
                    release.wait()
                }
            }
            let heldInTime = held.wait(timeout: .now() + 30) == .success
            let inserted = Mutex<Result<JSONValue, any Error>?>(nil)
            let insertDone = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                let r = Result {
                    // A second connection on the loop.
                    let writer = try BlazeConnection(socketPath: socket, timeoutSeconds: 60)
                    defer { writer.close() }
                    return try writer.call("doc.insert", ["db": "main", "collection": "c", "doc": ["_id": "w"]])
                }
                inserted.withLock { $0 = r }
                insertDone.signal()
            }
            // The insert is queued for the writer, not committing on the loop (where it would wait for the writer).
            let queued = eventually { db.groupCommitter.queuedCount == 1 }
            // Meanwhile the loop still answers the other connection.
            let read = try? reader.call("doc.get", ["db": "main", "collection": "c", "id": "r"])
            let insertedMeanwhile = inserted.withLock { $0 } != nil
            release.signal()
            let insertedInTime = insertDone.wait(timeout: .now() + 60) == .success
            return (
                heldInTime: heldInTime, queued: queued, read: read?["doc"]?["n"], insertedMeanwhile: insertedMeanwhile,
                insertedInTime: insertedInTime, inserted: inserted.withLock { r in (try? r?.get())?["id"] })
        }
        #expect(seen.heldInTime)
        #expect(seen.queued)
        #expect(seen.read == .int(1))
        #expect(!seen.insertedMeanwhile)
        #expect(seen.insertedInTime)
        #expect(seen.inserted == "w")
        try await d.stop()
    }
}

/// Runs `body` on a new thread and returns what it returns.
func onThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread { continuation.resume(with: Result { try body() }) }
    }
}

/// What an in-process daemon leaves behind when it cannot start.
@Suite struct DaemonStartupFailureTests {
    @Test func aDaemonThatFailsToStartStopsServingItsSocket() async throws {
        let dir = TempDir()
        var config = DaemonConfig(socketPath: dir.path + "/blazed.sock", dataDirectory: dir.path + "/data")
        config.compactionIntervalMs = 0
        config.syncListen = "not an address"
        let daemon = try Daemon(config: config, logger: Logger(label: "test"))
        await #expect(throws: DaemonError.self) { try await daemon.run() }
        // The socket it had bound is closed and gone: nothing answers there any more.
        #expect(!FileManager.default.fileExists(atPath: config.socketPath))
        #expect(throws: (any Error).self) { try BlazeConnection(socketPath: config.socketPath, timeoutSeconds: 5) }
        daemon.store.closeAll()
    }
}
