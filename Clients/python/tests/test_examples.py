"""The examples run as documented."""
import os
import runpy
import zlib

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


def word_hash_embedder(texts):
    """64 dimensions, one signed count per word hashed into them: texts sharing words point the same way."""
    out = []
    for text in texts:
        v = [0.0] * 64
        for word in text.lower().split():
            h = zlib.crc32(word.encode())
            v[h % 64] += 1.0 if h & 0x100 else -1.0
        out.append(v)
    return out


def test_semantic_search_example_syncs_and_answers_on_the_second_daemon(capsys):
    # The example starts its own two daemons (A listens for sync on loopback), syncs, and checks every answer of B
    # against brute force itself; here with word-hash vectors instead of the model (`make example-embeddings`).
    module = runpy.run_path(os.path.join(ROOT, "Clients", "python", "examples", "semantic_search.py"))
    answers = module["main"](word_hash_embedder, k=4, queries=["pizza on a paper plate", "kittens asleep"])
    assert answers["pizza on a paper plate"][0][0] == "a slice of pepperoni pizza on a paper plate"
    assert answers["kittens asleep"][0][0] == "two kittens asleep on a woollen blanket"
    for hits in answers.values():
        assert len(hits) == 4 and [d for _, d in hits] == sorted(d for _, d in hits)
    assert "on B, nearest to 'kittens asleep':" in capsys.readouterr().out
