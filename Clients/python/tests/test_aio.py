"""The asyncio client (blazedb.aio): the generated methods as coroutines, concurrent calls, async subscriptions."""
import asyncio
import inspect
import os
import runpy

import pytest

import blazedb
import blazedb.aio
from conftest import ROOT


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_every_method_of_the_blocking_client_is_a_coroutine_here():
    for area in ("doc", "query", "db", "collection", "sync"):
        sync_ns = getattr(blazedb, f"_{area.capitalize()}")
        aio_ns = getattr(blazedb.aio, f"_{area.capitalize()}")
        names = {n for n in vars(sync_ns) if not n.startswith("_")}
        assert names == {n for n in vars(aio_ns) if not n.startswith("_")}
        assert all(inspect.iscoroutinefunction(getattr(aio_ns, n)) for n in names)
    # Results are typed: the method's annotation is its TypedDict.
    assert inspect.signature(blazedb.aio._Doc.get).return_annotation is blazedb.DocGetResult
    assert blazedb.DocHistoryResult.__required_keys__ == {"entries", "cursor", "floor"}
    assert blazedb.QueryUpdateResult.__required_keys__ == {"count"} and blazedb.QueryUpdateResult.__optional_keys__ == {"ids"}


def test_calls_errors_and_concurrent_requests(daemon):
    async def body():
        async with blazedb.aio.Client(daemon.socket) as db:
            await db.doc.insert(db="default", collection="t", doc={"_id": "a", "n": 1})
            got = await db.doc.get(db="default", collection="t", id="a")
            assert got == {"doc": {"_id": "a", "n": 1}}
            # A hundred requests in flight on one connection, answered by id.
            results = await asyncio.gather(*(
                db.doc.put(db="default", collection="t", id=f"p{i}", doc={"i": i}) for i in range(100)))
            assert sorted(r["id"] for r in results) == sorted(f"p{i}" for i in range(100))
            counts = await asyncio.gather(*(db.query.count(db="default", collection="t") for _ in range(20)))
            assert {c["count"] for c in counts} == {101}
            with pytest.raises(blazedb.NotFoundError) as info:
                await db.doc.get(db="default", collection="t", id="missing")
            assert info.value.kind == "document_not_found" and info.value.code == -32010
            with pytest.raises(blazedb.InvalidParamsError):
                await db.call("doc.get", {"db": "default"})
            with pytest.raises(blazedb.MethodNotFoundError):
                await db.call("no.such")
            # Still usable after errors.
            assert (await db.query.count(db="default", collection="t"))["count"] == 101
        with pytest.raises(ConnectionError):
            await db.query.count(db="default", collection="t")
    run(body())


def test_async_subscriptions_deliver_in_order_and_end_with_their_error(daemon):
    async def body():
        async with blazedb.aio.Client(daemon.socket) as db:
            sub = await db.subscribe(db="default", collection="live")
            writes = [db.doc.insert(db="default", collection="live", doc={"_id": f"d{i}"}) for i in range(5)]
            for w in writes:
                await w
            seen = []
            async for event in sub:
                seen.append((event["type"], event["id"]))
                if len(seen) == 5:
                    break
            assert seen == [("insert", f"d{i}") for i in range(5)]
            assert await sub.next_event(timeout=0.2) is None, "nothing more"
            async with await db.subscribe(db="default", collection="live", since=0) as replay:
                first = await replay.next_event(timeout=10)
                assert first is not None and first["id"] == "d0"
            # Dropping the database ends a subscription with its error.
            await db.db.create(db="gone")
            doomed = await db.subscribe(db="gone")
            await db.db.drop(db="gone")
            with pytest.raises(blazedb.NotFoundError) as info:
                async for _ in doomed:
                    pass
            assert info.value.kind == "database_dropped"
            await sub.unsubscribe()
            assert await sub.next_event(timeout=0.1) is None
    run(body())


def test_the_async_example_runs(daemon, capsys):
    module = runpy.run_path(os.path.join(ROOT, "Clients", "python", "examples", "todo_async.py"))
    open_titles, updated, events = run(module["main"](daemon.socket))
    assert open_titles == ["Call Ann", "Write docs"] and updated == 1
    assert events == [("insert", "call"), ("insert", "docs"), ("insert", "milk"), ("leave", "milk")]
    assert "open: Call Ann, Write docs | updated: 1" in capsys.readouterr().out
