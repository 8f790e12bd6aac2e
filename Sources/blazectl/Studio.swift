import ArgumentParser
import BlazeClient
import BlazeStudio
import Foundation
import Logging
import Synchronization

/// `blazectl studio`: serves BlazeDB Studio on loopback until interrupted.
struct StudioCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "studio",
        abstract: "Serve BlazeDB Studio, a web app to browse, edit and watch the daemon's data and sync, on loopback.",
        discussion: "Prints the address to open, with a new random token in it; a page without that token is refused. "
            + "Studio talks to blazed through its JSON-RPC methods over a WebSocket bridged to the daemon's socket. "
            + "Stops on Ctrl-C or SIGTERM.")
    @OptionGroup var global: Global
    @Option(help: "Loopback address to listen on: 127.0.0.1, ::1 or localhost.") var host = "127.0.0.1"
    @Option(help: "Port to listen on (0 picks a free one).") var port = 0

    func run() throws {
        let socket = global.socketPath
        // The daemon must answer before a page can use it.
        _ = global.withConnection { try $0.call("daemon.info", [:]) }
        let studio: Studio
        do {
            studio = try Studio(socketPath: socket, host: host, port: port)
        } catch {
            fail("\(error)")
        }
        var logger = Logger(label: "blazectl.studio")
        logger.logLevel = .warning
        let done = DispatchSemaphore(value: 0)
        let outcome = LockedBox<(any Error)?>(nil)
        Task {
            do {
                try await studio.run(logger: logger) { port in
                    // Written at once, not buffered: a script reads the address from a pipe.
                    let line = "BlazeDB Studio for \(socket)\nopen \(studio.url(port: port))\n"
                    FileHandle.standardOutput.write(Data(line.utf8))
                }
            } catch {
                outcome.set(error)
            }
            done.signal()
        }
        done.wait()
        if let error = outcome.get() { fail("studio: \(error)") }
    }
}

/// A value shared between a task and the thread waiting for it.
final class LockedBox<T: Sendable>: Sendable {
    private let value: Mutex<T>

    init(_ value: T) { self.value = Mutex(value) }

    /// Sets the value.
    func set(_ v: T) { value.withLock { $0 = v } }

    /// The value.
    func get() -> T { value.withLock { $0 } }
}
