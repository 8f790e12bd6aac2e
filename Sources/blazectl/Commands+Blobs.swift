import ArgumentParser
import BlazeClient
import BlazeProtocol
import Foundation
import Synchronization

/// `blazectl blob`: files stored in a database (ARCHITECTURE.md, "Blobs").
struct Blob: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Store files in a database and read them back.",
        discussion: """
            A blob is stored once per database however often it is put, and an edited file stores only the chunks \
            around the edit. Put prints the reference a document holds ({"$blob": ...}).
            """,
        subcommands: [Put.self, Get.self, Stat.self, List.self, Pin.self, Unpin.self, Policy.self, GC.self])

    struct Put: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Store a file as a blob (the daemon reads it).")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument(help: "The file to store (relative to the current directory).") var file: String
        @Option(help: "Media type, e.g. image/jpeg (default application/octet-stream).") var type: String?
        func run() throws {
            let source = absolutePath(file)
            let result = global.withConnection { c in try c.call(RPC.BlobPut(db: db, path: source, type: type)) }
            global.output(result.json) { _ in
                print("stored \(file) as blob \(result.blob.id): \(byteCount(Int64(result.blob.size))), \(result.chunks) chunks, \(byteCount(Int64(result.storedBytes))) new")
                print("reference: \(result.ref.jsonText)")
            }
        }
    }

    struct Get: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write a blob to a new file.", discussion: "The file appears only when complete and is never overwritten.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument(help: "The blob's id.") var blob: String
        @Argument(help: "The file to create (relative to the current directory).") var path: String
        func run() throws {
            let target = absolutePath(path)
            let (socket, db, blob) = (global.socketPath, db, blob)
            let result = global.withConnection { c in
                let size = try c.call(RPC.BlobStat(db: db, blob: blob)).size
                // The file is written unnamed until it is whole: the line shows the blob's bytes held here, which grow
                // as chunks are fetched (asked on a connection of its own: this one waits for the get). `blob.stat`
                // looks at every chunk of the blob, so it is asked once a second; a failed ask keeps the last figure
                // and opens a new connection next time.
                let poll = Mutex<(connection: BlazeConnection?, held: Int64, asked: Date)>((nil, 0, .distantPast))
                return try withProgress("fetching \(path)", total: Int64(size), measure: {
                    poll.withLock { p in
                        guard Date().timeIntervalSince(p.asked) >= 1 else { return p.held }
                        p.asked = Date()
                        if p.connection == nil { p.connection = try? BlazeConnection(socketPath: socket, timeoutSeconds: 5) }
                        if let held = try? p.connection?.call(RPC.BlobStat(db: db, blob: blob)).heldBytes {
                            p.held = Int64(held)
                        } else {
                            p.connection = nil
                        }
                        return p.held
                    }
                }) {
                    try c.call(RPC.BlobGet(db: db, blob: blob, path: target))
                }
            }
            global.output(result.json) { _ in print("wrote \(path): \(byteCount(Int64(result.bytes)))") }
        }
    }

    struct Stat: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show a blob's size and which of its chunks this device holds.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument(help: "The blob's id.") var blob: String
        func run() throws {
            let result = global.withConnection { c in try c.call(RPC.BlobStat(db: db, blob: blob)) }
            global.output(result.json) { _ in
                print("blob \(result.id): \(byteCount(Int64(result.size))) in \(result.chunks) chunks, \(result.heldChunks) held here (\(byteCount(Int64(result.heldBytes))))")
            }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "ls", abstract: "List the blobs the database's documents refer to and those pinned here.",
            discussion: "One line per blob: its id, size, how much of it this device holds, and whether it is pinned.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Option(help: "At most this many blobs (all by default).") var limit: Int?
        func run() throws {
            let blobs = global.withConnection { c in
                var out: [RPC.BlobList.Result.Blob] = []
                var after: String?
                repeat {
                    let page = try c.call(RPC.BlobList(db: db, after: after, limit: min(1000, limit.map { $0 - out.count } ?? 1000)))
                    out += page.blobs
                    after = page.next
                } while after != nil && out.count < (limit ?? .max)
                return out
            }
            global.output(.array(blobs.map(\.json))) { _ in
                for b in blobs {
                    let held = b.chunks.map { "\(b.heldChunks)/\($0) chunks here" } ?? "not here"
                    print("\(b.id)  \(byteCount(Int64(b.size)))  \(b.type ?? "-")  \(held)\(b.pinned ? "  pinned" : "")")
                }
                if blobs.isEmpty { print("no blobs") }
            }
        }
    }

    struct Pin: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Keep a blob on this device: fetch what it lacks now, in the background, and keep it.")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument(help: "The blob's id.") var blob: String
        func run() throws {
            let result = global.withConnection { c in try c.call(RPC.BlobPin(db: db, blob: blob)) }
            global.output(result.json) { _ in print(result.already ? "blob \(blob) was pinned already" : "pinned blob \(blob)") }
        }
    }

    struct Unpin: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Stop keeping a pinned blob (its chunks stay while documents refer to it).")
        @OptionGroup var global: Global
        @Argument var db: String
        @Argument(help: "The blob's id.") var blob: String
        func run() throws {
            let result = global.withConnection { c in try c.call(RPC.BlobUnpin(db: db, blob: blob)) }
            global.output(result.json) { _ in print(result.was ? "unpinned blob \(blob)" : "blob \(blob) was not pinned") }
        }
    }

    struct Policy: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show or set which collections' blobs this device fetches as their documents arrive.",
            discussion: """
                With --eager the policy is replaced (without --max-bytes: no size bound); --max-bytes alone keeps the \
                collections. --eager '*' is every collection, --eager none is none.
                """)
        @OptionGroup var global: Global
        @Argument var db: String
        @Option(help: "Collections whose blobs are fetched eagerly, comma-separated ('*': all; 'none').") var eager: String?
        @Option(help: "The largest blob fetched eagerly, in bytes.") var maxBytes: Int?
        func run() throws {
            let names = eager.map { $0 == "none" ? [] : $0.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) } }
            let result = global.withConnection { c in
                // The call replaces the whole policy: --max-bytes alone keeps the collections.
                let kept = names == nil && maxBytes != nil ? try c.call(RPC.BlobPolicy(db: db)).eager : nil
                return try c.call(RPC.BlobPolicy(db: db, eager: names ?? kept, maxBytes: maxBytes))
            }
            global.output(result.json) { _ in
                let collections = result.eager.isEmpty ? "none" : result.eager.joined(separator: ", ")
                print("eager: \(collections); largest fetched eagerly: \(result.maxBytes.map { byteCount(Int64($0)) } ?? "any size")")
            }
        }
    }

    struct GC: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "gc", abstract: "Remove the chunks of blobs nothing in the database refers to any more.",
            discussion: """
                Blobs of deleted documents stay while history holds them (until compaction drops it); a blob put \
                within the grace period stays whatever refers to it. The daemon also does this after each compaction.
                """)
        @OptionGroup var global: Global
        @Argument var db: String
        @Option(help: "Keep chunks written within this many seconds (default 86400).") var grace: Int?
        func run() throws {
            let result = global.withConnection { c in try c.call(RPC.BlobGc(db: db, graceSeconds: grace)) }
            global.output(result.json) { _ in
                print("removed \(result.removedChunks) chunks (\(byteCount(Int64(result.removedBytes)))); \(result.keptChunks) kept (\(byteCount(Int64(result.keptBytes))))")
            }
        }
    }
}
