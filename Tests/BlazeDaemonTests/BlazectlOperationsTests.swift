import BlazeClient
import BlazeConfig
@testable import BlazeDaemon
import BlazeProtocol
import BlazeStore
import BlazeSync
import BlazeTestSupport
import Foundation
import GRDB
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct BlazectlOperations {
    @Test func statusShowsTheDaemonAndEveryDatabase() throws {
        let d = try DaemonProcess()
        let c = try d.connect()
        _ = try c.call("db.create", ["db": "notes"])
        _ = try c.call("doc.put", ["db": "notes", "collection": "n", "id": "1", "doc": ["t": "hi"]])
        var env = isolatedEnvironment(config: d.dir.path + "/config")
        env["BLAZEDB_SOCKET"] = d.socket
        let r = try run(buildDirectory + "/blazectl", ["status"], environment: env)
        #expect(r.status == 0, "\(r.err)")
        let lines = r.out.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        #expect(lines.first?.hasPrefix("● blazed \(blazeVersion) running, pid \(d.pid), up ") == true, "\(r.out)")
        #expect(lines.contains("  socket    \(d.socket)") && lines.contains("  sync      not listening for peers"))
        #expect(!r.out.contains("\u{1B}["), "no colour when not on a terminal")
        let table = Array(lines.drop { !$0.hasPrefix("DATABASE") }).filter { !$0.isEmpty }
        #expect(table.count == 3 && table[0].hasPrefix("DATABASE  COLLECTIONS  DOCUMENTS  SIZE"))
        let notes = table[2].split(separator: " ", omittingEmptySubsequences: true)
        #expect(notes.first == "notes" && notes[1] == "1" && notes[2] == "1" && notes.last == "local", "\(table)")
        let json = try JSONParser().parse(try run(buildDirectory + "/blazectl", ["status", "--json"], environment: env).out)
        #expect(json["databases"]?.arrayValue?.map { $0["name"] } == ["default", "notes"])
        d.stop()
        let down = try run(buildDirectory + "/blazectl", ["status"], environment: env)
        #expect(down.status == 1 && down.err.hasPrefix("blazectl: error: ") && down.err.split(separator: "\n").count == 1)
    }

    @Test func completionScriptsCoverEverySubcommand() throws {
        for shell in ["bash", "zsh", "fish"] {
            let r = try run(buildDirectory + "/blazectl", ["--generate-completion-script", shell])
            #expect(r.status == 0 && r.out.count > 1000, "\(shell): \(r.err)")
            for word in ["backup", "restore", "service", "status", "config", "watch"] {
                #expect(r.out.contains(word), "\(shell) completion lacks \(word)")
            }
        }
    }
}
