#!/usr/bin/env bash
# Builds BlazeDB's Debian package with dpkg-deb: deb.sh BIN OUTDIR (BIN as for install.sh). Prints the package's path.
# Its maintainer scripts start and enable nothing: each user enables their own daemon (README, "Install"), and the
# relay runs only once an operator enables it. A package of debug binaries (the tests') is named *-debug.deb and
# needs the Swift toolchain's runtime libraries; `make release` packages release binaries with the Swift runtime
# linked in.
set -euo pipefail
umask 022
bin=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
version=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["info"]["version"])' "$repo/Protocol/blazedb.openrpc.json")
arch=$(dpkg --print-architecture)
suffix=""
compress=(-Zxz)
# The tests' package: made fast, not small.
[ "$(basename "$bin")" = debug ] && suffix="-debug" compress=(-Zgzip -z1)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
chmod 0755 "$stage"
"$here/install.sh" "$bin" "$stage" /usr
# Release binaries without their DWARF (a third of their size), keeping the symbols crash reports name.
[ -z "$suffix" ] && strip --strip-debug "$stage/usr/bin/blazed" "$stage/usr/bin/blazectl" "$stage/usr/bin/blaze-relay"
install -d -m 0755 "$stage/DEBIAN"
cat > "$stage/DEBIAN/control" <<CONTROL
Package: blazedb
Version: $version
Architecture: $arch
Maintainer: BlazeDB developers <blazedb@localhost>
Installed-Size: $(du -sk --exclude=DEBIAN "$stage" | cut -f1)
Depends: libc6, libgcc-s1, libstdc++6, libsqlite3-0
Section: database
Priority: optional
Description: offline-first, end-to-end encrypted, syncing document database
 blazed is a per-user daemon that keeps document databases in SQLite and syncs
 them between a user's devices, end to end encrypted, directly, through a relay
 (blaze-relay, included) or through a shared folder. blazectl controls it.
 Enable it per user with: systemctl --user enable --now blazed.socket
CONTROL
for script in postinst postrm; do
    cat > "$stage/DEBIAN/$script" <<'SCRIPT'
#!/bin/sh
# Makes systemd see the installed or removed units; starts and enables nothing (nor anything for an install into
# another root, DPKG_ROOT, whose systemd is not this one).
set -e
if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
fi
SCRIPT
    chmod 0755 "$stage/DEBIAN/$script"
done
mkdir -p "$out"
deb="$out/blazedb_${version}_${arch}${suffix}.deb"
# File times from the last commit (or now, outside a clone): the same sources give the same package.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH
dpkg-deb --root-owner-group "${compress[@]}" --build "$stage" "$deb" >&2
echo "$deb"
