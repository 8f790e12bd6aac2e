"""The todo list of todo.py with the asyncio client: writes from several tasks at once, a live query read with
`async for`, and typed results (`mypy --strict` checks this file in CI).

Run with blazed running (make run), or pass its socket path as the first argument.
"""
import asyncio
import sys
from typing import List, Optional, Tuple

import blazedb
import blazedb.aio


async def main(socket_path: Optional[str] = None) -> Tuple[List[str], int, List[Tuple[str, str]]]:
    async with blazedb.aio.Client(socket_path) as db:
        try:
            await db.db.drop(db="todo-async")  # start afresh on every run
        except blazedb.NotFoundError:
            pass
        created: blazedb.DbCreateResult = await db.db.create(db="todo-async")
        assert created["db"] == "todo-async"
        async with await db.subscribe(db="todo-async", collection="todos", where={"done": False}) as live:
            # Three inserts in flight on one connection.
            titles = {"milk": "Buy milk", "docs": "Write docs", "call": "Call Ann"}
            await asyncio.gather(*(
                db.doc.insert(db="todo-async", collection="todos", doc={"_id": key, "title": title, "done": False})
                for key, title in titles.items()))
            update = await db.query.update(db="todo-async", collection="todos", where={"_id": "milk"}, set={"done": True})
            page = await db.query.find(db="todo-async", collection="todos", where={"done": False}, sort="title")
            open_titles = [str(doc["title"]) for doc in page["docs"]]
            print("open:", ", ".join(open_titles), "| updated:", update["count"])
            events: List[Tuple[str, str]] = []
            async for event in live:
                events.append((str(event["type"]), str(event["id"])))
                if len(events) == 4:
                    break
            for kind, todo in sorted(events):
                print("live:", kind, todo)
        return open_titles, update["count"], sorted(events)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else None))
