"""Subscriptions through the generated Python client: iterators, live queries, resume, final errors."""
import pytest

import blazedb


def test_subscription_iterates_events_while_other_calls_run(daemon):
    with blazedb.Client(daemon.socket) as c, blazedb.Client(daemon.socket) as writer:
        with c.subscribe(db="default", collection="todos", where={"done": False}) as sub:
            assert sub.id.startswith("sub-") and sub.seq == 0
            writer.doc.put(db="default", collection="todos", id="a", doc={"done": False, "title": "milk"})
            # A call on the subscribing client while events wait: the events are kept for the iterator.
            assert c.doc.get(db="default", collection="todos", id="a")["doc"]["title"] == "milk"
            writer.doc.patch(db="default", collection="todos", id="a", set={"done": True})
            writer.doc.put(db="default", collection="todos", id="b", doc={"done": True})
            writer.doc.patch(db="default", collection="todos", id="b", set={"done": False})
            writer.doc.delete(db="default", collection="todos", id="b")
            got = [(e["seq"], e["type"], e["id"]) for e in [next(sub) for _ in range(4)]]
            assert got == [(1, "insert", "a"), (2, "leave", "a"), (4, "enter", "b"), (5, "delete", "b")]
            assert sub.seq == 5
            assert sub.next_event(timeout=0.05) is None
        # Unsubscribed: iteration ends and nothing more is delivered.
        writer.doc.put(db="default", collection="todos", id="c", doc={"done": False})
        assert list(sub) == []


def test_resume_with_since_yields_exactly_the_missed_events(daemon):
    with blazedb.Client(daemon.socket) as writer:
        with blazedb.Client(daemon.socket) as c:
            sub = c.subscribe(db="default", collection="t")
            for i in range(5):
                writer.doc.put(db="default", collection="t", id=f"d{i}", doc={"i": i})
            first = [next(sub) for _ in range(2)]
            resume_at = sub.seq
        for i in range(5, 8):
            writer.doc.put(db="default", collection="t", id=f"d{i}", doc={"i": i})
        with blazedb.Client(daemon.socket) as c:
            sub = c.subscribe(db="default", collection="t", since=resume_at)
            rest = [next(sub) for _ in range(6)]
        assert [e["doc"]["i"] for e in first + rest] == list(range(8))
        assert [e["seq"] for e in first + rest] == list(range(1, 9))


def test_final_error_is_raised_as_a_blaze_error(daemon):
    with blazedb.Client(daemon.socket) as c:
        c.db.create(db="temp")
        sub = c.subscribe(db="temp")
        c.doc.insert(db="temp", collection="x", doc={"_id": "1"})
        c.db.drop(db="temp")
        assert next(sub)["id"] == "1"
        with pytest.raises(blazedb.NotFoundError) as info:
            next(sub)
        assert info.value.kind == "database_dropped"
        assert list(sub) == []
        with pytest.raises(blazedb.InvalidParamsError):
            c.subscribe(db="default", since=-1)
