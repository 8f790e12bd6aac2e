// BlazeDB Studio: every read and write is a JSON-RPC call to blazed, carried by the Studio's WebSocket bridge.
'use strict';

const $ = (id) => document.getElementById(id);
// The token from the address's fragment, kept for this tab only (a reload finds it), then taken out of the address
// bar and the history.
const token = new URLSearchParams(location.hash.slice(1)).get('token') || sessionStorage.getItem('blazestudio-token') || '';
sessionStorage.setItem('blazestudio-token', token);
if (location.hash) history.replaceState(null, '', location.pathname);
const state = { db: null, collection: null, doc: null, cursor: null };
// Figures the browser test reads: live events received, rendering batches and the slowest one.
window.studioStats = { liveEvents: 0, batches: 0, maxBatchMs: 0, connected: false, refused: false };

function text(value) { return value === undefined ? '' : JSON.stringify(value); }
function cell(row, content, cls) {
  const td = row.insertCell();
  td.textContent = content;
  if (cls) td.className = cls;
  return td;
}
function button(label, onclick) {
  const b = document.createElement('button');
  b.type = 'button';
  b.textContent = label;
  b.onclick = onclick;
  return b;
}
function showError(id, e) { $(id).textContent = e ? `${e.kind || 'error'}: ${e.message}` : ''; }
function parseJSON(input, fallback) {
  const t = input.trim();
  return t === '' ? fallback : JSON.parse(t);
}

// --- The connection -------------------------------------------------------------------------------------------
class RPC {
  constructor() { this.next = 1; this.pending = new Map(); this.subscriptions = new Map(); }

  open() {
    return new Promise((resolve, reject) => {
      const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
      this.ws = new WebSocket(`${scheme}://${location.host}/ws?token=${encodeURIComponent(token)}`);
      this.ws.onopen = () => resolve();
      this.ws.onerror = () => reject(new Error('the Studio refused the connection'));
      this.ws.onclose = () => {
        window.studioStats.connected = false;
        setStatus('disconnected from the daemon: reload to reconnect', true);
        for (const p of this.pending.values()) p.reject({ kind: 'disconnected', message: 'the connection closed' });
        this.pending.clear();
      };
      this.ws.onmessage = (m) => this.receive(JSON.parse(m.data));
    });
  }

  receive(msg) {
    if (Array.isArray(msg)) return msg.forEach((m) => this.receive(m));
    if (msg.method === 'subscription') {
      const handler = this.subscriptions.get(msg.params.subscription);
      if (handler) handler(msg.params);
      return;
    }
    const p = this.pending.get(msg.id);
    if (!p) return;
    this.pending.delete(msg.id);
    if (msg.error) p.reject({ code: msg.error.code, kind: msg.error.data && msg.error.data.kind, message: msg.error.message });
    else p.resolve(msg.result);
  }

  call(method, params = {}) {
    const id = this.next++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.ws.send(JSON.stringify({ jsonrpc: '2.0', id, method, params }));
    });
  }
}
const rpc = new RPC();

function setStatus(message, bad) {
  $('status').textContent = message;
  $('status').className = bad ? 'bad' : '';
}

// --- Tabs -----------------------------------------------------------------------------------------------------
const loaders = {};
function showTab(name) {
  for (const b of document.querySelectorAll('#tabs button')) b.classList.toggle('active', b.dataset.tab === name);
  for (const s of document.querySelectorAll('.tab')) s.classList.toggle('active', s.id === name);
  if (loaders[name]) loaders[name]().catch((e) => setStatus(`${e.kind || 'error'}: ${e.message}`, true));
}

