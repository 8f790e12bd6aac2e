import Foundation
import Testing

/// Runs the README's tour block command by command against a fresh daemon and compares each output exactly.
@Suite struct ReadmeTour {
    static func readme() throws -> String {
        var dir = URL(fileURLWithPath: #filePath)
        while dir.path != "/" {
            dir.deleteLastPathComponent()
            let candidate = dir.appendingPathComponent("README.md")
            if FileManager.default.fileExists(atPath: candidate.path) { return try String(contentsOf: candidate, encoding: .utf8) }
        }
        throw CocoaError(.fileNoSuchFile)
    }

    /// (command, expected output lines) pairs from the `console` block after the tour marker.
    static func steps() throws -> [(String, [String])] {
        let text = try readme()
        guard let start = text.range(of: "<!-- tour"), let end = text.range(of: "<!-- /tour -->") else { return [] }
        var steps: [(String, [String])] = []
        for line in text[start.upperBound..<end.lowerBound].split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("$ ") {
                steps.append((String(line.dropFirst(2)), []))
            } else if !steps.isEmpty, !line.hasPrefix("```") {
                steps[steps.count - 1].1.append(String(line))
            }
        }
        return steps.map { step in
            var lines = step.1
            while lines.last == "" { lines.removeLast() }
            return (step.0, lines)
        }
    }

    @Test func theTourInTheReadmeWorksAsWritten() throws {
        try Self.runTour(blazectl: buildDirectory + "/blazectl", daemon: try DaemonProcess())
    }

    /// Runs the tour with the `blazectl` at `blazectl` against `daemon` (this build's, or an installed one), then stops
    /// the daemon.
    static func runTour(blazectl: String, daemon d: DaemonProcess, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let steps = try Self.steps()
        #expect(steps.count >= 10, "the README tour is missing", sourceLocation: sourceLocation)
        for (command, expected) in steps {
            // In the daemon's temporary directory, so that files the tour writes (a backup) go away with it.
            let shell = "cd \(d.dir.path) && " + command.replacingOccurrences(of: "blazectl ", with: "\(blazectl) ") + " 2>&1"
            var env = ProcessInfo.processInfo.environment
            env["BLAZEDB_SOCKET"] = d.socket
            let r = try run("/bin/sh", ["-c", shell], environment: env)
            let got = r.out.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
            #expect(
                got.dropLast(got.last == "" ? 1 : 0).elementsEqual(expected),
                "\(command)\nexpected:\n\(expected.joined(separator: "\n"))\ngot:\n\(r.out)", sourceLocation: sourceLocation)
            let shouldFail = expected.first?.hasPrefix("blazectl: error:") ?? false
            #expect((r.status != 0) == shouldFail, "\(command) exited \(r.status)", sourceLocation: sourceLocation)
        }
        d.stop()
    }
}
