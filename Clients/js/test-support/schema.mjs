// Checks RPC results against the result schemas of Protocol/blazedb.openrpc.json (the JSON Schema keywords the
// document uses; any other keyword is reported, so the document cannot outgrow this checker silently).
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const doc = JSON.parse(fs.readFileSync(path.join(root, 'Protocol', 'blazedb.openrpc.json'), 'utf8'));
const components = doc.components.schemas;
const results = Object.fromEntries(doc.methods.map((m) => [m.name, m.result.schema]));
const known = new Set(['type', '$ref', 'properties', 'required', 'additionalProperties', 'items', 'minItems', 'maxItems',
  'minimum', 'minLength', 'pattern', 'const', 'enum', 'oneOf', 'description', 'title', 'examples']);

function typeOf(value) {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'array';
  if (typeof value === 'number') return Number.isInteger(value) ? 'integer' : 'number';
  return typeof value;
}

function matchesType(value, type) {
  const t = typeOf(value);
  return t === type || (type === 'number' && t === 'integer');
}

function check(value, schema, where, out) {
  for (const key of Object.keys(schema)) if (!known.has(key)) out.push(`${where}: schema keyword ${key} is not checked`);
  if (schema.$ref) {
    const target = components[schema.$ref.split('/').pop()];
    if (!target) { out.push(`${where}: unknown $ref ${schema.$ref}`); return; }
    check(value, target, where, out);
  }
  if (schema.type !== undefined) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!types.some((t) => matchesType(value, t))) { out.push(`${where}: ${JSON.stringify(value)} is not ${types.join('|')}`); return; }
  }
  if ('const' in schema && JSON.stringify(schema.const) !== JSON.stringify(value)) out.push(`${where}: not ${JSON.stringify(schema.const)}`);
  if (schema.enum && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(value))) out.push(`${where}: not in enum`);
  if (schema.oneOf) {
    const matching = schema.oneOf.filter((option) => { const sub = []; check(value, option, where, sub); return sub.length === 0; });
    if (matching.length !== 1) out.push(`${where}: matches ${matching.length} of oneOf's ${schema.oneOf.length} schemas`);
  }
  const t = typeOf(value);
  if (t === 'object') {
    for (const name of schema.required ?? []) if (!(name in value)) out.push(`${where}: missing ${name}`);
    for (const [name, member] of Object.entries(value)) {
      if (schema.properties?.[name]) check(member, schema.properties[name], `${where}.${name}`, out);
      else if (schema.additionalProperties === false) out.push(`${where}: unexpected member ${name}`);
      else if (typeof schema.additionalProperties === 'object') check(member, schema.additionalProperties, `${where}.${name}`, out);
    }
  } else if (t === 'array') {
    if (schema.items) value.forEach((x, i) => check(x, schema.items, `${where}[${i}]`, out));
    if (schema.minItems !== undefined && value.length < schema.minItems) out.push(`${where}: fewer than ${schema.minItems} items`);
    if (schema.maxItems !== undefined && value.length > schema.maxItems) out.push(`${where}: more than ${schema.maxItems} items`);
  } else if (t === 'string') {
    if (schema.minLength !== undefined && [...value].length < schema.minLength) out.push(`${where}: shorter than ${schema.minLength}`);
    if (schema.pattern && !new RegExp(schema.pattern, 'u').test(value)) out.push(`${where}: does not match ${schema.pattern}`);
  } else if (t === 'integer' || t === 'number') {
    if (schema.minimum !== undefined && value < schema.minimum) out.push(`${where}: below ${schema.minimum}`);
  }
}

/** Why `result` does not match `method`'s result schema; empty when it does. */
export function resultProblems(method, result) {
  if (!results[method]) return [`${method} is not in the protocol document`];
  const out = [];
  check(result, results[method], 'result', out);
  return out;
}

/** Makes every `call` of `Client` (and so every namespaced method) throw when its result breaks its schema. */
export function checkEveryResult(Client) {
  const original = Client.prototype.call;
  Client.prototype.call = async function (method, params) {
    const result = await original.call(this, method, params);
    const problems = resultProblems(method, result);
    if (problems.length) throw new Error(`${method} result does not match its schema: ${problems.slice(0, 3).join('; ')}`);
    return result;
  };
}
