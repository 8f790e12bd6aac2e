import ArgumentParser
import BlazeClient
import BlazeProtocol
import Foundation

/// `blazectl blob`: files stored in a database (ARCHITECTURE.md, "Blobs").
struct Blob: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Store files in a database and read them back.",
        discussion: """
            A blob is stored once per database however often it is put, and an edited file stores only the chunks \
            around the edit. Put prints the reference a document holds ({"$blob": ...}).
            """,
        subcommands: [Put.self, Get.self, Stat.self, GC.self])

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
            let result = global.withConnection { c in
                let size = try c.call(RPC.BlobStat(db: db, blob: blob)).size
                return try withProgress("writing \(path)", watching: target + ".partial", total: Int64(size)) {
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
