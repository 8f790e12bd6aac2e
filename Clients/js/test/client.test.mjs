// node --test suite for the generated client, against a real blazed (BLAZED or .build/debug/blazed).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { BlazeClient, BlazeError, ErrorCodes, defaultSocketPath } from '../index.js';
import { blobReadStream, uploadBlob } from '../blobs.js';
import { floats, vector } from '../vectors.js';
import crypto from 'node:crypto';
import { Readable } from 'node:stream';
import { checkEveryResult, resultProblems } from '../test-support/schema.mjs';

// Every result any test receives is checked against its schema in the protocol document.
checkEveryResult(BlazeClient);

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
let daemon;
let dir;
let socketPath;
let log = '';

function startDaemon() {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'blazejs-'));
  socketPath = path.join(dir, 'run', 'blazed.sock');
  const binary = process.env.BLAZED ?? path.join(root, '.build', 'debug', 'blazed');
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('BLAZEDB_')));
  env.XDG_CONFIG_HOME = path.join(dir, 'config');
  daemon = spawn(binary, ['--socket', socketPath, '--data-dir', path.join(dir, 'data')], { stdio: ['ignore', 'ignore', 'pipe'], env });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`blazed did not start: ${log}`)), 60_000);
    daemon.stderr.setEncoding('utf8');
    daemon.stderr.on('data', (chunk) => {
      log += chunk;
      if (log.includes('Listening')) { clearTimeout(timer); resolve(); }
    });
    daemon.once('exit', (code) => { clearTimeout(timer); reject(new Error(`blazed exited with ${code}: ${log}`)); });
  });
}

before(startDaemon);
after(async () => {
  const exited = new Promise((resolve) => daemon.once('exit', resolve));
  daemon.kill('SIGTERM');
  const code = await exited;
  fs.rmSync(dir, { recursive: true, force: true });
  assert.equal(code, 0, `blazed exited with ${code}`);
  assert.ok(!/level=(error|critical)/.test(log), `blazed logged errors: ${log}`);
});

test('finds the socket like blazectl does', () => {
  assert.equal(defaultSocketPath({ BLAZEDB_SOCKET: '/x.sock' }), '/x.sock');
  assert.equal(defaultSocketPath({ XDG_RUNTIME_DIR: '/run/user/7' }), '/run/user/7/blazedb/blazed.sock');
  assert.match(defaultSocketPath({}), /^\/tmp\/blazedb-\d+\/blazed\.sock$/);
});

test('CRUD through namespaced methods', async () => {
  const client = await BlazeClient.connect({ socketPath });
  try {
    const { id } = await client.doc.insert({ db: 'default', collection: 'todos', doc: { title: 'Buy milk', prio: 2 } });
    assert.equal(id.length, 36);
    await client.doc.put({ db: 'default', collection: 'todos', id: 't2', doc: { title: 'Write docs', prio: 1 } });
    await client.doc.patch({ db: 'default', collection: 'todos', id: 't2', incr: { views: 2 }, add: { tags: ['b', 'a'] } });
    const { doc } = await client.doc.get({ db: 'default', collection: 'todos', id: 't2' });
    assert.deepEqual(doc, { _id: 't2', title: 'Write docs', prio: 1, views: 2, tags: ['a', 'b'] });
    const many = await client.doc.getMany({ db: 'default', collection: 'todos', ids: [id, 'zz'], fields: ['prio'] });
    assert.deepEqual(many.docs, [{ _id: id, prio: 2 }, null]);
    await client.doc.delete({ db: 'default', collection: 'todos', id: 't2' });
    await assert.rejects(client.doc.get({ db: 'default', collection: 'todos', id: 't2' }), (err) => {
      assert.ok(err instanceof BlazeError);
      assert.equal(err.code, ErrorCodes.NotFound);
      assert.equal(err.kind, 'document_not_found');
      return true;
    });
  } finally {
    client.close();
  }
});

