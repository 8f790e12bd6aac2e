"""The examples run as documented."""
import os
import runpy

from conftest import ROOT


def test_todo_example_runs(daemon, capsys):
    module = runpy.run_path(os.path.join(ROOT, "Clients", "python", "examples", "todo.py"))
    open_items, done, events = module["main"](daemon.socket)
    assert [t["_id"] for t in open_items] == ["docs"] and done == 1
    assert events == [("insert", "milk"), ("insert", "docs"), ("leave", "milk")]
    out = capsys.readouterr().out
    assert "open: Write docs" in out and "live: leave milk" in out
    # A second run starts afresh and sees the same.
    assert module["main"](daemon.socket)[2] == events
