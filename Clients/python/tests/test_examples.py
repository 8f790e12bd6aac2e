"""The examples run as documented."""
import os
import runpy

from conftest import ROOT


def test_todo_example_runs(daemon, capsys):
    module = runpy.run_path(os.path.join(ROOT, "Clients", "python", "examples", "todo.py"))
    open_items, done = module["main"](daemon.socket)
    assert [t["_id"] for t in open_items] == ["docs"] and done == 1
    assert "open: Write docs" in capsys.readouterr().out
