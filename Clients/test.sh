#!/usr/bin/env bash
# Client checks, run by `make test`: generated files up to date, Python contract tests, Node tests and examples.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 Protocol/codegen/generate.py --check

venv=.build/clients-venv
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check pytest jsonschema openrpc==11.1.1 mypy numpy
# Installs the client exactly as a user would.
"$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps ./Clients/python

export BLAZED="$PWD/.build/debug/blazed"
# The client and its examples are fully typed (py.typed): mypy --strict must find nothing.
(cd Clients/python && "../../$venv/bin/python" -m mypy --strict --no-incremental blazedb examples)
(cd Clients/python && "../../$venv/bin/python" -m pytest -q tests)
(cd Clients/js && node --test test/)
