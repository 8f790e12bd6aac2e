#!/usr/bin/env bash
# Packs the Node client as `npm pack` would (no registry or npm needed): npm-pack.sh OUTDIR writes
# OUTDIR/blazedb-VERSION.tgz, a gzipped tar of the files package.json's "files" names plus package.json, under
# `package/`, and prints its path. `npm install ./blazedb-VERSION.tgz` installs it.
set -euo pipefail
out=$1
js=$(cd "$(dirname "$0")/../Clients/js" && pwd)
read -r version files < <(python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
print(p["version"], " ".join(["package.json"] + p["files"]))' "$js/package.json")
mkdir -p "$out"
tgz="$(cd "$out" && pwd)/blazedb-$version.tgz"
# Owner, group, modes and times fixed: the same sources give the same tarball.
# shellcheck disable=SC2086
(cd "$js" && set -f && tar --create --gzip --file "$tgz" --transform 's,^,package/,' \
    --owner=0 --group=0 --numeric-owner --mtime='2000-01-01 00:00:00Z' --mode='go-w,a+rX' $files)
echo "$tgz"
