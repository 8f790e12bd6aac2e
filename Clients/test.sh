#!/usr/bin/env bash
# Client checks, run by `make test`: generated files up to date, Python contract tests, Node tests and examples.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 Protocol/codegen/generate.py --check

venv=.build/clients-venv
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check pytest jsonschema openrpc==11.1.1 mypy numpy build prometheus-client
# The wheel and the sdist a release ships (python -m build); the tests use the client installed from the wheel.
dist=.build/clients-dist
rm -rf "$dist"
"$venv/bin/python" -m build --outdir "$dist" Clients/python > "$dist.log" 2>&1 || { cat "$dist.log"; exit 1; }
version=$(python3 -c 'import json; print(json.load(open("Protocol/blazedb.openrpc.json"))["info"]["version"])')
"$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps "$dist/blazedb-$version-py3-none-any.whl"
# The sdist installs in a fresh venv too, typed, with the version the protocol document gives.
fresh=.build/clients-sdist-venv
rm -rf "$fresh"
python3 -m venv "$fresh"
"$fresh/bin/pip" install -q --disable-pip-version-check "$dist/blazedb-$version.tar.gz"
"$fresh/bin/python" -c "
import importlib.resources, blazedb, blazedb.aio, blazedb.vectors, blazedb.blobs
assert blazedb.__version__ == '$version', blazedb.__version__
assert importlib.resources.files('blazedb').joinpath('py.typed').is_file()
print('sdist and wheel of blazedb', blazedb.__version__, 'install')"

export BLAZED="$PWD/.build/debug/blazed"
# The client and its examples are fully typed (py.typed): mypy --strict must find nothing.
(cd Clients/python && "../../$venv/bin/python" -m mypy --strict --no-incremental blazedb examples)
(cd Clients/python && "../../$venv/bin/python" -m pytest -q tests)
(cd Clients/js && node --test test/)
# The Node package as `npm pack` makes it, installed by unpacking into node_modules as npm does: its entry points load.
jsdir=.build/clients-js-install
rm -rf "$jsdir"
mkdir -p "$jsdir/node_modules/blazedb"
tgz=$(Packaging/npm-pack.sh "$jsdir")
tar -xzf "$tgz" -C "$jsdir/node_modules/blazedb" --strip-components=1
(cd "$jsdir" && node --input-type=module -e "
import { BlazeClient } from 'blazedb';
import { vector } from 'blazedb/vectors';
import * as blobs from 'blazedb/blobs';
import { readFileSync } from 'node:fs';
const pkg = JSON.parse(readFileSync('node_modules/blazedb/package.json', 'utf8'));
if (typeof BlazeClient !== 'function' || typeof vector !== 'function' || Object.keys(blobs).length === 0) throw new Error('exports missing');
if (pkg.version !== '$version') throw new Error('version ' + pkg.version);
console.log('npm package blazedb', pkg.version, 'installs');
")
