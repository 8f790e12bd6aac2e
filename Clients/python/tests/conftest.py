"""Fixtures: a real blazed on a temporary socket and data directory, stopped and checked after each test."""
import os
import select
import shutil
import signal
import subprocess
import tempfile
import json
import time

import jsonschema
import pytest

import blazedb

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def blazed_path():
    path = os.environ.get("BLAZED") or os.path.join(ROOT, ".build", "debug", "blazed")
    if not os.path.exists(path):
        pytest.fail(f"blazed not found at {path}; run `swift build` first or set BLAZED")
    return path


class Daemon:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="blazepy-")
        self.socket = os.path.join(self.dir, "run", "blazed.sock")
        self.proc = subprocess.Popen(
            [blazed_path(), "--socket", self.socket, "--data-dir", os.path.join(self.dir, "data")],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("BLAZEDB_")},
                 "XDG_CONFIG_HOME": os.path.join(self.dir, "config")})
        self.log = b""
        deadline = time.monotonic() + 60
        while b"Listening" not in self.log:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.proc.poll() is not None:
                self.stop()
                pytest.fail(f"blazed did not start: {self.log.decode(errors='replace')}")
            ready, _, _ = select.select([self.proc.stderr], [], [], remaining)
            if ready:
                self.log += os.read(self.proc.stderr.fileno(), 65536)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                _, rest = self.proc.communicate(timeout=30)
                self.log += rest or b""
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode


@pytest.fixture
def daemon():
    d = Daemon()
    yield d
    code = d.stop()
    assert code == 0, f"blazed exited with {code}"
    errors = [line for line in d.log.decode(errors="replace").splitlines() if "level=error" in line or "level=critical" in line]
    assert not errors, f"blazed logged errors: {errors}"


_DOC = json.load(open(os.path.join(ROOT, "Protocol", "blazedb.openrpc.json"), encoding="utf-8"))
_RESULTS = {m["name"]: dict(m["result"]["schema"], components=_DOC["components"]) for m in _DOC["methods"]}


@pytest.fixture(autouse=True)
def every_result_matches_its_schema(monkeypatch):
    """Checks the result of every call any test makes against its schema in the protocol document."""
    original = blazedb.Client.call

    def checked(self, method, params=None):
        result = original(self, method, params)
        jsonschema.validate(result, _RESULTS[method], cls=jsonschema.Draft7Validator)
        return result

    monkeypatch.setattr(blazedb.Client, "call", checked)
