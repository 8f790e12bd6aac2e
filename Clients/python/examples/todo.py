"""A tiny todo list on BlazeDB: add, complete, list by priority.

Run with blazed running (make run), or point BLAZEDB_SOCKET at its socket.
"""
import sys

import blazedb


def main(socket_path=None):
    with blazedb.Client(socket_path) as db:
        try:
            db.db.create(db="todo-example")
        except blazedb.ConflictError:
            pass  # already there from an earlier run
        db.tx.commit(db="todo-example", ops=[
            {"op": "put", "collection": "todos", "doc": {"_id": "milk", "title": "Buy milk", "prio": 2, "done": False}},
            {"op": "put", "collection": "todos", "doc": {"_id": "docs", "title": "Write docs", "prio": 1, "done": False}},
        ])
        db.doc.patch(db="todo-example", collection="todos", id="milk", set={"done": True}, add={"tags": ["errand"]})
        open_items = db.query.find(db="todo-example", collection="todos", where={"done": False}, sort="-prio")["docs"]
        print("open:", ", ".join(t["title"] for t in open_items))
        done = db.query.count(db="todo-example", collection="todos", where={"done": True})["count"]
        print("done:", done)
        return open_items, done


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
