import BlazeProtocol
import Foundation
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// A swift-log handler writing one structured line per event to stderr: `key=value` text or a JSON object.
///
/// Every line carries the time (UTC, milliseconds), level, logger label and message, then the metadata sorted by key,
/// so lines are greppable and machine-readable (journald keeps them as they are). Each line goes out in one `write`.
public struct LineLogHandler: LogHandler {
    /// Line formats.
    public enum Format: String, Sendable {
        /// `ts=… level=info logger=blazed msg="Listening" socket.path=/run/…`
        case text
        /// `{"ts":"…","level":"info","logger":"blazed","msg":"Listening","socket.path":"/run/…"}`
        case json
    }

    /// The least severe level written.
    public var logLevel: Logger.Level
    /// Metadata attached to every line of this logger.
    public var metadata: Logger.Metadata = [:]
    let label: String
    let format: Format
    let descriptor: Int32

    /// A handler for `label` writing `format` lines at `level` and above to `descriptor` (stderr by default).
    public init(label: String, level: Logger.Level, format: Format, descriptor: Int32 = 2) {
        self.label = label
        self.logLevel = level
        self.format = format
        self.descriptor = descriptor
    }

    /// Reads or sets one metadata value of this logger.
    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// Writes one line.
    public func log(event: LogEvent) {
        var all = metadata
        if let extra = event.metadata { all.merge(extra) { $1 } }
        var line = Self.line(
            time: Date(), level: event.level, label: label, message: "\(event.message)", metadata: all, format: format)
        line.append("\n")
        var bytes = Array(line.utf8)
        _ = bytes.withUnsafeMutableBytes { write(descriptor, $0.baseAddress, $0.count) }
    }

    /// Formats one line (without its newline).
    static func line(
        time: Date, level: Logger.Level, label: String, message: String, metadata: Logger.Metadata, format: Format
    ) -> String {
        let ts = time.formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: true))
        var fields: [(String, String)] = [("ts", ts), ("level", level.rawValue), ("logger", label), ("msg", message)]
        for key in metadata.keys.sorted() { fields.append((key, "\(metadata[key]!)")) }
        switch format {
        case .json:
            return JSONValue.object(Dictionary(fields.map { ($0.0, JSONValue.string($0.1)) }) { $1 }).jsonText
        case .text:
            return fields.map { "\($0.0)=\(quoted($0.1))" }.joined(separator: " ")
        }
    }

    /// A text value as is when it has no space, quote, `=` or control character; else quoted with JSON escapes.
    static func quoted(_ value: String) -> String {
        let plain = !value.isEmpty && value.unicodeScalars.allSatisfy { $0.value > 0x20 && $0 != "\"" && $0 != "=" && $0.value != 0x7F }
        return plain ? value : JSONValue.string(value).jsonText
    }
}