// --- Data: databases, collections, documents, the editor --------------------------------------------------------
let databasesGeneration = 0;
loaders.data = async function loadDatabases() {
  // Built apart and shown whole, by the latest load only: loads overlap when the tab is clicked during one.
  const generation = ++databasesGeneration;
  const { databases } = await rpc.call('db.list');
  const aside = document.createDocumentFragment();
  // db.list's sizes are a stat of each file; db.info would read every page of a large database.
  for (const { name, sizeBytes } of databases) {
    const h = document.createElement('h3');
    h.textContent = name;
    const meta = document.createElement('div');
    meta.className = 'meta';
    const list = document.createElement('ul');
    aside.append(h, meta, list);
    const { collections } = await rpc.call('collection.list', { db: name });
    const documents = collections.reduce((n, c) => n + c.count, 0);
    meta.textContent = `${documents} documents, ${(sizeBytes / 1024).toFixed(0)} KiB`;
    for (const c of collections) {
      const li = document.createElement('li');
      li.textContent = `${c.name} (${c.count})`;
      li.dataset.db = name;
      li.dataset.collection = c.name;
      if (state.db === name && state.collection === c.name) li.classList.add('selected');
      li.onclick = () => chooseCollection(name, c.name);
      list.append(li);
    }
  }
  if (generation === databasesGeneration) $('databases').replaceChildren(aside);
  if (!state.db && databases.length) state.db = databases[0].name;
};

async function chooseCollection(db, collection) {
  Object.assign(state, { db, collection, cursor: null });
  for (const li of document.querySelectorAll('#databases li')) {
    li.classList.toggle('selected', li.dataset.db === db && li.dataset.collection === collection);
  }
  await find(false);
}

async function find(nextPage) {
  if (!state.collection) return;
  const params = { db: state.db, collection: state.collection, limit: Number($('q-limit').value) || 50 };
  try {
    const where = parseJSON($('q-where').value, null);
    const sort = parseJSON($('q-sort').value, null);
    if (where) params.where = where;
    if (sort) params.sort = sort;
  } catch (e) {
    $('q-summary').textContent = `not JSON: ${e.message}`;
    return;
  }
  const fields = $('q-fields').value.split(',').map((f) => f.trim()).filter((f) => f);
  if (fields.length) params.fields = fields;
  if (nextPage && state.cursor) params.cursor = state.cursor;
  let result;
  try {
    result = await rpc.call('query.find', params);
  } catch (e) {
    $('q-summary').textContent = `${e.kind}: ${e.message}`;
    return;
  }
  state.cursor = result.cursor || null;
  $('q-next').disabled = !state.cursor;
  $('q-summary').textContent = `${state.db} / ${state.collection}: ${result.docs.length} documents${state.cursor ? ', more follow' : ''}`;
  const body = $('docs').tBodies[0];
  body.replaceChildren();
  for (const doc of result.docs) {
    const row = body.insertRow();
    row.dataset.id = doc._id;
    cell(row, doc._id);
    cell(row, text(doc), 'json');
    row.onclick = () => openDocument(doc._id);
  }
}

async function openDocument(id) {
  state.doc = id;
  $('editor').hidden = false;
  $('ed-title').textContent = `${state.collection} / ${id}`;
  showError('p-error', null);
  try {
    const { doc } = await rpc.call('doc.get', { db: state.db, collection: state.collection, id });
    $('ed-doc').textContent = JSON.stringify(doc, null, 2);
  } catch (e) {
    $('ed-doc').textContent = '';
    showError('p-error', e);
  }
}

async function applyPatch(event) {
  event.preventDefault();
  const op = $('p-op').value, path = $('p-path').value.trim();
  const params = { db: state.db, collection: state.collection, id: state.doc };
  try {
    if (op === 'unset') params.unset = [path];
    else {
      const value = JSON.parse($('p-value').value);
      params[op] = { [path]: op === 'add' || op === 'remove' ? (Array.isArray(value) ? value : [value]) : value };
    }
  } catch (e) {
    $('p-error').textContent = `the value is not JSON: ${e.message}`;
    return;
  }
  try {
    await rpc.call('doc.patch', params);
    await openDocument(state.doc);
    await find(false);
  } catch (e) {
    showError('p-error', e);
  }
}