test('queries: filters, sort, paging, count, explain, indexes', async () => {
  const client = await BlazeClient.connect({ socketPath });
  try {
    await client.db.create({ db: 'q' });
    const ops = Array.from({ length: 25 }, (_, i) => ({ op: 'insert', collection: 'n', doc: { _id: `d${String(i).padStart(2, '0')}`, v: i, odd: i % 2 === 1 } }));
    assert.equal((await client.tx.commit({ db: 'q', ops })).results.length, 25);
    await client.index.create({ db: 'q', collection: 'n', fields: ['v'] });
    const seen = [];
    let cursor;
    do {
      const page = await client.query.find({ db: 'q', collection: 'n', where: { odd: true, v: { $gte: 5 } }, sort: '-v', limit: 3, ...(cursor ? { cursor } : {}) });
      seen.push(...page.docs.map((d) => d.v));
      cursor = page.cursor;
    } while (cursor);
    assert.deepEqual(seen, [23, 21, 19, 17, 15, 13, 11, 9, 7, 5]);
    assert.equal((await client.query.count({ db: 'q', collection: 'n', where: { v: { $lt: 10 } } })).count, 10);
    assert.deepEqual((await client.query.explain({ db: 'q', collection: 'n', where: { v: 3 } })).indexes, ['n.v']);
    assert.deepEqual((await client.index.list({ db: 'q' })).indexes, [{ name: 'n.v', collection: 'n', fields: ['v'] }]);
    await assert.rejects(client.query.find({ db: 'q', collection: 'n', where: { v: { $regex: 'x' } } }), { code: ErrorCodes.InvalidParams, kind: 'invalid_filter' });
  } finally {
    client.close();
  }
});

test('concurrent requests on one connection are matched by id', async () => {
  const client = await BlazeClient.connect({ socketPath });
  try {
    const results = await Promise.all(Array.from({ length: 50 }, (_, i) =>
      client.doc.put({ db: 'default', collection: 'c', id: `k${i}`, doc: { i } })));
    assert.deepEqual(results.map((r) => r.id), Array.from({ length: 50 }, (_, i) => `k${i}`));
    const info = await client.db.info({ db: 'default' });
    assert.match(info.stateHash, /^[0-9a-f]{64}$/);
    assert.equal((await client.rpc.discover()).openrpc, '1.2.6');
  } finally {
    client.close();
  }
});

test('a closed connection rejects pending calls', async () => {
  const client = await BlazeClient.connect({ socketPath });
  client.close();
  await assert.rejects(client.daemon.info());
});

test('subscriptions are async iterators; live queries report enter and leave', async () => {
  const client = await BlazeClient.connect({ socketPath });
  const writer = await BlazeClient.connect({ socketPath });
  try {
    await client.db.create({ db: 'subs' });
    const sub = await client.subscribe({ db: 'subs', collection: 'todos', where: { done: false } });
    assert.match(sub.id, /^sub-/);
    assert.equal(sub.seq, 0);
    await writer.doc.put({ db: 'subs', collection: 'todos', id: 'a', doc: { done: false } });
    await writer.doc.patch({ db: 'subs', collection: 'todos', id: 'a', set: { done: true } });
    await writer.tx.commit({ db: 'subs', ops: [
      { op: 'put', collection: 'todos', doc: { _id: 'b', done: false } },
      { op: 'put', collection: 'other', doc: { _id: 'c', done: false } },
    ] });
    await writer.doc.delete({ db: 'subs', collection: 'todos', id: 'b' });
    const got = [];
    for await (const event of sub) {
      got.push(`${event.seq} ${event.type} ${event.id}`);
      if (got.length === 4) break; // break calls return(): unsubscribes
    }
    assert.deepEqual(got, ['1 insert a', '2 leave a', '3 insert b', '4 delete b']);
    assert.equal(sub.seq, 4);
    assert.equal(client.subscriptions.size, 0);
    await assert.rejects(client.unsubscribe({ subscription: sub.id }), { code: ErrorCodes.NotFound, kind: 'subscription_not_found' });

    // Resume from a sequence: exactly the changes after it, then live ones.
    const resumed = await client.subscribe({ db: 'subs', since: 2 });
    const it = resumed[Symbol.asyncIterator]();
    const replay = [];
    for (let i = 0; i < 3; i++) replay.push((await it.next()).value);
    assert.deepEqual(replay.map((e) => `${e.seq} ${e.type} ${e.collection}/${e.id}`), ['3 insert todos/b', '3 insert other/c', '4 delete todos/b']);
    const live = it.next();
    await writer.doc.insert({ db: 'subs', collection: 'todos', doc: { _id: 'z' } });
    assert.deepEqual((await live).value.doc, { _id: 'z' });

    // The database goes away: the iteration rejects with the final error.
    const ended = assert.rejects(it.next(), (err) => err instanceof BlazeError && err.kind === 'database_dropped');
    await writer.db.drop({ db: 'subs' });
    await ended;
    assert.deepEqual(await it.next(), { value: undefined, done: true });
    await assert.rejects(client.subscribe({ db: 'subs' }), { code: ErrorCodes.NotFound, kind: 'database_not_found' });
  } finally {
    client.close();
    writer.close();
  }
});

