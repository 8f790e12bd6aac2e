import PackagePlugin

/// Embeds `Protocol/blazedb.openrpc.json` in the target that uses the plugin, as `openRPCDocumentText`, at build
/// time: the document stays the one definition of the RPC surface and no copy of it is committed.
@main
struct EmbedProtocolDocument: BuildToolPlugin {
    func createBuildCommands(context: PluginContext, target: any Target) async throws -> [Command] {
        let document = context.package.directoryURL.appending(path: "Protocol").appending(path: "blazedb.openrpc.json")
        let output = context.pluginWorkDirectoryURL.appending(path: "OpenRPCDocument.swift")
        return [
            .buildCommand(
                displayName: "Embedding the protocol document in \(target.name)",
                executable: try context.tool(named: "EmbedDocument").url,
                arguments: [document.path(), output.path()],
                inputFiles: [document],
                outputFiles: [output])
        ]
    }
}