// --- Live: a subscription, rendered in batches once per frame --------------------------------------------------
let live = null;
const liveQueue = [];
function flushLive() {
  const started = performance.now();
  const body = $('live-events').tBodies[0];
  const batch = liveQueue.splice(0, liveQueue.length).slice(-200);
  const fragment = document.createDocumentFragment();
  for (const e of batch.reverse()) {
    const row = document.createElement('tr');
    row.dataset.id = e.id;
    for (const v of [e.seq, e.type, e.collection, e.id]) cell(row, String(v));
    cell(row, text(e.doc), 'json');
    fragment.append(row);
  }
  body.prepend(fragment);
  while (body.rows.length > 200) body.deleteRow(body.rows.length - 1);
  const s = window.studioStats;
  s.batches += 1;
  s.maxBatchMs = Math.max(s.maxBatchMs, performance.now() - started);
  $('live-stats').textContent = `${s.liveEvents} events, ${s.batches} renders, slowest ${s.maxBatchMs.toFixed(1)} ms`;
  live.scheduled = false;
}

async function startLive() {
  if (live || !state.db) return;
  const params = { db: state.db };
  if (state.collection) params.collection = state.collection;
  live = { scheduled: false };
  const { subscription } = await rpc.call('subscribe', params);
  live.id = subscription;
  rpc.subscriptions.set(subscription, (p) => {
    if (p.error) { setStatus(`subscription ended: ${p.error.message}`, true); return; }
    if (!p.events) return;
    window.studioStats.liveEvents += p.events.length;
    liveQueue.push(...p.events);
    if (liveQueue.length > 1000) liveQueue.splice(0, liveQueue.length - 1000);
    if (!live.scheduled) { live.scheduled = true; requestAnimationFrame(flushLive); }
  });
  $('live-start').disabled = true;
  $('live-stop').disabled = false;
  $('live-target').textContent = `watching ${state.db}${state.collection ? ' / ' + state.collection : ''}`;
}

async function stopLive() {
  if (!live) return;
  rpc.subscriptions.delete(live.id);
  await rpc.call('unsubscribe', { subscription: live.id }).catch(() => {});
  live = null;
  $('live-start').disabled = false;
  $('live-stop').disabled = true;
}
loaders.live = async () => {
  $('live-target').textContent = state.db ? `${state.db}${state.collection ? ' / ' + state.collection : ''}` : 'choose a collection in Data';
};

// --- History: a document's changes, its state at each, a diff of two ------------------------------------------
function flatten(value, prefix, out) {
  if (value && typeof value === 'object' && !Array.isArray(value)) {
    for (const [k, v] of Object.entries(value)) flatten(v, prefix ? `${prefix}.${k}` : k, out);
  } else if (prefix) out[prefix] = JSON.stringify(value);
  return out;
}

loaders.history = async () => {
  if (!state.doc) return;
  $('h-target').textContent = `${state.db} / ${state.collection} / ${state.doc}`;
  const { entries } = await rpc.call('doc.history', { db: state.db, collection: state.collection, id: state.doc, limit: 1000 });
  const list = $('h-entries');
  list.replaceChildren();
  for (const e of entries) {
    const li = document.createElement('li');
    const box = document.createElement('input');
    box.type = 'checkbox';
    box.value = e.seq;
    box.onclick = (ev) => { ev.stopPropagation(); $('h-diff').disabled = list.querySelectorAll('input:checked').length !== 2; };
    li.append(box, ` #${e.seq} ${e.type} at ${new Date(e.time).toISOString()} by ${String(e.origin).slice(0, 8)}: ${(e.changed || []).join(', ')}`);
    li.onclick = () => stateAt(e.seq).then((d) => { $('h-state').textContent = JSON.stringify(d, null, 2); });
    list.append(li);
  }
};

async function stateAt(seq) {
  try {
    return (await rpc.call('doc.get', { db: state.db, collection: state.collection, id: state.doc, at: Number(seq) })).doc;
  } catch (e) {
    return e.kind === 'document_not_found' ? null : { error: e.message };
  }
}

