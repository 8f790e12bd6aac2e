import BlazeCrypto
import BlazeDaemon
import BlazeProtocol
import Foundation
import Testing

/// The Debian package `make test` builds from the tests' binaries (Packaging/deb.sh), named by `BLAZE_DEB`.
let testPackage = ProcessInfo.processInfo.environment["BLAZE_DEB"].flatMap { $0.isEmpty ? nil : $0 }

/// What `blazed --version` and the others print, from the build's own constants.
@Suite struct VersionTests {
    @Test func everyBinaryNamesItsVersionProtocolsAndFormats() throws {
        let (low, high) = (Handshake.protocols.lowerBound, Handshake.protocols.upperBound)
        #expect(try run(buildDirectory + "/blazed", ["--version"]).out == "blazed \(blazedVersionText)\n")
        #expect(blazedVersionText.hasPrefix("\(blazeVersion) (sync protocol \(low)–\(high), database format "))
        #expect(try run(buildDirectory + "/blazectl", ["--version"]).out == "blazectl \(blazeVersion)\n")
        #expect(try run(buildDirectory + "/blaze-relay", ["--version"]).out.hasPrefix("blaze-relay \(blazeVersion) (sync protocol \(low)–\(high), relay format "))
        // The one source: the protocol document's info.version (the generator writes it everywhere; CI checks).
        let d = try DaemonProcess()
        defer { d.stop() }
        #expect(try d.connect().call("daemon.info")["version"]?.stringValue == blazeVersion)
        #expect(try d.connect().call("rpc.discover")["info"]?["version"]?.stringValue == blazeVersion)
    }
}

/// The package installs what the README says where a Debian system looks for it, and the installed binaries run the
/// README's tour. Installed with `dpkg -i` into a scratch root (its own package database there) and removed again:
/// this CI machine has no user manager, so enabling the user unit is checked only as far as `systemd-analyze verify`
/// goes.
@Suite(.serialized, .enabled(if: testPackage != nil, "BLAZE_DEB is not set: `make test` builds the package"))
struct PackageInstallTests {
    let deb = testPackage ?? ""

    func field(_ name: String) throws -> String {
        try run("/usr/bin/dpkg-deb", ["--field", deb, name]).out.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    @Test func thePackageInstallsTheBinariesUnitsCompletionsAndManPagesAndRunsTheTour() throws {
        #expect(try field("Package") == "blazedb")
        #expect(try field("Version") == blazeVersion)
        #expect(try field("Depends").contains("libsqlite3-0"))
        // dpkg itself installs it into the scratch root, with a package database of its own there, running the
        // maintainer scripts (outside a chroot: they only ask systemd to reload, when it runs). The libraries it
        // depends on are the machine's, which that empty database does not list.
        let root = TempDir()
        let admin = root.path + "/var/lib/dpkg"
        for d in ["info", "updates"] { try FileManager.default.createDirectory(atPath: admin + "/" + d, withIntermediateDirectories: true) }
        #expect(FileManager.default.createFile(atPath: admin + "/status", contents: Data()))
        let dpkg = ["--force-not-root", "--force-script-chrootless", "--root=\(root.path)", "--admindir=\(admin)"]
        let x = try run("/usr/bin/dpkg", dpkg + ["--force-depends", "-i", deb])
        #expect(x.status == 0 && x.out.contains("Setting up blazedb (\(blazeVersion))"), "\(x.out)\(x.err)")
        #expect(try run("/usr/bin/dpkg", dpkg + ["-s", "blazedb"]).out.contains("Status: install ok installed"))
        let files = [
            "usr/bin/blazed", "usr/bin/blazectl", "usr/bin/blaze-relay", "usr/lib/systemd/user/blazed.service",
            "usr/lib/systemd/user/blazed.socket", "usr/lib/systemd/system/blaze-relay.service",
            "usr/share/bash-completion/completions/blazectl", "usr/share/zsh/vendor-completions/_blazectl",
            "usr/share/fish/vendor_completions.d/blazectl.fish", "usr/share/man/man1/blazed.1.gz",
            "usr/share/man/man1/blazectl.1.gz", "usr/share/man/man1/blaze-relay.1.gz", "usr/share/doc/blazedb/README.md",
            "usr/share/doc/blazedb/changelog.gz",
        ]
        for f in files { #expect(FileManager.default.fileExists(atPath: root.path + "/" + f), "\(f) not installed") }
        let bin = root.path + "/usr/bin"
        #expect(try run(bin + "/blazed", ["--version"]).out == "blazed \(blazedVersionText)\n")
        #expect(try run(bin + "/blaze-relay", ["--version"]).out.hasPrefix("blaze-relay \(blazeVersion) "))
        // The units start the installed binaries, and the user units verify.
        let units = root.path + "/usr/lib/systemd"
        let service = try String(contentsOfFile: units + "/user/blazed.service", encoding: .utf8)
        #expect(service.contains("\nExecStart=/usr/bin/blazed\n"))
        #expect(try String(contentsOfFile: units + "/system/blaze-relay.service", encoding: .utf8).contains("\nExecStart=/usr/bin/blaze-relay serve "))
        if FileManager.default.isExecutableFile(atPath: "/usr/bin/systemd-analyze") {
            // ExecStart must exist for verify: the installed path, pointed at the scratch root's copy.
            let check = TempDir()
            try service.replacingOccurrences(of: "ExecStart=/usr/bin/blazed", with: "ExecStart=\(bin)/blazed")
                .write(toFile: check.path + "/blazed.service", atomically: true, encoding: .utf8)
            try FileManager.default.copyItem(atPath: units + "/user/blazed.socket", toPath: check.path + "/blazed.socket")
            var env = ProcessInfo.processInfo.environment
            env["XDG_RUNTIME_DIR"] = check.path
            let verify = try run(
                "/usr/bin/systemd-analyze", ["verify", "--user", check.path + "/blazed.socket", check.path + "/blazed.service"],
                environment: env)
            #expect(verify.status == 0 && verify.err.isEmpty, "systemd-analyze verify: \(verify.err)")
        }
        // Man pages: gzipped mdoc with the commands' own options; completions name the subcommands.
        let page = try run("/bin/sh", ["-c", "gzip -dc \(root.path)/usr/share/man/man1/blazectl.1.gz"]).out
        #expect(page.contains(".Dt BLAZECTL 1") && page.contains(".Nm blazectl"), "\(page.prefix(200))")
        #expect(page.contains("nearest") && page.contains("relay-capability"))
        let bash = try String(contentsOfFile: root.path + "/usr/share/bash-completion/completions/blazectl", encoding: .utf8)
        #expect(bash.contains("blazectl") && bash.contains("nearest"))
        // The installed daemon and blazectl run the README's tour.
        let daemon = try DaemonProcess(executable: bin + "/blazed")
        try ReadmeTour.runTour(blazectl: bin + "/blazectl", daemon: daemon)
        // Removing it removes every file it installed.
        let removed = try run("/usr/bin/dpkg", dpkg + ["-r", "blazedb"])
        #expect(removed.status == 0, "\(removed.err)")
        for f in files { #expect(!FileManager.default.fileExists(atPath: root.path + "/" + f), "\(f) left after removal") }
    }
}