test('the todo example runs', async () => {
  const { main } = await import('../examples/todo.mjs');
  const { open, done, events } = await main(socketPath);
  assert.deepEqual(open.map((t) => t._id), ['docs']);
  assert.equal(done, 1);
  assert.deepEqual(events, ['insert milk', 'insert docs', 'leave milk']);
  assert.deepEqual((await main(socketPath)).events, events);
});

test('a result that breaks its schema is reported', () => {
  assert.deepEqual(resultProblems('db.list', { databases: [{ name: 'a', sizeBytes: 4096 }] }), []);
  assert.ok(resultProblems('db.list', { databases: [{ name: 'a' }] }).some((p) => p.includes('missing sizeBytes')));
  assert.ok(resultProblems('db.list', {}).some((p) => p.includes('missing databases')));
  assert.ok(resultProblems('db.list', { databases: [1] }).length > 0);
  assert.ok(resultProblems('db.list', { databases: [], extra: true }).some((p) => p.includes('unexpected member')));
});

test('nested patches, bulk writes, aggregation, history and collection drop', async () => {
  const client = await BlazeClient.connect({ socketPath });
  try {
    const base = { db: 'default', collection: 'jsapi' };
    await client.tx.commit({ db: 'default', ops: [1, 2, 3].map((n) => ({ op: 'insert', collection: 'jsapi', doc: { _id: `k${n}`, n, g: n % 2 } })) });
    await client.doc.patch({ ...base, id: 'k1', set: { 'address.city': 'Oslo' }, incr: { 'stats.views': 2 } });
    assert.deepEqual((await client.doc.get({ ...base, id: 'k1' })).doc, { _id: 'k1', n: 1, g: 1, address: { city: 'Oslo' }, stats: { views: 2 } });
    assert.deepEqual(await client.query.update({ ...base, where: { g: 1 }, set: { odd: true }, returnIds: true }), { count: 2, ids: ['k1', 'k3'] });
    const agg = await client.query.aggregate({ ...base, group: ['g'], aggregates: { n: { $count: {} }, sum: { $sum: 'n' } } });
    assert.deepEqual(agg, { groups: [{ key: { g: 0 }, values: { n: 1, sum: 2 } }, { key: { g: 1 }, values: { n: 2, sum: 4 } }], truncated: false });
    const history = await client.doc.history({ ...base, id: 'k1' });
    assert.deepEqual(history.entries.map((e) => e.type), ['insert', 'update', 'update']);
    const first = await client.doc.get({ ...base, id: 'k1', at: history.entries[0].seq });
    assert.deepEqual(first.doc, { _id: 'k1', n: 1, g: 1 });
    assert.deepEqual(await client.query.delete({ ...base, where: { n: 2 } }), { count: 1 });
    assert.deepEqual(await client.collection.drop(base), { collection: 'jsapi', deleted: 2, indexes: 0, changes: 1 });
    assert.deepEqual((await client.query.find({ ...base })).docs, []);
    await assert.rejects(client.doc.patch({ ...base, id: 'k1', set: { 'a..b': 1 } }), (e) => e instanceof BlazeError);
    await assert.rejects(client.query.aggregate({ ...base, aggregates: { x: { $median: 'n' } } }), (e) => e.kind === 'invalid_aggregate');
  } finally {
    client.close();
  }
});

