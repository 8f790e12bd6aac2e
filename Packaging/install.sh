#!/usr/bin/env bash
# Installs BlazeDB (README, "Install"): install.sh BIN DESTDIR PREFIX, where BIN holds the built blazed, blazectl and
# blaze-relay (and .build/debug the argument parser's generate-manual). Puts under DESTDIR/PREFIX: the binaries, the
# systemd user units (blazed.socket, blazed.service) and the relay's system unit with ExecStart in PREFIX/bin, shell
# completions of blazectl, man pages generated from the argument parsers, the README and the changelog.
set -euo pipefail
umask 022
bin=$1
root=$2$3
prefix=$3
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
manual=$repo/.build/debug/generate-manual
zsh_dir=share/zsh/site-functions
# Debian's zsh reads vendor completions from here, not from /usr/share/zsh/site-functions.
[ "$prefix" = /usr ] && zsh_dir=share/zsh/vendor-completions

install -d "$root/bin" "$root/lib/systemd/user" "$root/lib/systemd/system" "$root/share/man/man1" \
    "$root/share/bash-completion/completions" "$root/$zsh_dir" "$root/share/fish/vendor_completions.d" \
    "$root/share/doc/blazedb"
for p in blazed blazectl blaze-relay; do
    install -m 0755 "$bin/$p" "$root/bin/$p"
done
sed "s|/usr/local/bin/|$prefix/bin/|g" "$here/systemd/blazed.service" > "$root/lib/systemd/user/blazed.service"
install -m 0644 "$here/systemd/blazed.socket" "$root/lib/systemd/user/blazed.socket"
sed -e "s|/usr/local/bin/|$prefix/bin/|g" -e "s|(copy to /etc/systemd/system/, then|(installed; to run it:|" \
    "$here/systemd/blaze-relay.service" > "$root/lib/systemd/system/blaze-relay.service"
chmod 0644 "$root/lib/systemd/user/blazed.service" "$root/lib/systemd/system/blaze-relay.service"

"$bin/blazectl" --generate-completion-script bash > "$root/share/bash-completion/completions/blazectl"
"$bin/blazectl" --generate-completion-script zsh > "$root/$zsh_dir/_blazectl"
"$bin/blazectl" --generate-completion-script fish > "$root/share/fish/vendor_completions.d/blazectl.fish"

pages=$(mktemp -d)
trap 'rm -rf "$pages"' EXIT
for p in blazed blazectl blaze-relay; do
    "$manual" "$bin/$p" --output-directory "$pages"
done
for page in "$pages"/*.1; do
    gzip -9n < "$page" > "$root/share/man/man1/$(basename "$page").gz"
done
chmod 0644 "$root"/share/man/man1/*.gz "$root"/share/bash-completion/completions/blazectl "$root/$zsh_dir/_blazectl" \
    "$root/share/fish/vendor_completions.d/blazectl.fish"

install -m 0644 "$repo/README.md" "$root/share/doc/blazedb/README.md"
gzip -9n < "$here/CHANGELOG.md" > "$root/share/doc/blazedb/changelog.gz"
chmod 0644 "$root/share/doc/blazedb/changelog.gz"
