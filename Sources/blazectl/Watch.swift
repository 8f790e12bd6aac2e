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
        var filterObject: [String: JSONValue]?
        if let filter {
            guard case .object(let object) = parseJSON(filter, "filter") else { fail("the filter must be a JSON object") }
            filterObject = object
        }
        global.withConnection { connection in
            let started = try connection.call(
                RPC.Subscribe(db: db, collection: collection, where: filterObject, since: since.map { Int($0) }))
            if !global.json {
                printError("watching \(db)\(collection.map { "/" + $0 } ?? "") after seq \(started.seq)\n")
            }
            var printed = 0
            while true {
                let n = try connection.nextNotification(RPCNotification.Subscription.self)
                guard n.subscription == started.subscription else { continue }
                if let error = n.error {
                    let e = RPCError(json: error.json) ?? RPCError(code: error.code, kind: "unknown", message: error.message)
                    fail("subscription ended: " + describe(e))
                }
                for event in n.events ?? [] {
                    // Unbuffered: a watcher piped into another program sees each event as it happens.
                    if global.json {
                        emit(event.json.jsonText)
                    } else {
                        let doc = event.doc.map { " " + $0.jsonText } ?? ""
                        emit("\(event.seq)  \(pad(event.type.rawValue, 6))  \(event.collection)/\(event.id)\(doc)")
                    }
                    printed += 1
                    if let count, printed >= count { return }
                }
            }
        }
    }
}
