// Writes a Swift file declaring `openRPCDocumentText`, the text of a JSON document, for the EmbedProtocolDocument
// build plugin. Usage: EmbedDocument <input.json> <output.swift>
import Foundation

let arguments = CommandLine.arguments
guard arguments.count == 3 else {
    FileHandle.standardError.write(Data("usage: EmbedDocument <input.json> <output.swift>\n".utf8))
    exit(2)
}
do {
    let text = try String(contentsOfFile: arguments[1], encoding: .utf8)
    // A raw string literal whose delimiter does not occur in the text.
    var hashes = "#"
    while text.contains("\"\"\"" + hashes) || text.contains("\"" + hashes) { hashes += "#" }
    let source = """
        // Generated at build time by the EmbedProtocolDocument plugin from Protocol/blazedb.openrpc.json.

        /// The protocol document, served verbatim by `rpc.discover`.
        let openRPCDocumentText = \(hashes)\"\"\"
        \(text.hasSuffix("\n") ? String(text.dropLast()) : text)
        \"\"\"\(hashes)

        """
    try source.write(toFile: arguments[2], atomically: true, encoding: .utf8)
} catch {
    FileHandle.standardError.write(Data("EmbedDocument: \(error)\n".utf8))
    exit(1)
}
