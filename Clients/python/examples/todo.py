"""A tiny todo list on BlazeDB: add, complete, list by priority, and follow the open items live.

Run with blazed running (make run), or pass its socket path as the first argument.
"""
import itertools
import sys
from typing import Any, Dict, List, Optional, Tuple

import blazedb


def main(socket_path: Optional[str] = None) -> Tuple[List[Dict[str, Any]], int, List[Tuple[str, str]]]:
    with blazedb.Client(socket_path) as db:
        try:
            db.db.drop(db="todo-example")  # start afresh on every run
        except blazedb.NotFoundError:
            pass
        db.db.create(db="todo-example")
        # A live query: reports todos entering and leaving "open" from now on.
        with db.subscribe(db="todo-example", collection="todos", where={"done": False}) as live:
            db.tx.commit(db="todo-example", ops=[
                {"op": "put", "collection": "todos", "doc": {"_id": "milk", "title": "Buy milk", "prio": 2, "done": False}},
                {"op": "put", "collection": "todos", "doc": {"_id": "docs", "title": "Write docs", "prio": 1, "done": False}},
            ])
            db.doc.patch(db="todo-example", collection="todos", id="milk", set={"done": True}, add={"tags": ["errand"]})
            open_items = db.query.find(db="todo-example", collection="todos", where={"done": False}, sort="-prio")["docs"]
            print("open:", ", ".join(t["title"] for t in open_items))
            done = db.query.count(db="todo-example", collection="todos", where={"done": True})["count"]
            print("done:", done)
            events = [(e["type"], e["id"]) for e in itertools.islice(live, 3)]
            for kind, todo in events:
                print("live:", kind, todo)
        return open_items, done, events


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
