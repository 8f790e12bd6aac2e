// A tiny todo list on BlazeDB: add, complete, list by priority, and follow the open items live.
// Run with blazed running (make run), or pass its socket path as the first argument.
import { BlazeClient, BlazeError, ErrorCodes } from '../index.js';

export async function main(socketPath) {
  const db = await BlazeClient.connect(socketPath ? { socketPath } : {});
  try {
    try {
      await db.db.drop({ db: 'todo-example' }); // start afresh on every run
    } catch (err) {
      if (!(err instanceof BlazeError && err.code === ErrorCodes.NotFound)) throw err;
    }
    await db.db.create({ db: 'todo-example' });
    // A live query: reports todos entering and leaving "open" from now on.
    const live = await db.subscribe({ db: 'todo-example', collection: 'todos', where: { done: false } });
    await db.tx.commit({ db: 'todo-example', ops: [
      { op: 'put', collection: 'todos', doc: { _id: 'milk', title: 'Buy milk', prio: 2, done: false } },
      { op: 'put', collection: 'todos', doc: { _id: 'docs', title: 'Write docs', prio: 1, done: false } },
    ] });
    await db.doc.patch({ db: 'todo-example', collection: 'todos', id: 'milk', set: { done: true }, add: { tags: ['errand'] } });
    const open = (await db.query.find({ db: 'todo-example', collection: 'todos', where: { done: false }, sort: '-prio' })).docs;
    console.log('open:', open.map((t) => t.title).join(', '));
    const { count: done } = await db.query.count({ db: 'todo-example', collection: 'todos', where: { done: true } });
    console.log('done:', done);
    const events = [];
    for await (const event of live) {
      events.push(`${event.type} ${event.id}`);
      console.log('live:', event.type, event.id);
      if (events.length === 3) break; // leaving the loop unsubscribes
    }
    return { open, done, events };
  } finally {
    db.close();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  await main(process.argv[2]);
}
