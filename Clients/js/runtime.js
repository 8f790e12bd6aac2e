// The hand-written part of the BlazeDB Node.js client: the connection, errors and subscriptions. The methods
// (`client.doc.insert(...)`) are generated into index.js from Protocol/blazedb.openrpc.json.
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { jsonReplacer } from './vectors.js';

/** An error response from blazed: `code` (JSON-RPC), `kind` (stable data.kind), `data`. */
export class BlazeError extends Error {
  constructor(message, code, kind, data) {
    super(`${message} [${code} ${kind}]`);
    this.name = 'BlazeError';
    this.code = code;
    this.kind = kind;
    this.data = data ?? {};
  }
}

function errorFrom(error) {
  const data = error.data ?? {};
  return new BlazeError(error.message, error.code, data.kind, data);
}

/** $BLAZEDB_SOCKET, else $XDG_RUNTIME_DIR/blazedb/blazed.sock, else /tmp/blazedb-$UID/blazed.sock. */
export function defaultSocketPath(env = process.env) {
  if (env.BLAZEDB_SOCKET) return env.BLAZEDB_SOCKET;
  if (env.XDG_RUNTIME_DIR) return path.join(env.XDG_RUNTIME_DIR, 'blazedb', 'blazed.sock');
  return `/tmp/blazedb-${os.userInfo().uid}/blazed.sock`;
}

/** A connection to blazed; requests may be issued concurrently and are matched by id. */
export class Connection {
  /** Connects to the daemon (options.socketPath, else the default path). */
  static connect(options = {}) {
    const socketPath = options.socketPath ?? defaultSocketPath();
    return new Promise((resolve, reject) => {
      const socket = net.createConnection({ path: socketPath });
      socket.once('connect', () => { socket.off('error', reject); resolve(new this(socket)); });
      socket.once('error', reject);
    });
  }

  constructor(socket) {
    this.socket = socket;
    this.nextId = 1;
    this.pending = new Map();
    this.buffer = '';
    this.subscriptions = new Map();
    socket.setEncoding('utf8');
    socket.on('data', (chunk) => this.#receive(chunk));
    socket.on('close', () => this.#failAll(new Error('blazed closed the connection')));
    socket.on('error', (err) => this.#failAll(err));
  }

  /** Calls any method by name; rejects with BlazeError on an error response. */
  call(method, params = {}) {
    return this._request(method, params, (result) => result);
  }

  /** Sends a request; `transform` runs on the result as soon as its line is read, before any later line. */
  _request(method, params, transform) {
    const id = this.nextId++;
    const line = JSON.stringify({ jsonrpc: '2.0', id, method, params }, jsonReplacer) + '\n';
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve: (result) => resolve(transform(result)), reject });
      this.socket.write(line, (err) => { if (err) { this.pending.delete(id); reject(err); } });
    });
  }

  /** Closes the connection. */
  close() {
    this.socket.end();
  }

  #receive(chunk) {
    this.buffer += chunk;
    let newline;
    while ((newline = this.buffer.indexOf('\n')) >= 0) {
      const line = this.buffer.slice(0, newline);
      this.buffer = this.buffer.slice(newline + 1);
      if (!line.trim()) continue;
      const message = JSON.parse(line);
      if (message.id === undefined) {
        if (message.method === 'subscription') this.subscriptions.get(message.params?.subscription)?._deliver(message.params);
        continue;
      }
      const waiter = this.pending.get(message.id);
      if (!waiter) continue;
      this.pending.delete(message.id);
      if (message.error) {
        waiter.reject(errorFrom(message.error));
      } else {
        waiter.resolve(message.result);
      }
    }
  }

  #failAll(err) {
    for (const { reject } of this.pending.values()) reject(err);
    this.pending.clear();
    for (const sub of [...this.subscriptions.values()]) sub._deliver({ error: { code: null, message: err.message, data: { kind: 'connection_closed' } } });
  }
}

/**
 * A live subscription: an async iterator of events ({seq, collection, id, type, doc, origin}; with blobs: true
 * also blob fetch progress, {blob, state, size, chunks, heldChunks, heldBytes}). Iteration ends
 * after close(); the subscription's final error (subscriber_too_slow, database_dropped...) rejects the
 * iteration with a BlazeError once the events before it are consumed.
 */
export class Subscription {
  constructor(client, result) {
    this.client = client;
    this.id = result.subscription;
    this.seq = result.seq;
    this.events = [];
    this.waiters = [];
    this.error = null;
    this.ended = false;
    client.subscriptions.set(this.id, this);
  }

  /** Ends the subscription (unsubscribe); events already received stay readable. */
  async close() {
    if (this.ended) return;
    this.#end();
    await this.client.call('unsubscribe', { subscription: this.id });
  }

  /** The next event: a Promise of {value, done}. */
  next() {
    if (this.events.length > 0) {
      const value = this.events.shift();
      if (value.seq !== undefined) this.seq = value.seq;
      return Promise.resolve({ value, done: false });
    }
    if (this.error) { const error = this.error; this.error = null; return Promise.reject(error); }
    if (this.ended) return Promise.resolve({ value: undefined, done: true });
    return new Promise((resolve, reject) => this.waiters.push({ resolve, reject }));
  }

  /** Called when a for-await loop exits early: ends the subscription. */
  async return() {
    await this.close();
    return { value: undefined, done: true };
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  #end() {
    this.ended = true;
    this.client.subscriptions.delete(this.id);
    for (const w of this.waiters.splice(0)) w.resolve({ value: undefined, done: true });
  }

  _deliver(params) {
    if (params.error) {
      const error = errorFrom(params.error);
      this.ended = true;
      this.client.subscriptions.delete(this.id);
      const waiters = this.waiters.splice(0);
      if (waiters.length > 0) { for (const w of waiters) w.reject(error); } else { this.error = error; }
      return;
    }
    for (const event of [...(params.events ?? []), ...(params.blobs ?? [])]) {
      const waiter = this.waiters.shift();
      if (waiter) {
        if (event.seq !== undefined) this.seq = event.seq;
        waiter.resolve({ value: event, done: false });
      } else {
        this.events.push(event);
      }
    }
  }
}