test('blobs: put from a path, upload a stream, read back as a stream', async () => {
  const client = await BlazeClient.connect({ socketPath });
  try {
    const content = crypto.randomBytes(2_500_000);
    const file = path.join(dir, 'song.ogg');
    fs.writeFileSync(file, content);
    const put = await client.blob.put({ db: 'default', path: file, type: 'audio/ogg' });
    assert.equal(put.blob.size, content.length);
    assert.deepEqual(put.ref, { $blob: put.blob });
    const sent = await uploadBlob(client, { db: 'default', type: 'audio/ogg', piece: 700_000 }, Readable.from([content.subarray(0, 5), content.subarray(5)]));
    assert.equal(sent.blob.id, put.blob.id);
    assert.equal(sent.storedBytes, 0);
    const parts = [];
    for await (const part of blobReadStream(client, { db: 'default', blob: put.blob.id, piece: 1_000_000 })) parts.push(part);
    assert.ok(Buffer.concat(parts).equals(content));
    const tail = [];
    for await (const part of blobReadStream(client, { db: 'default', blob: put.blob.id, start: content.length - 3 })) tail.push(part);
    assert.ok(Buffer.concat(tail).equals(content.subarray(content.length - 3)));
    await assert.rejects(client.blob.stat({ db: 'default', blob: 'ab'.repeat(32) }), (err) => err.kind === 'blob_not_found');
    assert.throws(() => blobReadStream(client, { db: 'default', blob: put.blob.id, piece: 0 }), RangeError);
    // A source that fails aborts its upload: five in a row fit in the four uploads a connection may hold.
    async function* broken() {
      yield Buffer.alloc(1000);
      throw new Error('the source went away');
    }
    for (let i = 0; i < 5; i++) {
      await assert.rejects(uploadBlob(client, { db: 'default', piece: 100 }, broken()), /the source went away/);
    }
    const opened = await Promise.all([0, 1, 2, 3].map(() => client.blob.upload({ db: 'default' })));
    assert.equal(new Set(opened.map((o) => o.upload)).size, 4);
  } finally {
    client.close();
  }
});

test('vectors: Float32Arrays and arrays in, floats back, nearest documents', async () => {
  const client = await BlazeClient.connect({ socketPath });
  try {
    const base = { db: 'default', collection: 'jsvec' };
    const info = await client.index.create({ ...base, fields: ['v'], vector: { dimensions: 4, metric: 'l2' } });
    assert.deepEqual(info.vector, { dimensions: 4, metric: 'l2' });
    const rows = { a: [1, 0, 0, 0], b: [0, 1, 0, 0], c: [0.5, 0.5, 0, 0], d: [0, 0, 1, 0.25] };
    for (const [id, v] of Object.entries(rows)) {
      await client.doc.put({ ...base, id, doc: { v: id === 'a' ? vector(Float32Array.from(v)) : vector(v) } });
    }
    assert.deepEqual(Array.from(floats((await client.doc.get({ ...base, id: 'd' })).doc.v)), rows.d);
    assert.deepEqual((await client.doc.get({ ...base, id: 'd', vectors: 'array' })).doc.v, { $vector: rows.d });
    // The query as a Float32Array (sent as base64) and as an array of numbers: the same answer.
    for (const q of [Float32Array.from([0.9, 0.2, 0, 0]), [0.9, 0.2, 0, 0]]) {
      const near = await client.query.nearest({ ...base, field: 'v', vector: q, k: 2 });
      assert.deepEqual(near.results.map((r) => r.doc._id), ['a', 'c']);
      assert.equal(near.index, 'jsvec.v');
    }
    await assert.rejects(client.query.nearest({ ...base, field: 'v', vector: [1, 2], k: 1 }), (e) => e.kind === 'invalid_vector');
  } finally {
    client.close();
  }
});