async function diffChecked() {
  const seqs = [...$('h-entries').querySelectorAll('input:checked')].map((b) => Number(b.value)).sort((a, b) => a - b);
  const [before, after] = [flatten(await stateAt(seqs[0]), '', {}), flatten(await stateAt(seqs[1]), '', {})];
  const out = $('h-diffout');
  out.replaceChildren();
  for (const path of [...new Set([...Object.keys(before), ...Object.keys(after)])].sort()) {
    if (before[path] === after[path]) continue;
    const line = document.createElement('div');
    if (!(path in before)) { line.className = 'added'; line.textContent = `+ ${path}: ${after[path]}`; }
    else if (!(path in after)) { line.className = 'removed'; line.textContent = `- ${path}: ${before[path]}`; }
    else { line.className = 'changed'; line.textContent = `~ ${path}: ${before[path]} → ${after[path]}`; }
    out.append(line);
  }
  if (!out.childNodes.length) out.textContent = `#${seqs[0]} and #${seqs[1]} hold the same document`;
}

// --- Conflicts: every conflicted field, resolved by picking a value or writing one ------------------------------
loaders.conflicts = async () => {
  if (!state.db) return;
  const { conflicts } = await rpc.call('conflict.list', { db: state.db, limit: 1000 });
  $('c-summary').textContent = `${conflicts.length} conflicted fields in ${state.db}`;
  const body = $('c-list').tBodies[0];
  body.replaceChildren();
  for (const c of conflicts) {
    const row = body.insertRow();
    row.dataset.id = c.id;
    cell(row, `${c.collection} / ${c.id}`);
    cell(row, c.field);
    cell(row, c.winner.unset ? '(unset)' : text(c.winner.value), 'json');
    cell(row, c.losers.map((l) => (l.unset ? '(unset)' : text(l.value))).join('  |  '), 'json');
    const actions = row.insertCell();
    const resolve = (params) => rpc.call('conflict.resolve', { db: state.db, collection: c.collection, id: c.id, field: c.field, ...params })
      .then(() => loaders.conflicts(), (e) => showError('c-error', e));
    actions.append(button('keep winner', () => resolve({})));
    c.losers.forEach((l, i) => { if (!l.unset) actions.append(button(`pick ${i + 1}`, () => resolve({ value: l.value }))); });
    const input = document.createElement('input');
    input.placeholder = 'JSON value';
    actions.append(input, button('write', () => {
      try { resolve({ value: JSON.parse(input.value) }); } catch (e) { $('c-error').textContent = `not JSON: ${e.message}`; }
    }));
  }
};

// --- Sync: members, invites, revocation, peers and the topology -------------------------------------------------
loaders.sync = async () => {
  if (!state.db) return;
  $('s-db').textContent = state.db;
  showError('s-error', null);
  const body = $('s-members').tBodies[0];
  body.replaceChildren();
  try {
    const { members } = await rpc.call('db.members', { db: state.db });
    for (const m of members) {
      const row = body.insertRow();
      row.dataset.device = m.device;
      cell(row, `${m.device.slice(0, 12)}…${m.thisDevice ? ' (this device)' : ''}`);
      cell(row, m.removedAtMs ? `${m.role}, removed` : m.role);
      cell(row, new Date(m.addedAtMs).toISOString());
      const actions = row.insertCell();
      if (!m.thisDevice && !m.removedAtMs) {
        actions.append(button('Revoke', () => rpc.call('db.revoke', { db: state.db, device: m.device })
          .then(() => loaders.sync(), (e) => showError('s-error', e))));
      }
    }
  } catch (e) {
    showError('s-error', e);
  }
  const status = await rpc.call('sync.status', { db: state.db }).catch(() => ({ databases: [] }));
  const db = status.databases[0] || { peers: [], forks: [] };
  const peers = $('s-peers').tBodies[0];
  peers.replaceChildren();
  for (const p of db.peers) {
    const row = peers.insertRow();
    cell(row, p.peer);
    cell(row, p.direction);
    cell(row, p.connected ? 'connected' : 'not connected');
    cell(row, p.protocolVersion ? String(p.protocolVersion) : '');
    cell(row, `${p.sentEntries} / ${p.receivedEntries}`);
    cell(row, `${p.sentBytes} / ${p.receivedBytes}`);
    cell(row, String(p.peerBehind));
    cell(row, String(p.selfBehind));
    cell(row, Object.entries(p.rejected || {}).map(([k, v]) => `${k}: ${v}`).join(', '));
    cell(row, p.lastError || '');
  }
  const notes = [];
  if (db.paused) notes.push('sync of this database is paused');
  if (db.forks && db.forks.length) notes.push(`${db.forks.length} forks detected (a device signed two histories)`);
  for (const w of db.waiting || []) {
    notes.push(`withheld: changes of ${w.origin.slice(0, 12)}… up to ${w.upTo} wait for earlier ones (held ${w.held}) since ${new Date(w.sinceMs).toISOString()}`);
  }
  $('s-forks').textContent = notes.join('; ');
  drawTopology(db.peers);
};

