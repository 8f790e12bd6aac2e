"""The hand-written part of the BlazeDB Python client: the connection, errors and subscriptions.

The methods (`client.doc.insert(...)`) and the error classes are generated into `__init__.py` from
Protocol/blazedb.openrpc.json; this module holds what does not depend on the protocol document.
"""

import collections
import itertools
import json
import os
import socket
from typing import Any, Deque, Dict, Mapping, Optional, cast

from .vectors import json_default

MISSING: Any = object()
"""Default of optional parameters: the parameter is left out of the request (None would send null)."""


class BlazeError(Exception):
    """An error response from blazed: `code` (JSON-RPC), `kind` (stable data.kind), `data`."""

    code: Optional[int] = None

    def __init__(
        self, message: str, code: Optional[int] = None, kind: Optional[str] = None, data: Optional[Dict[str, Any]] = None
    ):
        super().__init__(f"{message} [{code} {kind}]")
        self.message = message
        self.code = code if code is not None else type(self).code
        self.kind = kind
        self.data = data or {}


def error_from_response(error: Dict[str, Any]) -> BlazeError:
    """The BlazeError subclass declared for the response's code (BlazeError itself for unknown codes)."""
    data = error.get("data") or {}
    code = error.get("code")
    cls = next((c for c in BlazeError.__subclasses__() if c.code == code), BlazeError)
    return cls(error.get("message", ""), code, data.get("kind"), data)


def default_socket_path(env: Optional[Mapping[str, str]] = None) -> str:
    """$BLAZEDB_SOCKET, else $XDG_RUNTIME_DIR/blazedb/blazed.sock, else /tmp/blazedb-$UID/blazed.sock."""
    env = os.environ if env is None else env
    if env.get("BLAZEDB_SOCKET"):
        return env["BLAZEDB_SOCKET"]
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "blazedb", "blazed.sock")
    return f"/tmp/blazedb-{os.getuid()}/blazed.sock"


class Subscription:
    """A live subscription: an iterator of events (dicts with seq, collection, id, type, doc, origin; with
    blobs=True also blob fetch progress: dicts with blob, state, size, chunks, heldChunks, heldBytes).

    Iteration waits for the next event; next_event(timeout) returns None when none comes in time. The
    subscription's final error (subscriber_too_slow, database_dropped...) is raised as a BlazeError once the
    events before it are consumed. Other calls may be made on the same client meanwhile.
    """

    def __init__(self, client: "Connection", result: Dict[str, Any]):
        self.id: str = result["subscription"]
        self.seq: int = result["seq"]
        self._client = client
        self._events: Deque[Dict[str, Any]] = collections.deque()
        self._error: Optional[BlazeError] = None
        self._ended = False
        client._subscriptions[self.id] = self

    def __iter__(self) -> "Subscription":
        return self

    def __next__(self) -> Dict[str, Any]:
        event = self.next_event(timeout=None)
        if event is None:
            raise StopIteration
        return event

    def next_event(self, timeout: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """The next event, waiting up to timeout seconds (None: until one comes); None on timeout or once ended."""
        while not self._events:
            if self._error is not None:
                error, self._error = self._error, None
                self._ended = True
                raise error
            if self._ended or not self._client._pump(timeout):
                return None
        event = self._events.popleft()
        self.seq = event["seq"]
        return event

    def unsubscribe(self) -> None:
        """Ends the subscription; events already received stay readable."""
        if self._ended:
            return
        self._ended = True
        self._client._subscriptions.pop(self.id, None)
        self._client.call("unsubscribe", {"subscription": self.id})

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.unsubscribe()
        except (OSError, BlazeError):
            pass  # the connection or the subscription is already gone

    def _deliver(self, params: Dict[str, Any]) -> None:
        if "error" in params:
            self._error = error_from_response(params["error"])
            self._client._subscriptions.pop(self.id, None)
        else:
            self._events.extend(params.get("events", []) + params.get("blobs", []))


class Connection:
    """A connection to blazed speaking line-delimited JSON-RPC; one request at a time per connection."""

    def __init__(self, socket_path: Optional[str] = None, timeout: Optional[float] = 30.0):
        self.socket_path = socket_path or default_socket_path()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._sock.connect(self.socket_path)
        self._buffer = b""
        self._ids = itertools.count(1)
        self._subscriptions: Dict[str, Subscription] = {}

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection."""
        self._sock.close()

    def call(self, method: str, params: Optional[Dict[str, Any]] = None) -> Any:
        """Calls any method by name; raises a BlazeError subclass on an error response."""
        request_id = next(self._ids)
        request = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}
        line = json.dumps(request, allow_nan=False, ensure_ascii=False, separators=(",", ":"), default=json_default) + "\n"
        self._sock.sendall(line.encode("utf-8"))
        while True:
            message = self._read_message()
            if "id" not in message:
                self._route(message)
                continue
            if message.get("id") != request_id:
                continue
            if "error" in message:
                raise error_from_response(message["error"])
            return message["result"]

    def _route(self, message: Dict[str, Any]) -> None:
        params = message.get("params") or {}
        if message.get("method") == "subscription":
            sub_id = params.get("subscription")
            sub = self._subscriptions.get(sub_id) if isinstance(sub_id, str) else None
            if sub is not None:
                sub._deliver(params)

    def _pump(self, timeout: Optional[float]) -> bool:
        """Reads and routes one message; False if none arrived within timeout."""
        previous = self._sock.gettimeout()
        self._sock.settimeout(timeout)
        try:
            message = self._read_message()
        except socket.timeout:
            return False
        finally:
            self._sock.settimeout(previous)
        if "id" not in message:
            self._route(message)
        return True

    def _read_message(self) -> Dict[str, Any]:
        while b"\n" not in self._buffer:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("blazed closed the connection")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return cast(Dict[str, Any], json.loads(line.decode("utf-8")))
