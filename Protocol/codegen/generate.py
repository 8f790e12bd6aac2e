#!/usr/bin/env python3
"""Generates the BlazeDB clients and the Swift method table from the protocol document.

Input: Protocol/blazedb.openrpc.json (the single definition of the RPC surface), read by blazegen/model.py.
Outputs, one writer each: blazegen/swift.py (Sources/BlazeProtocol/Generated/RPCMethods.swift: RPCMethod and the
typed parameter and result structs the daemon, BlazeClient and blazectl share), blazegen/python.py (Clients/python)
and blazegen/javascript.py (Clients/js). The clients' runtime code is ordinary source beside what is generated
(Clients/python/blazedb/_runtime.py, Clients/js/runtime.js). The daemon embeds the document itself at build time
(Plugins/EmbedProtocolDocument) to serve rpc.discover.

    python3 Protocol/codegen/generate.py          # write the files
    python3 Protocol/codegen/generate.py --check  # exit 1 if any generated file is stale (CI runs this)

Zero dependencies: standard library only.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from blazegen import javascript, model, python, swift  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC_PATH = os.path.join(ROOT, "Protocol", "blazedb.openrpc.json")


def outputs(m):
    files = {}
    for writer in (swift, python, javascript):
        files.update(writer.outputs(m))
    return files


def main():
    check = "--check" in sys.argv[1:]
    stale = []
    for rel, content in outputs(model.load(DOC_PATH)).items():
        full = os.path.join(ROOT, rel)
        current = open(full, encoding="utf-8").read() if os.path.exists(full) else None
        if current == content:
            continue
        if check:
            stale.append(rel)
        else:
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(content)
            print(f"wrote {rel}")
    if stale:
        print("stale generated files (run make generate):\n  " + "\n  ".join(stale), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
