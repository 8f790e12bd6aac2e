import ArgumentParser
import BlazeClient
import BlazeConfig
import BlazeProtocol
import BlazeSettings
import Foundation

#if canImport(Glibc)
import Glibc
#endif

@main
struct BlazeCtl: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "blazectl",
        abstract: "Control blazed, the BlazeDB daemon, from the shell.",
        discussion: "Values in key=value arguments are read as JSON when they parse (limit=5 is a number), else as strings.",
        version: "blazectl \(blazeVersion)",
        subcommands: [
            Call.self, Info.self, DB.self, Collection.self, Doc.self, Tx.self, Find.self, Nearest.self, Count.self, Explain.self, Update.self,
            DeleteWhere.self,
            Index.self, Conflict.self, Blob.self, Watch.self, Peer.self, Folder.self, Sync.self, Status.self, Doctor.self, StudioCommand.self, Config.self, Service.self,
        ])
}

/// Options every subcommand shares.
struct Global: ParsableArguments {
    @Option(help: "Daemon socket (default: $BLAZEDB_SOCKET, else $XDG_RUNTIME_DIR/blazedb/blazed.sock).")
    var socket: String?

    @Flag(help: "Print the exact JSON result instead of human output.")
    var json = false

    /// `--socket`, else the daemon's `socket` setting (`BLAZEDB_SOCKET`, the configuration file, the default).
    var socketPath: String {
        if let socket { return socket }
        do {
            let settings = try BlazedSettings.resolver.resolve(
                flags: [:], environment: ProcessInfo.processInfo.environment, configFile: nil)
            return settings[BlazedSettings.socket]
        } catch {
            fail("\(error)")
        }
    }

    /// Calls a method, printing a one-line error and exiting non-zero on failure.
    func call(_ method: String, _ params: [String: JSONValue]) throws -> JSONValue {
        withConnection { try $0.call(method, params) }
    }

    /// Runs `body` on a new connection; any error is printed as one line and exits non-zero.
    func withConnection<T>(_ body: (BlazeConnection) throws -> T) -> T {
        do {
            let connection = try BlazeConnection(socketPath: socketPath)
            defer { connection.close() }
            return try body(connection)
        } catch let e as RPCError {
            fail(describe(e))
        } catch {
            fail("\(error)")
        }
    }

    /// Prints `result` as JSON with --json, else with `human`.
    func output(_ result: JSONValue, human: (JSONValue) -> Void) {
        if json { print(result.jsonText) } else { human(result) }
    }

    /// Calls `P`'s method; prints the exact JSON result with --json, else hands the typed result to `human`.
    func run<P: RPCParameters>(_ params: P, human: (P.Result) -> Void) {
        let result = withConnection { try $0.call(P.method.rawValue, params.jsonObject) }
        if json {
            print(result.jsonText)
            return
        }
        do {
            human(try P.decode(result))
        } catch {
            fail("the result of \(P.method.rawValue) does not match the protocol document: \(error)")
        }
    }

    /// Like `run`, for params that carry JSON the user typed: checked here first, with the daemon's own messages.
    func run<P: RPCParameters>(_ type: P.Type, _ raw: [String: JSONValue], human: (P.Result) -> Void) {
        do {
            run(try P(validating: raw), human: human)
        } catch {
            fail(describe(error))
        }
    }
}

/// Writes one line to standard output at once (no stdio buffering).
func emit(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    var offset = 0
    while offset < bytes.count {
        let n = bytes[offset...].withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
        if n <= 0 { exit(0) }  // stdout closed (e.g. piped into head): stop quietly
        offset += n
    }
}

/// "message [code kind]", how blazectl shows a daemon error.
func describe(_ e: RPCError) -> String { "\(e.message) [\(e.code) \(e.kind)]" }

/// Writes `text` to standard error.
func printError(_ text: String) {
    _ = Array(text.utf8).withUnsafeBytes { write(2, $0.baseAddress, $0.count) }
}

func fail(_ message: String) -> Never {
    printError("blazectl: error: \(message)\n")
    exit(1)
}

/// Parses a JSON argument, failing with a one-line error naming the argument.
func parseJSON(_ text: String, _ what: String) -> JSONValue {
    do { return try JSONParser().parse(text) } catch { fail("\(what) is not valid JSON: \(error)") }
}

/// Prints rows as an aligned table with a header.
func printTable(_ header: [String], _ rows: [[String]]) {
    print(TextTable.render(header, rows))
}

/// Pads `s` with spaces to `width` characters.
func pad(_ s: String, _ width: Int) -> String {
    s.count >= width ? s : s + String(repeating: " ", count: width - s.count)
}

func text(_ v: JSONValue?) -> String {
    switch v {
    case nil: return ""
    case .string(let s)?: return s
    case let other?: return other.jsonText
    }
}
