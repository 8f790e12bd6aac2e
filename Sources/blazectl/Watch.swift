import ArgumentParser
import BlazeClient
import BlazeProtocol

struct Watch: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print changes as they happen: one line per event (seq, type, collection/id, document).",
        discussion: """
            With a filter, a live query: documents entering and leaving the result are reported as enter and leave.
            Runs until interrupted, until --count events were printed, or until the subscription ends (exit 1).
            """)
    @OptionGroup var global: Global
    @Argument var db: String
    @Argument(help: "Only this collection.") var collection: String?
    @Argument(help: #"Filter as JSON, e.g. '{"done":false}'."#) var filter: String?
    @Option(help: "Replay the changes after this feed sequence first.") var since: Int64?
    @Option(help: "Exit after printing this many events.") var count: Int?

    func run() throws {
        if let count, count < 1 { fail("--count must be at least 1") }
        var p: [String: JSONValue] = ["db": .string(db)]
        if let collection { p["collection"] = .string(collection) }
        if let filter { p["where"] = parseJSON(filter, "filter") }
        if let since { p["since"] = .int(since) }
        global.withConnection { connection in
            let started = try connection.call("subscribe", p)
            if !global.json {
                printError("watching \(db)\(collection.map { "/" + $0 } ?? "") after seq \(text(started["seq"]))\n")
            }
            var printed = 0
            while true {
                let n = try connection.nextNotification()
                guard n["method"] == "subscription" else { continue }
                if let err = n["params"]?["error"], let e = RPCError(json: err) {
                    fail("subscription ended: " + describe(e))
                }
                for event in n["params"]?["events"]?.arrayValue ?? [] {
                    // Unbuffered: a watcher piped into another program sees each event as it happens.
                    if global.json {
                        emit(event.jsonText)
                    } else {
                        let doc = event["doc"].map { " " + $0.jsonText } ?? ""
                        emit("\(text(event["seq"]))  \(pad(text(event["type"]), 6))  \(text(event["collection"]))/\(text(event["id"]))\(doc)")
                    }
                    printed += 1
                    if let count, printed >= count { return }
                }
            }
        }
    }
}
