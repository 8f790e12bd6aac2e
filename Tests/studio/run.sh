#!/usr/bin/env bash
# The Studio browser test (Tests/studio/test_studio.py), run by `make test`: Debian's chromium and chromium-driver
# (`.ci/run` installs them) driven by selenium from PyPI, in a venv of its own, against this build's blazed and
# blazectl. Screenshots land in .build/studio-screenshots.
set -euo pipefail
cd "$(dirname "$0")/../.."

for tool in chromium chromedriver; do
    command -v "$tool" >/dev/null || { echo "Tests/studio: $tool is missing (apt-get install chromium chromium-driver)" >&2; exit 1; }
done
venv=.build/studio-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check pytest selenium
rm -rf .build/studio-screenshots
PYTHONPATH="$PWD/Clients/python" "$venv/bin/python" -m pytest -q -s Tests/studio "$@"
