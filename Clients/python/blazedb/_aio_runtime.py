"""The hand-written part of the asyncio client: the connection and subscriptions (the methods are generated into
aio.py from Protocol/blazedb.openrpc.json).

One reader task per connection reads every line blazed sends: a response completes the request with its id (so
requests may be in flight together), a `subscription` notification goes to its subscription's queue.
"""

import asyncio
import itertools
import json
from typing import Any, Dict, List, Optional, Set, Union

from ._runtime import BlazeError, default_socket_path, error_from_response
from .vectors import json_default

# Responses can be large (a page of documents): a line may be up to this many bytes.
_MAX_LINE = 1 << 30


class _End:
    """Marks the end of a subscription's queue (with its final error, if any)."""

    def __init__(self, error: Optional[BaseException]):
        self.error = error


class AsyncSubscription:
    """A live subscription: `async for event in sub` yields events (dicts with seq, collection, id, type, doc,
    origin; with blobs=True also blob fetch progress: dicts with blob, state, size, chunks, heldChunks, heldBytes);
    `await sub.next_event(timeout)` returns None when none comes in time. The subscription's final error
    (subscriber_too_slow, database_dropped...) is raised as a BlazeError once the events before it are consumed."""

    def __init__(self, client: "AsyncConnection", result: Dict[str, Any]):
        self.id: str = result["subscription"]
        self.seq: int = result["seq"]
        self._client = client
        self._queue: "asyncio.Queue[Union[Dict[str, Any], _End]]" = asyncio.Queue()
        self._ended = False
        client._register(self)

    def __aiter__(self) -> "AsyncSubscription":
        return self

    async def __anext__(self) -> Dict[str, Any]:
        event = await self.next_event(timeout=None)
        if event is None:
            raise StopAsyncIteration
        return event

    async def next_event(self, timeout: Optional[float] = None) -> Optional[Dict[str, Any]]:
        """The next event, waiting up to timeout seconds (None: until one comes); None on timeout or once ended."""
        if self._ended and self._queue.empty():
            return None
        try:
            item = await asyncio.wait_for(self._queue.get(), timeout)
        except asyncio.TimeoutError:
            return None
        if isinstance(item, _End):
            self._ended = True
            if item.error is not None:
                raise item.error
            return None
        self.seq = item["seq"]
        return item

    async def unsubscribe(self) -> None:
        """Ends the subscription; events already received stay readable."""
        if self._ended:
            return
        self._ended = True
        self._client._forget(self.id)
        await self._client.call("unsubscribe", {"subscription": self.id})

    async def __aenter__(self) -> "AsyncSubscription":
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.unsubscribe()
        except (OSError, BlazeError):
            pass  # the connection or the subscription is already gone

    def _deliver(self, params: Dict[str, Any]) -> None:
        if "error" in params:
            self._queue.put_nowait(_End(error_from_response(params["error"])))
            self._client._forget(self.id)
        else:
            for event in params.get("events", []) + params.get("blobs", []):
                self._queue.put_nowait(event)

    def _close(self, error: Optional[BaseException]) -> None:
        self._queue.put_nowait(_End(error))


class AsyncConnection:
    """A connection to blazed for asyncio: `await connect()` (or `async with`), then `await call(...)`."""

    def __init__(self, socket_path: Optional[str] = None, timeout: Optional[float] = 30.0):
        self.socket_path = socket_path or default_socket_path()
        self.timeout = timeout
        self._reader: Optional[asyncio.StreamReader] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._task: Optional["asyncio.Task[None]"] = None
        self._ids = itertools.count(1)
        self._pending: Dict[int, "asyncio.Future[Any]"] = {}
        self._subscriptions: Dict[str, AsyncSubscription] = {}
        # Notifications that arrived before their subscribe call returned (the reader runs ahead of the caller).
        self._early: Dict[str, List[Dict[str, Any]]] = {}
        self._forgotten: Set[str] = set()
        self._closed: Optional[BaseException] = None

    async def connect(self) -> None:
        """Opens the connection and starts reading from it."""
        self._reader, self._writer = await asyncio.open_unix_connection(self.socket_path, limit=_MAX_LINE)
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    async def __aenter__(self) -> "AsyncConnection":
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the connection; calls still waiting fail with ConnectionError."""
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._shutdown(ConnectionError("the connection is closed"))

    async def call(self, method: str, params: Optional[Dict[str, Any]] = None) -> Any:
        """Calls any method by name; raises a BlazeError subclass on an error response."""
        if self._writer is None:
            raise ConnectionError("not connected: use 'async with' or await connect() first")
        if self._closed is not None:
            raise ConnectionError(str(self._closed))
        request_id = next(self._ids)
        future: "asyncio.Future[Any]" = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        request = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {}}
        line = json.dumps(request, allow_nan=False, ensure_ascii=False, separators=(",", ":"), default=json_default) + "\n"
        try:
            self._writer.write(line.encode("utf-8"))
            await self._writer.drain()
            return await asyncio.wait_for(future, self.timeout)
        finally:
            self._pending.pop(request_id, None)

    def _register(self, sub: AsyncSubscription) -> None:
        self._subscriptions[sub.id] = sub
        for params in self._early.pop(sub.id, []):
            sub._deliver(params)

    def _forget(self, sub_id: str) -> None:
        self._subscriptions.pop(sub_id, None)
        self._forgotten.add(sub_id)

    async def _read_loop(self) -> None:
        assert self._reader is not None
        error: BaseException = ConnectionError("blazed closed the connection")
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                self._route(json.loads(line.decode("utf-8")))
        except asyncio.CancelledError:
            error = ConnectionError("the connection is closed")
            raise
        except (OSError, ValueError) as e:
            error = ConnectionError(f"the connection failed: {e}")
        finally:
            self._shutdown(error)

    def _route(self, message: Dict[str, Any]) -> None:
        if "id" in message:
            future = self._pending.get(message["id"])
            if future is None or future.done():
                return
            if "error" in message:
                future.set_exception(error_from_response(message["error"]))
            else:
                future.set_result(message.get("result"))
            return
        params = message.get("params") or {}
        if message.get("method") != "subscription":
            return
        sub_id = params.get("subscription")
        if not isinstance(sub_id, str):
            return
        sub = self._subscriptions.get(sub_id)
        if sub is not None:
            sub._deliver(params)
        elif sub_id not in self._forgotten:
            self._early.setdefault(sub_id, []).append(params)

    def _shutdown(self, error: BaseException) -> None:
        if self._closed is not None:
            return
        self._closed = error
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        for sub in list(self._subscriptions.values()):
            sub._close(error)
        self._subscriptions.clear()