function drawTopology(peers) {
  const svg = $('s-topology');
  const ns = 'http://www.w3.org/2000/svg';
  svg.replaceChildren();
  const node = (x, y, label) => {
    const c = document.createElementNS(ns, 'circle');
    Object.entries({ cx: x, cy: y, r: 18, fill: '#1d2330' }).forEach(([k, v]) => c.setAttribute(k, v));
    const t = document.createElementNS(ns, 'text');
    Object.entries({ x, y: y + 32, 'text-anchor': 'middle', 'font-size': 11 }).forEach(([k, v]) => t.setAttribute(k, v));
    t.textContent = label;
    svg.append(c, t);
  };
  peers.forEach((p, i) => {
    const angle = (2 * Math.PI * i) / Math.max(peers.length, 1) - Math.PI / 2;
    const x = 200 + 120 * Math.cos(angle), y = 140 + 100 * Math.sin(angle);
    const line = document.createElementNS(ns, 'line');
    Object.entries({ x1: 200, y1: 140, x2: x, y2: y, 'stroke-width': 3 }).forEach(([k, v]) => line.setAttribute(k, v));
    line.setAttribute('class', p.connected ? 'up' : 'down');
    svg.append(line);
    node(x, y, `${p.peer.slice(0, 28)} (${p.peerBehind}/${p.selfBehind} behind)`);
  });
  node(200, 140, 'this device');
}

// --- Performance: the daemon's metrics, as rates and quantiles between two reads -------------------------------
let lastMetrics = null;
function parseMetrics(textBody) {
  const series = [];
  for (const line of textBody.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = line.match(/^([a-z_]+)(?:\{(.*)\})? (\S+)$/);
    if (!m) continue;
    const labels = {};
    for (const part of (m[2] || '').matchAll(/([a-z_]+)="((?:[^"\\]|\\.)*)"/g)) labels[part[1]] = part[2];
    series.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return series;
}
function sum(series, name, filter = () => true) {
  return series.filter((s) => s.name === name && filter(s.labels)).reduce((a, s) => a + s.value, 0);
}
function quantile(now, before, method, q) {
  const buckets = now.filter((s) => s.name === 'blazed_request_seconds_bucket' && s.labels.method === method)
    .map((s) => ({ le: Number(s.labels.le), n: s.value - sum(before, s.name, (l) => l.method === method && l.le === s.labels.le) }))
    .sort((a, b) => a.le - b.le);
  const total = buckets.length ? buckets[buckets.length - 1].n : 0;
  const hit = buckets.find((b) => b.n >= q * total);
  return total && hit && Number.isFinite(hit.le) ? (hit.le * 1000).toFixed(2) : '';
}

