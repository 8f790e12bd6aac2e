/// Aligned plain-text tables, as `blazed --print-config` and `blazectl` print them.
public enum TextTable {
    /// The header and rows as lines, each column padded to its widest cell, columns two spaces apart.
    /// ANSI colour sequences (`ESC [ … m`) in cells take no width.
    public static func render(_ header: [String], _ rows: [[String]]) -> String {
        var widths = header.map(visibleWidth)
        for row in rows {
            for (i, cell) in row.enumerated() where i < widths.count { widths[i] = max(widths[i], visibleWidth(cell)) }
        }
        func line(_ cells: [String]) -> String {
            cells.enumerated().map { i, c in
                let w = visibleWidth(c)
                return i == cells.count - 1 || w >= widths[i] ? c : c + String(repeating: " ", count: widths[i] - w)
            }.joined(separator: "  ")
        }
        return ([line(header)] + rows.map(line)).joined(separator: "\n")
    }

    /// Characters of `text` outside ANSI colour sequences.
    public static func visibleWidth(_ text: String) -> Int {
        var width = 0
        var inEscape = false
        for c in text.unicodeScalars {
            if inEscape {
                if c == "m" { inEscape = false }
            } else if c == "\u{1B}" {
                inEscape = true
            } else {
                width += 1
            }
        }
        return width
    }
}

/// `blazed --print-config` and `blazectl config show` as text.
public enum ConfigTable {
    /// One row per setting: name, effective value, source; then the file read.
    public static func render(_ config: ResolvedConfig) -> String {
        let rows = config.entries.map { [$0.key.name, $0.key.shown($0.value).description, $0.source.description] }
        return TextTable.render(["SETTING", "VALUE", "SOURCE"], rows) + "\nconfiguration file: "
            + (config.file ?? "(none)")
    }
}