loaders.performance = async () => {
  const now = parseMetrics((await rpc.call('daemon.metrics')).text);
  const at = performance.now();
  const before = lastMetrics ? lastMetrics.series : [];
  const dt = lastMetrics ? (at - lastMetrics.at) / 1000 : 0;
  lastMetrics = { series: now, at };
  const methods = [...new Set(now.filter((s) => s.name === 'blazed_requests_total').map((s) => s.labels.method))];
  const body = $('m-requests').tBodies[0];
  body.replaceChildren();
  for (const method of methods.sort()) {
    const total = sum(now, 'blazed_requests_total', (l) => l.method === method) - sum(before, 'blazed_requests_total', (l) => l.method === method);
    if (dt > 0 && total <= 0) continue;
    const failed = (l) => l.method === method && l.outcome !== 'ok';
    const errors = sum(now, 'blazed_requests_total', failed) - sum(before, 'blazed_requests_total', failed);
    const row = body.insertRow();
    cell(row, method);
    cell(row, dt > 0 ? (total / dt).toFixed(1) : String(total));
    cell(row, quantile(now, before, method, 0.5));
    cell(row, quantile(now, before, method, 0.99));
    cell(row, String(errors));
  }
  const groups = sum(now, 'blazed_write_group_size_count') - sum(before, 'blazed_write_group_size_count');
  const writes = sum(now, 'blazed_write_group_size_sum') - sum(before, 'blazed_write_group_size_sum');
  const received = sum(now, 'blazed_sync_bytes_received_total') - sum(before, 'blazed_sync_bytes_received_total');
  const sent = sum(now, 'blazed_sync_bytes_sent_total') - sum(before, 'blazed_sync_bytes_sent_total');
  const other = $('m-other').tBodies[0];
  other.replaceChildren();
  for (const [k, v] of [
    ['writes per group commit', groups > 0 ? (writes / groups).toFixed(1) : '–'],
    ['group commits/s', dt > 0 ? (groups / dt).toFixed(1) : String(groups)],
    ['sync received, bytes/s', dt > 0 ? (received / dt).toFixed(0) : String(received)],
    ['sync sent, bytes/s', dt > 0 ? (sent / dt).toFixed(0) : String(sent)],
    ['connections', String(sum(now, 'blazed_connections'))],
    ['subscriptions', String(sum(now, 'blazed_subscriptions'))],
    ['compactions', String(sum(now, 'blazed_compactions_total'))],
  ]) { const row = other.insertRow(); cell(row, k); cell(row, v); }
  $('m-summary').textContent = dt > 0 ? `over the last ${dt.toFixed(1)} s` : 'since the daemon started (rates follow on the next refresh)';
};

// --- Start ----------------------------------------------------------------------------------------------------
async function start() {
  for (const b of document.querySelectorAll('#tabs button')) b.onclick = () => showTab(b.dataset.tab);
  $('query').onsubmit = (e) => { e.preventDefault(); find(false); };
  $('q-next').onclick = () => find(true);
  $('patch').onsubmit = applyPatch;
  $('ed-history').onclick = () => showTab('history');
  $('ed-conflicts').onclick = () => showTab('conflicts');
  $('live-start').onclick = () => startLive().catch((e) => setStatus(e.message, true));
  $('live-stop').onclick = () => stopLive();
  $('h-diff').onclick = () => diffChecked();
  $('c-refresh').onclick = () => loaders.conflicts();
  $('s-invite').onclick = () => rpc.call('db.invite', { db: state.db, role: $('s-role').value })
    .then((r) => { $('s-token').textContent = r.token; }, (e) => showError('s-error', e));
  const check = await fetch(`/check?token=${encodeURIComponent(token)}`, { cache: 'no-store' });
  if (check.status !== 204) {
    window.studioStats.refused = true;
    setStatus('refused: open the address blazectl studio printed (this page has no valid token)', true);
    return;
  }
  await rpc.open();
  window.studioStats.connected = true;
  const info = await rpc.call('daemon.info');
  setStatus(`blazed ${info.version}, ${info.socket}`);
  setInterval(() => { if ($('performance').classList.contains('active')) loaders.performance(); }, 2000);
  setInterval(() => { if ($('sync').classList.contains('active')) loaders.sync(); }, 3000);
  await loaders.data();
}
start().catch((e) => setStatus(`${e.kind || 'error'}: ${e.message}`, true));
